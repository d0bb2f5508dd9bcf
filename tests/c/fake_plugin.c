/*
 * A deliberately small plugin against include/polychip.h, compiled by the
 * integration tests in several variants (one -D flag each) to check how the
 * host treats plugins that break the ABI's rules. The default variant is a
 * working plugin with one host-memory device and only the `fill` operator.
 *
 *   FAKE_MAJOR2            exports polychip_plugin_init_v2 instead of _v1
 *   FAKE_TABLE_MAJOR2      exports _v1 but its table says ABI major 2
 *   FAKE_NO_ENTRY          exports no entry symbol at all
 *   FAKE_SMALL_TABLE       its table's struct_size covers only the versions
 *   FAKE_NULL_MEM_ALLOC    its table lacks the required mem_alloc
 *   FAKE_NEEDS_HOST_1_7    refuses hosts older than ABI 1.7
 *   FAKE_ALLOC_ALIASES     mem_alloc returns the same memory every time
 *   FAKE_INIT_FAILS_WITH_ESCAPES  its entry fails with a message holding
 *                          terminal escapes and a right-to-left override
 *   FAKE_FOREIGN_ERROR     device_count returns an error the host never made
 *   FAKE_NEWER_MINOR       claims ABI 1.9 with a larger (appended) table
 *   FAKE_MINOR_1_1         claims ABI 1.1 with the newer op table, a 1.2 slot set
 *   FAKE_MINOR_1_2         claims ABI 1.2 with the newer op table, 1.3 slots set
 *   FAKE_MINOR_1_3         claims ABI 1.3 with the newer op table, 1.4 slots set
 *   FAKE_HUGE_COUNT        device_count reports 2^32 - 1 devices
 *   FAKE_VENDOR_COLON      its vendor name holds a ':' (device ids are vendor:N)
 *   FAKE_CONTROL_NAME      its device name holds terminal escape sequences
 *                          and a right-to-left override
 *   FAKE_ABSURD_PROPS      its device reports peaks and bandwidths that are
 *                          NaN, infinite, negative or 1e300
 *   FAKE_FILL_LONG_ERROR   fill logs, and fails with, a 4 MiB message that
 *                          starts with terminal escapes and a control
 *                          character
 *   FAKE_FAST_MATH_CTOR    a constructor turns on FTZ and DAZ when the library
 *                          is loaded (what -ffast-math did with older GCC)
 *   FAKE_FILL_ROUNDS_UP    fill leaves the rounding mode upward (ABI rule 12)
 *   FAKE_CTOR_PROCESS_STATE  a constructor changes the working directory,
 *                          installs a SIGINT handler and sets an environment
 *                          variable (ABI rule 13)
 *   FAKE_FILL_BLOCKS_SIGNALS  fill blocks SIGUSR1 on the calling thread and
 *                          pins it to one CPU (ABI rule 13)
 */
#if defined(FAKE_CTOR_PROCESS_STATE) || defined(FAKE_FILL_BLOCKS_SIGNALS)
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#endif
#include <stdlib.h>
#include <string.h>
#ifdef FAKE_ABSURD_PROPS
#include <math.h>
#endif

#include "polychip.h"

#ifdef FAKE_FILL_ROUNDS_UP
#include <fenv.h>
#endif

#if defined(FAKE_FAST_MATH_CTOR) && defined(__x86_64__)
#include <xmmintrin.h>
/* crtfastmath.o's constructor: flush-to-zero and denormals-are-zero on. */
__attribute__((constructor)) static void fast_math(void) {
    _mm_setcsr(_mm_getcsr() | 0x8040);
}
#endif

#ifdef FAKE_CTOR_PROCESS_STATE
static void on_sigint(int signal) { (void)signal; }
/* A runtime's constructor that makes itself at home in the process. */
__attribute__((constructor)) static void take_over(void) {
    if (chdir("/") != 0) abort();
    signal(SIGINT, on_sigint);
    setenv("FAKE_PLUGIN_WAS_HERE", "1", 1);
}
#endif

static const PolychipHostApi *g_host;

static PolychipError *fail(PolychipErrorCode code, const char *message) {
    return g_host->error_new(g_host->context, code, message, strlen(message));
}

static PolychipError *device_count(uint32_t *out_count) {
#ifdef FAKE_FOREIGN_ERROR
    static int not_an_error;
    (void)out_count;
    return (PolychipError *)&not_an_error;
#else
    if (!out_count) return fail(POLYCHIP_ERROR_INVALID_ARGUMENT, "fake: out_count is NULL");
#ifdef FAKE_HUGE_COUNT
    *out_count = 0xFFFFFFFFu;
#else
    *out_count = 1;
#endif
    return NULL;
#endif
}

static PolychipError *device_props(uint32_t device, PolychipDeviceProps *out) {
    PolychipDeviceProps props;
    size_t n;
    if (device != 0 || !out) return fail(POLYCHIP_ERROR_INVALID_ARGUMENT, "fake: bad device_props call");
    memset(&props, 0, sizeof props);
#ifdef FAKE_CONTROL_NAME
    strcpy(props.name, "Fake\x1b[2J\nF0\xe2\x80\xae");
#else
    strcpy(props.name, "Fake F0");
#endif
    props.memory_bytes = 1u << 20;
    props.memory_flags = POLYCHIP_MEMORY_HOST_VISIBLE;
#ifdef FAKE_ABSURD_PROPS
    props.peak_flops_f32 = 1e300;
    props.peak_flops_bf16 = NAN;
    props.peak_flops_f16 = -5e12;
    props.memory_bandwidth = INFINITY;
    props.link_bandwidth = -1.0;
#endif
    n = out->struct_size < sizeof props ? out->struct_size : sizeof props;
    props.struct_size = n;
    memcpy(out, &props, n);
    return NULL;
}

#ifdef FAKE_ALLOC_ALIASES
static char g_arena[1u << 20];
#endif

static PolychipError *mem_alloc(uint32_t device, uint64_t bytes, void **out_ptr) {
    void *p;
    (void)device;
    if (bytes > (1u << 20)) return fail(POLYCHIP_ERROR_OUT_OF_MEMORY, "fake: more than 1 MiB requested");
#ifdef FAKE_ALLOC_ALIASES
    *out_ptr = bytes ? g_arena + 64 : NULL;
    return NULL;
#endif
    p = bytes ? calloc(1, (size_t)bytes) : NULL;
    if (bytes && !p) return fail(POLYCHIP_ERROR_OUT_OF_MEMORY, "fake: calloc failed");
    *out_ptr = p;
    return NULL;
}

static PolychipError *mem_free(uint32_t device, void *ptr) {
    (void)device;
#ifdef FAKE_ALLOC_ALIASES
    if ((char *)ptr >= g_arena && (char *)ptr < g_arena + sizeof g_arena) return NULL;
#endif
    free(ptr);
    return NULL;
}

static PolychipError *stream_create(uint32_t device, PolychipStream **out) {
    (void)device;
    *out = (PolychipStream *)malloc(1);
    return NULL;
}
static PolychipError *stream_destroy(PolychipStream *s) { free(s); return NULL; }
static PolychipError *stream_synchronize(PolychipStream *s) { (void)s; return NULL; }
static PolychipError *event_create(uint32_t device, PolychipEvent **out) {
    (void)device;
    *out = (PolychipEvent *)malloc(1);
    return NULL;
}
static PolychipError *event_destroy(PolychipEvent *e) { free(e); return NULL; }
static PolychipError *event_record(PolychipEvent *e, PolychipStream *s) { (void)e; (void)s; return NULL; }
static PolychipError *stream_wait_event(PolychipStream *s, PolychipEvent *e) { (void)e; (void)s; return NULL; }
static PolychipError *event_synchronize(PolychipEvent *e) { (void)e; return NULL; }

static PolychipError *memcpy_any(uint32_t device, PolychipStream *s, void *dst, const void *src, uint64_t bytes) {
    (void)device;
    (void)s;
    memcpy(dst, src, (size_t)bytes);
    return NULL;
}

/* fill for compact f32 tensors only. */
static PolychipError *fill(uint32_t device, PolychipStream *s, const PolychipFillArgs *args) {
    const PolychipTensor *t;
    int64_t n = 1;
    int32_t i;
    float *p;
    (void)device;
    (void)s;
    if (!args || args->struct_size < sizeof *args) return fail(POLYCHIP_ERROR_INVALID_ARGUMENT, "fake: fill args");
    t = &args->out;
#ifdef FAKE_FILL_LONG_ERROR
    {
        static const char head[] = "fake: \x1b[31mfill failed\x1b[0m \x01";
        size_t len = (size_t)4 << 20;
        char *message = malloc(len);
        PolychipError *e;
        if (!message) return fail(POLYCHIP_ERROR_OUT_OF_MEMORY, "fake: malloc failed");
        memset(message, 'x', len);
        memcpy(message, head, sizeof head - 1);
        g_host->log(g_host->context, POLYCHIP_LOG_WARN, message, len);
        e = g_host->error_new(g_host->context, POLYCHIP_ERROR_INTERNAL, message, len);
        free(message);
        return e;
    }
#endif
    if (t->dtype.code != POLYCHIP_DTYPE_CODE_FLOAT || t->dtype.bits != 32)
        return fail(POLYCHIP_ERROR_UNIMPLEMENTED, "fake: fill supports f32 only");
    for (i = t->ndim - 1; i >= 0; i--) {
        if (t->strides && t->shape[i] != 1 && t->strides[i] != n)
            return fail(POLYCHIP_ERROR_UNIMPLEMENTED, "fake: fill supports compact tensors only");
        n *= t->shape[i];
    }
    p = (float *)((char *)t->data + t->byte_offset);
    for (i = 0; i < n; i++) p[i] = (float)args->value;
#ifdef FAKE_FILL_ROUNDS_UP
    fesetround(FE_UPWARD);
#endif
#ifdef FAKE_FILL_BLOCKS_SIGNALS
    {
        /* A critical section whose signal mask is never put back, and an
         * OpenMP-style binding of the calling thread to the first CPU it
         * may run on. */
        sigset_t block;
        cpu_set_t cpus, one;
        int c;
        sigemptyset(&block);
        sigaddset(&block, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &block, NULL);
        if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
            for (c = 0; c < CPU_SETSIZE; c++) {
                if (CPU_ISSET(c, &cpus)) {
                    CPU_ZERO(&one);
                    CPU_SET(c, &one);
                    sched_setaffinity(0, sizeof one, &one);
                    break;
                }
            }
        }
    }
#endif
    return NULL;
}

#if defined(FAKE_MINOR_1_1) || defined(FAKE_MINOR_1_2) || defined(FAKE_MINOR_1_3)
/* What a slot a later minor added holds in this older plugin's table: the
 * host must treat the slot as absent and never call it. */
static PolychipError *never_called(uint32_t device, PolychipStream *stream,
                                   const PolychipUnaryArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
#endif
#ifdef FAKE_MINOR_1_2
static PolychipError *never_selects(uint32_t device, PolychipStream *stream,
                                    const PolychipSelectArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
static PolychipError *never_adds(uint32_t device, PolychipStream *stream,
                                 const PolychipBinaryArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
static PolychipError *never_compares(uint32_t device, PolychipStream *stream,
                                     const PolychipCompareArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
#endif
#ifdef FAKE_MINOR_1_3
static PolychipError *never_gathers(uint32_t device, PolychipStream *stream,
                                    const PolychipGatherArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
static PolychipError *never_sums(uint32_t device, PolychipStream *stream,
                                 const PolychipCumsumArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
static PolychipError *never_reduces(uint32_t device, PolychipStream *stream,
                                    const PolychipReduceBoolArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
static PolychipError *never_ands(uint32_t device, PolychipStream *stream,
                                 const PolychipBitwiseArgs *args) {
    (void)device, (void)stream, (void)args;
    abort();
}
#endif

static const PolychipOpTable ops = {
    .struct_size = sizeof(PolychipOpTable),
    .fill = fill,
#ifdef FAKE_MINOR_1_1
    /* A 1.1 plugin whose table has the newer header's size and, in a slot
     * ABI 1.2 added, a pointer it never meant. */
    .sigmoid = never_called,
#endif
#ifdef FAKE_MINOR_1_2
    /* A 1.2 plugin whose table has the 1.3 header's size and, in slots ABI
     * 1.3 added, pointers it never meant; its 1.2 slot is real. */
    .sigmoid = never_called,
    .sin = never_called,
    .add = never_adds,
    .select = never_selects,
    .eq = never_compares,
#endif
#ifdef FAKE_MINOR_1_3
    /* A 1.3 plugin whose table has the 1.4 header's size and, in slots ABI
     * 1.4 added, pointers it never meant; its 1.3 slot is real. */
    .sin = never_called,
    .gather = never_gathers,
    .cumsum = never_sums,
    .any = never_reduces,
    .bitwise_and = never_ands,
#endif
};

/* A table from a hypothetical newer minor: 1.0's table plus appended fields. */
typedef struct {
    PolychipPluginApi v1_0;
    void *appended_in_1_9;
} NewerTable;

static NewerTable table = {
    {
        sizeof(PolychipPluginApi),
        POLYCHIP_ABI_MAJOR,
        POLYCHIP_ABI_MINOR,
#ifdef FAKE_VENDOR_COLON
        "Fa:ke",
#else
        "Fake",
#endif
        "0.1.0",
        device_count,
        device_props,
        mem_alloc,
        mem_free,
        stream_create,
        stream_destroy,
        stream_synchronize,
        event_create,
        event_destroy,
        event_record,
        stream_wait_event,
        event_synchronize,
        memcpy_any,
        memcpy_any,
        memcpy_any,
        &ops,
    },
    NULL,
};

static PolychipError *init(const PolychipHostApi *host, const PolychipPluginApi **out_plugin) {
    if (!host || host->struct_size < sizeof *host || !out_plugin) return NULL;
    g_host = host;
#ifdef FAKE_NEEDS_HOST_1_7
    if (host->abi_minor < 7) return fail(POLYCHIP_ERROR_VERSION_MISMATCH, "fake needs a host of ABI 1.7 or newer");
#endif
#ifdef FAKE_INIT_FAILS_WITH_ESCAPES
    return fail(POLYCHIP_ERROR_INTERNAL, "fake: no device\x1b[2J\x1b]0;title\x07 \xe2\x80\xae here\nsecond line\r");
#endif
#ifdef FAKE_TABLE_MAJOR2
    table.v1_0.abi_major = 2;
#endif
#ifdef FAKE_SMALL_TABLE
    table.v1_0.struct_size = offsetof(PolychipPluginApi, vendor);
#endif
#ifdef FAKE_NULL_MEM_ALLOC
    table.v1_0.mem_alloc = NULL;
#endif
#ifdef FAKE_NEWER_MINOR
    table.v1_0.struct_size = sizeof(NewerTable);
    table.v1_0.abi_minor = 9;
#endif
#ifdef FAKE_MINOR_1_1
    table.v1_0.abi_minor = 1;
#endif
#ifdef FAKE_MINOR_1_2
    table.v1_0.abi_minor = 2;
#endif
#ifdef FAKE_MINOR_1_3
    table.v1_0.abi_minor = 3;
#endif
    *out_plugin = &table.v1_0;
    return NULL;
}

#if defined(FAKE_MAJOR2)
POLYCHIP_EXPORT PolychipError *polychip_plugin_init_v2(const PolychipHostApi *host, const PolychipPluginApi **out);
PolychipError *polychip_plugin_init_v2(const PolychipHostApi *host, const PolychipPluginApi **out) {
    return init(host, out);
}
#elif defined(FAKE_NO_ENTRY)
POLYCHIP_EXPORT int not_a_polychip_plugin(void);
int not_a_polychip_plugin(void) { return init(NULL, NULL) == NULL; }
#else
PolychipError *polychip_plugin_init_v1(const PolychipHostApi *host, const PolychipPluginApi **out_plugin) {
    return init(host, out_plugin);
}
#endif
