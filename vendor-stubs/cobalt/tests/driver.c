/*
 * A tiny polychip host written in C against include/polychip.h only, used to
 * test the Cobalt plugin end to end through the C ABI: it dlopens the plugin,
 * hands it a host table (errors as malloc'd {code, message} objects, logs to
 * stderr), and checks initialisation, device properties, memory (including
 * that device bytes really are stored encoded), copies, streams, events and
 * every operator against values computed here.
 *
 * The checks of the operators ABI 1.1 added live in driver_*.c, which share
 * this file's helpers through driver.h.
 *
 * Usage: driver <plugin library> [expected devices] [expected MiB per device]
 * (defaults 1 and 256). Prints "ok" and exits 0 when every check passes;
 * otherwise prints the failed check and exits 1.
 */

#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>

#include "driver.h"

/* ---- the host side ------------------------------------------------------- */

static PolychipError *host_error_new(void *ctx, PolychipErrorCode code, const char *message,
                                     size_t len) {
    (void)ctx;
    PolychipError *error = malloc(sizeof *error);
    if (error == NULL) {
        abort();
    }
    error->code = code;
    error->message = malloc(len + 1);
    if (error->message == NULL) {
        abort();
    }
    memcpy(error->message, message, len);
    error->message[len] = '\0';
    return error;
}

void host_error_destroy(void *ctx, PolychipError *error) {
    (void)ctx;
    if (error != NULL) {
        free(error->message);
        free(error);
    }
}

static PolychipHostApi the_host; /* the table the plugin keeps for its lifetime */
static int records_above_level;

static void host_log(void *ctx, PolychipLogLevel level, const char *message, size_t len) {
    (void)ctx;
    records_above_level += level > the_host.log_level;
    static const char *const names[] = {"?", "error", "warn", "info", "debug", "trace"};
    fprintf(stderr, "[plugin %s] %.*s\n", level <= 5 ? names[level] : "?", (int)len, message);
}

static PolychipHostApi host_table(void) {
    PolychipHostApi host;
    memset(&host, 0, sizeof host);
    host.struct_size = sizeof host;
    host.abi_major = POLYCHIP_ABI_MAJOR;
    host.abi_minor = POLYCHIP_ABI_MINOR;
    host.context = NULL;
    host.log = host_log;
    host.log_level = POLYCHIP_LOG_DEBUG;
    host.error_new = host_error_new;
    host.error_destroy = host_error_destroy;
    return host;
}

/* ---- checking helpers ---------------------------------------------------- */

void expect_ok_at(PolychipError *error, const char *what, const char *file, int line) {
    if (error != NULL) {
        fprintf(stderr, "FAILED at %s:%d: %s returned error %u: %s\n", file, line, what,
                (unsigned)error->code, error->message);
        exit(1);
    }
}

void expect_error_at(PolychipError *error, PolychipErrorCode code, const char *what,
                     const char *file, int line) {
    if (error == NULL) {
        fprintf(stderr, "FAILED at %s:%d: %s succeeded; expected error %u\n", file, line, what,
                (unsigned)code);
        exit(1);
    }
    if (error->code != code || error->message[0] == '\0') {
        fprintf(stderr, "FAILED at %s:%d: %s: expected error %u, got %u: \"%s\"\n", file, line, what,
                (unsigned)code, (unsigned)error->code, error->message);
        exit(1);
    }
    printf("expected error %u: %s\n", (unsigned)code, error->message);
    host_error_destroy(NULL, error);
}

int close_to(double got, double want, double tolerance) {
    if (isnan(want)) {
        return isnan(got);
    }
    if (isinf(want)) {
        return got == want;
    }
    return fabs(got - want) <= tolerance * (fabs(want) > 1.0 ? fabs(want) : 1.0);
}

/* ---- the plugin under test ----------------------------------------------- */

const PolychipPluginApi *P;
const PolychipOpTable *OPS;

const PolychipDataType F32 = {POLYCHIP_DTYPE_CODE_FLOAT, 32, 1};
const PolychipDataType F16 = {POLYCHIP_DTYPE_CODE_FLOAT, 16, 1};
const PolychipDataType BF16 = {POLYCHIP_DTYPE_CODE_BFLOAT, 16, 1};
const PolychipDataType F64 = {POLYCHIP_DTYPE_CODE_FLOAT, 64, 1};
const PolychipDataType I32 = {POLYCHIP_DTYPE_CODE_INT, 32, 1};
const PolychipDataType I64 = {POLYCHIP_DTYPE_CODE_INT, 64, 1};
const PolychipDataType U8 = {POLYCHIP_DTYPE_CODE_UINT, 8, 1};
const PolychipDataType BOOL = {POLYCHIP_DTYPE_CODE_BOOL, 8, 1};

void *upload(const void *src, size_t bytes) {
    void *ptr = NULL;
    OK(P->mem_alloc(0, bytes, &ptr));
    OK(P->memcpy_h2d(0, NULL, ptr, src, bytes));
    return ptr;
}

void download(void *dst, const void *device_src, size_t bytes) {
    OK(P->memcpy_d2h(0, NULL, dst, device_src, bytes));
}

void release(void *ptr) { OK(P->mem_free(0, ptr)); }

PolychipTensor tensor(void *data, PolychipDataType dtype, int32_t ndim, const int64_t *shape,
                             const int64_t *strides, uint64_t byte_offset) {
    PolychipTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = POLYCHIP_DEVICE_TYPE_EXT;
    t.device.device_id = 0;
    t.ndim = ndim;
    t.dtype = dtype;
    t.shape = shape;
    t.strides = strides;
    t.byte_offset = byte_offset;
    return t;
}

static PolychipError *fill(PolychipTensor out, double value) {
    PolychipFillArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.out = out;
    args.value = value;
    return OPS->fill(0, NULL, &args);
}

static PolychipError *copy(PolychipTensor src, PolychipTensor dst) {
    PolychipCopyArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.src = src;
    args.dst = dst;
    return OPS->copy(0, NULL, &args);
}

static PolychipError *cast(PolychipTensor src, PolychipTensor dst) {
    PolychipCastArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.src = src;
    args.dst = dst;
    return OPS->cast(0, NULL, &args);
}

static PolychipError *binary(PolychipBinaryFn fn, PolychipTensor a, PolychipTensor b,
                             PolychipTensor out, double alpha) {
    PolychipBinaryArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.a = a;
    args.b = b;
    args.out = out;
    args.alpha = alpha;
    return fn(0, NULL, &args);
}

static PolychipError *matmul(PolychipTensor a, PolychipTensor b, PolychipTensor out, double alpha,
                             double beta, int transpose_a, int transpose_b) {
    PolychipMatmulArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.a = a;
    args.b = b;
    args.out = out;
    args.alpha = alpha;
    args.beta = beta;
    args.transpose_a = (uint8_t)transpose_a;
    args.transpose_b = (uint8_t)transpose_b;
    return OPS->matmul(0, NULL, &args);
}

static PolychipError *softmax(PolychipTensor input, PolychipTensor out) {
    PolychipSoftmaxArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.input = input;
    args.out = out;
    return OPS->softmax(0, NULL, &args);
}

float bits_to_f32(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* ---- the checks ---------------------------------------------------------- */

static void check_init(PolychipPluginInitV1 init) {
    const PolychipPluginApi *sentinel = (const PolychipPluginApi *)&sentinel;
    const PolychipPluginApi *out = sentinel;

    PolychipHostApi host = host_table();
    host.abi_major = 2;
    ERR(POLYCHIP_ERROR_VERSION_MISMATCH, init(&host, &out));
    CHECK(out == sentinel, "init wrote out_plugin on failure");

    host = host_table();
    host.struct_size = offsetof(PolychipHostApi, error_new); /* no room for error_new */
    CHECK(init(&host, &out) == NULL && out == sentinel,
          "a host table without error_new must give NULL and leave out_plugin alone");
    CHECK(init(NULL, &out) == NULL && out == sentinel, "a NULL host must leave out_plugin alone");

    host = host_table();
    host.struct_size = offsetof(PolychipHostApi, error_destroy);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, init(&host, &out));
    CHECK(out == sentinel, "init wrote out_plugin on failure");

    host = host_table();
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, init(&host, NULL));

    the_host = host_table();
    OK(init(&the_host, &out));
    CHECK(out != sentinel && out != NULL, "init did not write out_plugin");
    P = out;
    OPS = P->ops;
}

static void check_table(void) {
    CHECK(P->struct_size >= sizeof(PolychipPluginApi), "plugin table is %zu bytes", P->struct_size);
    CHECK(P->abi_major == POLYCHIP_ABI_MAJOR, "abi_major %u", (unsigned)P->abi_major);
    CHECK(strcmp(P->vendor, "Cobalt") == 0, "vendor \"%s\"", P->vendor);
    CHECK(P->abi_minor == POLYCHIP_ABI_MINOR, "abi_minor %u", (unsigned)P->abi_minor);
    CHECK(strcmp(P->plugin_version, "1.1.0") == 0, "plugin_version \"%s\"", P->plugin_version);
    CHECK(P->device_count && P->device_props && P->mem_alloc && P->mem_free && P->stream_create &&
              P->stream_destroy && P->stream_synchronize && P->event_create && P->event_destroy &&
              P->event_record && P->stream_wait_event && P->event_synchronize && P->memcpy_h2d &&
              P->memcpy_d2h && P->memcpy_d2d && OPS != NULL,
          "a required plugin function is NULL");
    CHECK(OPS->struct_size >= sizeof(PolychipOpTable), "op table is %zu bytes", OPS->struct_size);
    CHECK(OPS->fill && OPS->copy && OPS->cast && OPS->add && OPS->sub && OPS->mul && OPS->div &&
              OPS->matmul && OPS->softmax,
          "an operator of ABI 1.0 is missing");
    /* Every entry of the table, ABI 1.1's to 1.4's included, is implemented. */
    size_t entries = (sizeof(PolychipOpTable) - offsetof(PolychipOpTable, fill)) / sizeof(void (*)(void));
    for (size_t i = 0; i < entries; i++) {
        void (*entry)(void);
        memcpy(&entry, (const char *)OPS + offsetof(PolychipOpTable, fill) + i * sizeof entry, sizeof entry);
        CHECK(entry != NULL, "operator entry %zu of %zu is NULL", i, entries);
    }
    CHECK(entries == 72, "the op table has %zu entries; ABI 1.4 has 9 + 38 + 5 + 12 + 8", entries);
}

static void check_devices(uint32_t expected_devices, uint64_t expected_bytes) {
    uint32_t count = 99;
    OK(P->device_count(&count));
    CHECK(count == expected_devices, "device_count %u, expected %u", (unsigned)count,
          (unsigned)expected_devices);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->device_count(NULL));

    PolychipDeviceProps props;
    if (expected_devices == 0) {
        memset(&props, 0, sizeof props);
        props.struct_size = sizeof props;
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->device_props(0, &props));
        return;
    }
    memset(&props, 0, sizeof props);
    props.struct_size = sizeof props;
    OK(P->device_props(0, &props));
    CHECK(props.struct_size == sizeof props, "struct_size %zu", props.struct_size);
    CHECK(strcmp(props.name, "Cobalt C1") == 0, "name \"%s\"", props.name);
    CHECK(props.memory_bytes == expected_bytes, "memory_bytes %llu, expected %llu",
          (unsigned long long)props.memory_bytes, (unsigned long long)expected_bytes);
    CHECK((props.memory_flags & POLYCHIP_MEMORY_HOST_VISIBLE) == 0, "memory must not be host-visible");
    CHECK((props.memory_flags & POLYCHIP_MEMORY_RDMA_EXPORTABLE) == 0, "memory is not RDMA-exportable");
    CHECK(props.compute_units == 1 && props.peak_flops_f32 > 0 && props.peak_flops_bf16 > 0 &&
              props.peak_flops_f16 > 0 && props.memory_bandwidth > 0 && props.link_bandwidth > 0,
          "performance figures missing");

    /* An older, smaller caller: only fields that fit are written. */
    memset(&props, 0, sizeof props);
    props.struct_size = offsetof(PolychipDeviceProps, memory_flags);
    props.memory_flags = 0xFFFFFFFFu;
    props.compute_units = 77;
    OK(P->device_props(0, &props));
    CHECK(props.struct_size == offsetof(PolychipDeviceProps, memory_flags), "struct_size %zu",
          props.struct_size);
    CHECK(props.memory_bytes == expected_bytes && props.memory_flags == 0xFFFFFFFFu &&
              props.compute_units == 77,
          "device_props wrote past the caller's struct_size");

    /* A newer, larger caller: the plugin reports what it knows. */
    struct {
        PolychipDeviceProps props;
        unsigned char newer[32];
    } bigger;
    memset(&bigger, 0xAB, sizeof bigger);
    bigger.props.struct_size = sizeof bigger;
    OK(P->device_props(0, &bigger.props));
    CHECK(bigger.props.struct_size == sizeof(PolychipDeviceProps), "struct_size %zu",
          bigger.props.struct_size);
    for (size_t i = 0; i < sizeof bigger.newer; i++) {
        CHECK(bigger.newer[i] == 0xAB, "device_props wrote beyond its struct");
    }

    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->device_props(expected_devices, &props));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->device_props(0, NULL));
}

static void check_memory(uint64_t capacity) {
    enum { N = 1000 };
    /* The plugin honours the host's log level (allocations log at debug). */
    void *quiet = NULL;
    the_host.log_level = POLYCHIP_LOG_WARN;
    OK(P->mem_alloc(0, 64, &quiet));
    release(quiet);
    the_host.log_level = POLYCHIP_LOG_DEBUG;
    CHECK(records_above_level == 0, "%d log records above the host's log level", records_above_level);

    unsigned char plain[N];
    unsigned char back[N];
    for (int i = 0; i < N; i++) {
        plain[i] = (unsigned char)(i * 7 + 3);
    }
    void *p = NULL;
    void *q = NULL;
    OK(P->mem_alloc(0, N, &p));
    OK(P->mem_alloc(0, N, &q));
    CHECK(p != NULL && (uintptr_t)p % 64 == 0 && (uintptr_t)q % 64 == 0, "allocations not 64-byte aligned");
    OK(P->memcpy_h2d(0, NULL, p, plain, N));

    /* The encoding is real: the raw bytes at the device address are not the data. */
    const unsigned char *raw = p;
    int same = 0;
    for (int i = 0; i < N; i++) {
        same += raw[i] == plain[i];
    }
    CHECK(same < N / 10, "%d of %d raw device bytes equal the plain bytes", same, N);

    memset(back, 0, N);
    OK(P->memcpy_d2h(0, NULL, back, p, N));
    CHECK(memcmp(back, plain, N) == 0, "h2d then d2h changed the data");
    OK(P->memcpy_d2d(0, NULL, q, p, N));
    memset(back, 0, N);
    OK(P->memcpy_d2h(0, NULL, back, q, N));
    CHECK(memcmp(back, plain, N) == 0, "d2d changed the data");

    /* Odd offsets and lengths. */
    OK(P->memcpy_h2d(0, NULL, (char *)p + 3, plain + 5, 77));
    memset(back, 0, N);
    OK(P->memcpy_d2h(0, NULL, back + 1, (char *)p + 3, 77));
    CHECK(memcmp(back + 1, plain + 5, 77) == 0, "unaligned round trip");
    OK(P->memcpy_d2d(0, NULL, (char *)q + 130, (char *)p + 1, 301));
    OK(P->memcpy_d2h(0, NULL, back, p, N));
    unsigned char expected[N];
    memcpy(expected, back + 1, 301);
    OK(P->memcpy_d2h(0, NULL, back, (char *)q + 130, 301));
    CHECK(memcmp(back, expected, 301) == 0, "unaligned d2d");
    OK(P->memcpy_h2d(0, NULL, p, plain, 0)); /* zero bytes: nothing to do */

    /* Bad ranges are refused, not dereferenced. */
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_d2h(0, NULL, back, p, N + 1));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_d2h(0, NULL, back, plain, 16));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_h2d(0, NULL, back, plain, 16));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_h2d(0, NULL, p, q, 16));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_d2h(0, NULL, q, p, 16));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_d2d(0, NULL, (char *)p + 8, p, 16));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_h2d(0, NULL, NULL, plain, 16));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_h2d(7777, NULL, p, plain, 16));

    /* Freeing. */
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->mem_free(0, (char *)p + 64));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->mem_free(0, plain));
    OK(P->mem_free(0, NULL));
    release(p);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->mem_free(0, p));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_d2h(0, NULL, back, p, 16)); /* freed */
    release(q);

    void *none = plain;
    OK(P->mem_alloc(0, 0, &none));
    CHECK(none == NULL, "a zero-byte allocation should be NULL");
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->mem_alloc(0, 16, NULL));

    /* Capacity, out of memory, and coalescing of freed neighbours. */
    void *all = NULL;
    ERR(POLYCHIP_ERROR_OUT_OF_MEMORY, P->mem_alloc(0, capacity + 1, &all));
    CHECK(all == NULL, "mem_alloc wrote out_ptr on failure");
    ERR(POLYCHIP_ERROR_OUT_OF_MEMORY, P->mem_alloc(0, UINT64_MAX, &all));
    void *quarter[4];
    for (int i = 0; i < 4; i++) {
        OK(P->mem_alloc(0, capacity / 4, &quarter[i]));
    }
    ERR(POLYCHIP_ERROR_OUT_OF_MEMORY, P->mem_alloc(0, 1, &all));
    release(quarter[1]);
    ERR(POLYCHIP_ERROR_OUT_OF_MEMORY, P->mem_alloc(0, capacity / 2, &all)); /* fragmented */
    release(quarter[0]); /* merges with the free block after it */
    release(quarter[3]);
    release(quarter[2]); /* merges with free blocks on both sides */
    OK(P->mem_alloc(0, capacity, &all));
    release(all);
}

static void check_streams(uint32_t devices) {
    PolychipStream *stream = NULL;
    PolychipEvent *event = NULL;
    OK(P->stream_create(0, &stream));
    OK(P->event_create(0, &event));
    unsigned char data[256];
    unsigned char back[256];
    for (int i = 0; i < 256; i++) {
        data[i] = (unsigned char)(255 - i);
    }
    void *p = NULL;
    OK(P->mem_alloc(0, sizeof data, &p));
    OK(P->memcpy_h2d(0, stream, p, data, sizeof data));
    OK(P->event_record(event, stream));
    OK(P->stream_wait_event(stream, event));
    OK(P->stream_wait_event(NULL, event));
    OK(P->event_synchronize(event));
    OK(P->event_record(event, NULL));
    OK(P->memcpy_d2h(0, stream, back, p, sizeof back));
    OK(P->stream_synchronize(stream));
    OK(P->stream_synchronize(NULL));
    CHECK(memcmp(back, data, sizeof data) == 0, "copies on a stream");

    int64_t shape[1] = {4};
    PolychipFillArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.out = tensor(p, F32, 1, shape, NULL, 0);
    args.value = 1.0;
    OK(OPS->fill(0, stream, &args));

    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->stream_create(0, NULL));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->stream_create(devices, &stream));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->event_create(0, NULL));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->stream_destroy(NULL));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->event_destroy(NULL));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->event_record(NULL, stream));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->event_synchronize(NULL));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->stream_wait_event(stream, NULL));

    if (devices >= 2) {
        PolychipStream *other = NULL;
        OK(P->stream_create(1, &other));
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->memcpy_d2h(0, other, back, p, 16));
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->fill(0, other, &args));
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->event_record(event, other));
        OK(P->stream_wait_event(other, event)); /* cross-device waits are fine */
        OK(P->stream_destroy(other));
        /* A tensor on device 0 passed to an operator on device 1. */
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->fill(1, NULL, &args));
        args.out.device.device_id = 1;
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->fill(1, NULL, &args));
    }

    OK(P->event_destroy(event));
    OK(P->stream_destroy(stream));
    release(p);
}

static void check_fill(void) {
    int64_t shape23[2] = {2, 3};
    float f[6];
    void *p = NULL;
    OK(P->mem_alloc(0, sizeof f, &p));
    OK(fill(tensor(p, F32, 2, shape23, NULL, 0), 2.5));
    download(f, p, sizeof f);
    for (int i = 0; i < 6; i++) {
        CHECK(f[i] == 2.5f, "fill f32: element %d is %g", i, (double)f[i]);
    }
    /* Column 1 only: shape [2], stride 3, offset one element. */
    int64_t shape2[1] = {2};
    int64_t stride3[1] = {3};
    OK(fill(tensor(p, F32, 1, shape2, stride3, sizeof(float)), -1.0));
    download(f, p, sizeof f);
    CHECK(f[0] == 2.5f && f[1] == -1.0f && f[2] == 2.5f && f[3] == 2.5f && f[4] == -1.0f &&
              f[5] == 2.5f,
          "strided fill wrote the wrong elements");

    int32_t ints[3];
    OK(fill(tensor(p, I32, 1, (int64_t[]){3}, NULL, 0), -3.7));
    download(ints, p, sizeof ints);
    CHECK(ints[0] == -3 && ints[2] == -3, "fill i32 -3.7 gave %d", (int)ints[0]);
    int64_t longs[2];
    OK(fill(tensor(p, I64, 1, (int64_t[]){2}, NULL, 0), 1e12 + 0.9));
    download(longs, p, sizeof longs);
    CHECK(longs[1] == 1000000000000LL, "fill i64 gave %lld", (long long)longs[1]);
    unsigned char bytes[3];
    OK(fill(tensor(p, BOOL, 1, (int64_t[]){3}, NULL, 0), 0.5));
    download(bytes, p, 3);
    CHECK(bytes[0] == 1 && bytes[2] == 1, "fill bool 0.5 gave %u", (unsigned)bytes[0]);
    OK(fill(tensor(p, U8, 1, (int64_t[]){3}, NULL, 0), 7.9));
    download(bytes, p, 3);
    CHECK(bytes[1] == 7, "fill u8 7.9 gave %u", (unsigned)bytes[1]);
    uint16_t halves[2];
    OK(fill(tensor(p, BF16, 1, (int64_t[]){2}, NULL, 0), 1.00390625)); /* tie: to even */
    download(halves, p, sizeof halves);
    CHECK(halves[0] == 0x3F80, "fill bf16 1+2^-8 gave 0x%04x", (unsigned)halves[0]);
    OK(fill(tensor(p, F16, 1, (int64_t[]){2}, NULL, 0), 65520.0)); /* rounds up to inf */
    download(halves, p, sizeof halves);
    CHECK(halves[1] == 0x7C00, "fill f16 65520 gave 0x%04x", (unsigned)halves[1]);
    double d[2];
    OK(fill(tensor(p, F64, 1, (int64_t[]){2}, NULL, 0), 0.1));
    download(d, p, sizeof d);
    CHECK(d[0] == 0.1, "fill f64");

    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->fill(0, NULL, NULL));
    PolychipFillArgs small;
    memset(&small, 0, sizeof small);
    small.struct_size = offsetof(PolychipFillArgs, value); /* no room for value */
    small.out = tensor(p, F32, 2, shape23, NULL, 0);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->fill(0, NULL, &small));
    PolychipTensor wrong = tensor(p, F32, 2, shape23, NULL, 0);
    wrong.device.device_type = POLYCHIP_DEVICE_TYPE_CPU;
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, fill(wrong, 0.0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, fill(tensor(p, F32, 2, (int64_t[]){3, 3}, NULL, 0), 0.0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, fill(tensor(p, F32, 2, (int64_t[]){2, -1}, NULL, 0), 0.0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, fill(tensor(f, F32, 2, shape23, NULL, 0), 0.0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, fill(tensor(NULL, F32, 2, shape23, NULL, 0), 0.0));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, fill(tensor(p, (PolychipDataType){2, 32, 4}, 1, shape2, NULL, 0), 0.0));
    int64_t many[17];
    for (int i = 0; i < 17; i++) {
        many[i] = 1;
    }
    ERR(POLYCHIP_ERROR_UNIMPLEMENTED, fill(tensor(p, F32, 17, many, NULL, 0), 0.0));
    OK(fill(tensor(NULL, F32, 2, (int64_t[]){0, 3}, NULL, 0), 0.0)); /* empty: nothing to do */
    release(p);
}

static void check_copy(void) {
    float m[6] = {0, 1, 2, 3, 4, 5}; /* [2, 3] */
    void *src = upload(m, sizeof m);
    void *dst = NULL;
    OK(P->mem_alloc(0, sizeof m, &dst));
    /* The transpose: src viewed as [3, 2] with strides [1, 3]. */
    int64_t shape32[2] = {3, 2};
    int64_t strides_t[2] = {1, 3};
    OK(copy(tensor(src, F32, 2, shape32, strides_t, 0), tensor(dst, F32, 2, shape32, NULL, 0)));
    float out[6];
    download(out, dst, sizeof out);
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 2; j++) {
            CHECK(out[i * 2 + j] == m[j * 3 + i], "transposed copy at [%d, %d]", i, j);
        }
    }
    /* Reversal with a negative stride. */
    int64_t shape6[1] = {6};
    int64_t backwards[1] = {-1};
    OK(copy(tensor(src, F32, 1, shape6, backwards, 5 * sizeof(float)), tensor(dst, F32, 1, shape6, NULL, 0)));
    download(out, dst, sizeof out);
    for (int i = 0; i < 6; i++) {
        CHECK(out[i] == m[5 - i], "reversed copy at %d", i);
    }
    /* Integers copy too. */
    int64_t longs[3] = {-1, 1LL << 40, 7};
    void *lsrc = upload(longs, sizeof longs);
    void *ldst = NULL;
    OK(P->mem_alloc(0, sizeof longs, &ldst));
    OK(copy(tensor(lsrc, I64, 1, (int64_t[]){3}, NULL, 0), tensor(ldst, I64, 1, (int64_t[]){3}, NULL, 0)));
    int64_t lback[3];
    download(lback, ldst, sizeof lback);
    CHECK(memcmp(lback, longs, sizeof longs) == 0, "i64 copy");

    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, copy(tensor(src, F32, 1, shape6, NULL, 0), tensor(dst, I32, 1, shape6, NULL, 0)));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, copy(tensor(src, F32, 2, (int64_t[]){2, 3}, NULL, 0), tensor(dst, F32, 1, shape6, NULL, 0)));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->copy(0, NULL, NULL));
    release(src);
    release(dst);
    release(lsrc);
    release(ldst);
}

static void check_cast(void) {
    /* f32 -> bf16: ties to even, NaN stays NaN, overflow to inf, underflow to 0. */
    uint32_t f32_bits[5] = {0x3F808000u, 0x3F818000u, 0x7FC00001u, 0x7F7FFFFFu, 0x00000001u};
    void *src = upload(f32_bits, sizeof f32_bits);
    void *dst = NULL;
    OK(P->mem_alloc(0, 64, &dst));
    int64_t shape5[1] = {5};
    OK(cast(tensor(src, F32, 1, shape5, NULL, 0), tensor(dst, BF16, 1, shape5, NULL, 0)));
    uint16_t h[5];
    download(h, dst, sizeof h);
    CHECK(h[0] == 0x3F80, "bf16(0x3F808000) = 0x%04x, expected 0x3F80", (unsigned)h[0]);
    CHECK(h[1] == 0x3F82, "bf16(0x3F818000) = 0x%04x, expected 0x3F82", (unsigned)h[1]);
    CHECK((h[2] & 0x7F80) == 0x7F80 && (h[2] & 0x0040) != 0, "bf16(NaN) = 0x%04x", (unsigned)h[2]);
    CHECK(h[3] == 0x7F80, "bf16(FLT_MAX) = 0x%04x", (unsigned)h[3]);
    CHECK(h[4] == 0x0000, "bf16(tiny) = 0x%04x", (unsigned)h[4]);

    /* bf16 -> f32 is exact. */
    float back[5];
    OK(cast(tensor(dst, BF16, 1, shape5, NULL, 0), tensor(src, F32, 1, shape5, NULL, 0)));
    download(back, src, sizeof back);
    CHECK(back[0] == 1.0f && back[1] == bits_to_f32(0x3F820000u) && isnan(back[2]) && isinf(back[3]),
          "bf16 -> f32");
    release(src);

    /* f64 -> f16 / bf16 round once, directly from the double. Through f32,
     * 1 + 2^-11 + 2^-30 would become the tie 1 + 2^-11 and then 1.0. */
    double doubles[9] = {1.0 + 0x1p-11 + 0x1p-30, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 0x1p-24, 0x1p-25,
                         1.5 * 0x1p-25, 65504.0, -INFINITY, NAN};
    uint16_t want_f16[9] = {0x3C01, 0x3C00, 0x3C02, 0x0001, 0x0000, 0x0001, 0x7BFF, 0xFC00, 0x7E00};
    int64_t shape9[1] = {9};
    src = upload(doubles, sizeof doubles);
    OK(cast(tensor(src, F64, 1, shape9, NULL, 0), tensor(dst, F16, 1, shape9, NULL, 0)));
    uint16_t got[9];
    download(got, dst, sizeof got);
    for (int i = 0; i < 8; i++) {
        CHECK(got[i] == want_f16[i], "f16(%a) = 0x%04x, expected 0x%04x", doubles[i], (unsigned)got[i],
              (unsigned)want_f16[i]);
    }
    CHECK((got[8] & 0x7C00) == 0x7C00 && (got[8] & 0x0200) != 0, "f16(NaN) = 0x%04x", (unsigned)got[8]);
    release(src);

    double to_bf16[1] = {1.0 + 0x1p-8 + 0x1p-30}; /* through f32 it would become 1.0 */
    src = upload(to_bf16, sizeof to_bf16);
    OK(cast(tensor(src, F64, 1, (int64_t[]){1}, NULL, 0), tensor(dst, BF16, 1, (int64_t[]){1}, NULL, 0)));
    download(got, dst, 2);
    CHECK(got[0] == 0x3F81, "bf16(1 + 2^-8 + 2^-30) = 0x%04x, expected 0x3F81", (unsigned)got[0]);

    /* f16 -> f64 exactly, including a subnormal. */
    uint16_t halves[3] = {0x0001, 0x3C00, 0xFC00};
    void *hsrc = upload(halves, sizeof halves);
    void *dwide = NULL;
    OK(P->mem_alloc(0, 3 * sizeof(double), &dwide));
    OK(cast(tensor(hsrc, F16, 1, (int64_t[]){3}, NULL, 0), tensor(dwide, F64, 1, (int64_t[]){3}, NULL, 0)));
    double wide[3];
    download(wide, dwide, sizeof wide);
    CHECK(wide[0] == 0x1p-24 && wide[1] == 1.0 && wide[2] == -INFINITY, "f16 -> f64");

    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, cast(tensor(hsrc, I32, 1, (int64_t[]){1}, NULL, 0), tensor(src, F64, 1, (int64_t[]){1}, NULL, 0)));
    release(hsrc);
    release(dwide);
    release(src);
    release(dst);
}

static void check_elementwise(void) {
    float a[6] = {1, 2, 3, 4, 5, 6}; /* [2, 3] */
    float b[3] = {10, 20, 30};       /* [3] */
    float c[2] = {100, 200};         /* [2, 1] */
    float out[6];
    int64_t shape23[2] = {2, 3};
    int64_t shape3[1] = {3};
    int64_t shape21[2] = {2, 1};
    void *da = upload(a, sizeof a);
    void *db = upload(b, sizeof b);
    void *dc = upload(c, sizeof c);
    void *dout = NULL;
    OK(P->mem_alloc(0, sizeof out, &dout));
    PolychipTensor ta = tensor(da, F32, 2, shape23, NULL, 0);
    PolychipTensor tb = tensor(db, F32, 1, shape3, NULL, 0);
    PolychipTensor tc = tensor(dc, F32, 2, shape21, NULL, 0);
    PolychipTensor tout = tensor(dout, F32, 2, shape23, NULL, 0);

    OK(binary(OPS->add, ta, tb, tout, 2.0));
    download(out, dout, sizeof out);
    for (int i = 0; i < 6; i++) {
        CHECK(out[i] == a[i] + 2 * b[i % 3], "broadcast add at %d: %g", i, (double)out[i]);
    }
    OK(binary(OPS->sub, ta, tc, tout, 0.5));
    download(out, dout, sizeof out);
    for (int i = 0; i < 6; i++) {
        CHECK(out[i] == a[i] - 0.5f * c[i / 3], "broadcast sub at %d: %g", i, (double)out[i]);
    }
    OK(binary(OPS->mul, tc, tb, tout, 0.0)); /* [2, 1] x [3] -> [2, 3] */
    download(out, dout, sizeof out);
    for (int i = 0; i < 6; i++) {
        CHECK(out[i] == c[i / 3] * b[i % 3], "outer mul at %d: %g", i, (double)out[i]);
    }
    float zeros[3] = {0, 0, 0};
    void *dz = upload(zeros, sizeof zeros);
    OK(binary(OPS->div, ta, tensor(dz, F32, 1, shape3, NULL, 0), tout, 0.0));
    download(out, dout, sizeof out);
    CHECK(isinf(out[0]) && out[0] > 0, "1 / 0 should be +inf, got %g", (double)out[0]);
    OK(binary(OPS->div, ta, tb, tout, 0.0));
    download(out, dout, sizeof out);
    CHECK(out[5] == 6.0f / 30.0f, "div");
    /* A 0-dim b broadcasts everywhere; in place into a. */
    float two = 2.0f;
    void *dtwo = upload(&two, sizeof two);
    OK(binary(OPS->mul, ta, tensor(dtwo, F32, 0, NULL, NULL, 0), ta, 0.0));
    download(out, da, sizeof out);
    for (int i = 0; i < 6; i++) {
        CHECK(out[i] == 2 * a[i], "in-place scalar mul at %d", i);
    }
    /* bf16: computed wide, rounded once to nearest even. */
    uint16_t ha[2] = {0x3F80, 0x3F80};
    uint16_t hb[2] = {0x3B80, 0x3C40}; /* 2^-8 and 3 * 2^-8 */
    void *dha = upload(ha, sizeof ha);
    void *dhb = upload(hb, sizeof hb);
    int64_t shape2[1] = {2};
    OK(binary(OPS->add, tensor(dha, BF16, 1, shape2, NULL, 0), tensor(dhb, BF16, 1, shape2, NULL, 0),
              tensor(dha, BF16, 1, shape2, NULL, 0), 1.0));
    uint16_t hout[2];
    download(hout, dha, sizeof hout);
    CHECK(hout[0] == 0x3F80 && hout[1] == 0x3F82, "bf16 add gave 0x%04x 0x%04x", (unsigned)hout[0],
          (unsigned)hout[1]);

    /* Errors: shapes that do not broadcast, a wrong out shape, mixed dtypes. */
    int64_t shape4[1] = {4};
    int64_t shape32[2] = {3, 2};
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, binary(OPS->add, ta, tensor(dout, F32, 1, shape4, NULL, 0), tout, 1.0));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, binary(OPS->add, ta, tb, tensor(dout, F32, 2, shape32, NULL, 0), 1.0));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, binary(OPS->add, ta, tensor(dha, F16, 1, shape2, NULL, 0), tout, 1.0));
    /* Integers take add, sub and mul since ABI 1.3, not div. */
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, binary(OPS->div, tensor(da, I32, 2, shape23, NULL, 0),
                                              tensor(db, I32, 1, shape3, NULL, 0),
                                              tensor(dout, I32, 2, shape23, NULL, 0), 1.0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->add(0, NULL, NULL));
    PolychipBinaryArgs small;
    memset(&small, 0, sizeof small);
    small.struct_size = offsetof(PolychipBinaryArgs, alpha);
    small.a = ta;
    small.b = tb;
    small.out = tout;
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->add(0, NULL, &small)); /* add reads alpha */
    OK(OPS->mul(0, NULL, &small));                                   /* mul does not */
    /* A tensor reaching past its allocation. */
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, binary(OPS->add, ta, tensor(db, F32, 1, shape3, NULL, 4), tb, 1.0));
    /* Empty tensors do nothing. */
    int64_t shape03[2] = {0, 3};
    OK(binary(OPS->add, tensor(NULL, F32, 2, shape03, NULL, 0), tb, tensor(NULL, F32, 2, shape03, NULL, 0), 1.0));

    void *all[] = {da, db, dc, dout, dz, dtwo, dha, dhb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

/* out[b][i][j] = sum_p a[b][i][p] * bt[j][p] (b transposed, one batch of b). */
static void check_matmul(void) {
    float a[2][2][3] = {{{1, 2, 3}, {4, 5, 6}}, {{-1, 0.5f, 2}, {0, 1, -3}}};
    float bt[4][3] = {{1, 0, 0}, {0, 1, 0}, {1, 1, 1}, {2, -1, 0.25f}}; /* b^T, b is [3, 4] */
    float expected[2][2][4];
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 4; j++) {
                double sum = 0;
                for (int p = 0; p < 3; p++) {
                    sum += (double)a[s][i][p] * bt[j][p];
                }
                expected[s][i][j] = (float)sum;
            }
        }
    }
    void *da = upload(a, sizeof a);
    void *db = upload(bt, sizeof bt);
    void *dout = NULL;
    OK(P->mem_alloc(0, sizeof expected, &dout));
    float out[2][2][4];

    /* One matrix, b transposed, out full of NaN and beta = 0: NaN must not leak. */
    int64_t shape23[2] = {2, 3};
    int64_t shape43[2] = {4, 3};
    int64_t shape24[2] = {2, 4};
    PolychipTensor tout = tensor(dout, F32, 2, shape24, NULL, 0);
    OK(fill(tout, NAN));
    OK(matmul(tensor(da, F32, 2, shape23, NULL, 0), tensor(db, F32, 2, shape43, NULL, 0), tout, 1.0, 0.0, 0, 1));
    download(out, dout, sizeof out[0]);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 4; j++) {
            CHECK(close_to(out[0][i][j], expected[0][i][j], 1e-6), "matmul [%d, %d]: %g, expected %g", i, j,
                  (double)out[0][i][j], (double)expected[0][i][j]);
        }
    }
    /* alpha = 2, beta = 1: out = 2 * a @ b + out = 3 * a @ b. */
    OK(matmul(tensor(da, F32, 2, shape23, NULL, 0), tensor(db, F32, 2, shape43, NULL, 0), tout, 2.0, 1.0, 0, 1));
    download(out, dout, sizeof out[0]);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 4; j++) {
            CHECK(close_to(out[0][i][j], 3 * expected[0][i][j], 1e-6), "alpha/beta matmul [%d, %d]", i, j);
        }
    }
    /* transpose_a: a^T stored as [3, 2] (a viewed through strides), b as [3, 4]. */
    float b_plain[3][4];
    for (int p = 0; p < 3; p++) {
        for (int j = 0; j < 4; j++) {
            b_plain[p][j] = bt[j][p];
        }
    }
    void *db_plain = upload(b_plain, sizeof b_plain);
    int64_t shape32[2] = {3, 2};
    int64_t strides_t[2] = {1, 3};
    int64_t shape34[2] = {3, 4};
    OK(matmul(tensor(da, F32, 2, shape32, strides_t, 0), tensor(db_plain, F32, 2, shape34, NULL, 0), tout,
              1.0, 0.0, 1, 0));
    download(out, dout, sizeof out[0]);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 4; j++) {
            CHECK(close_to(out[0][i][j], expected[0][i][j], 1e-6), "transpose_a matmul [%d, %d]", i, j);
        }
    }
    /* Batched: a [2, 2, 3], b [3, 4] broadcast over the batch -> out [2, 2, 4]. */
    int64_t shape223[3] = {2, 2, 3};
    int64_t shape224[3] = {2, 2, 4};
    OK(matmul(tensor(da, F32, 3, shape223, NULL, 0), tensor(db_plain, F32, 2, shape34, NULL, 0),
              tensor(dout, F32, 3, shape224, NULL, 0), 1.0, 0.0, 0, 0));
    download(out, dout, sizeof out);
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 4; j++) {
                CHECK(close_to(out[s][i][j], expected[s][i][j], 1e-6), "batched matmul [%d, %d, %d]", s, i, j);
            }
        }
    }
    /* f64, and K = 0 (the product of empty matrices is zeros). */
    double a64[2][3] = {{1, 2, 3}, {4, 5, 6}};
    double b64[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    void *da64 = upload(a64, sizeof a64);
    void *db64 = upload(b64, sizeof b64);
    void *dout64 = NULL;
    OK(P->mem_alloc(0, 4 * sizeof(double), &dout64));
    int64_t shape22[2] = {2, 2};
    int64_t shape32b[2] = {3, 2};
    OK(matmul(tensor(da64, F64, 2, shape23, NULL, 0), tensor(db64, F64, 2, shape32b, NULL, 0),
              tensor(dout64, F64, 2, shape22, NULL, 0), 1.0, 0.0, 0, 0));
    double out64[4];
    download(out64, dout64, sizeof out64);
    CHECK(out64[0] == 22 && out64[1] == 28 && out64[2] == 49 && out64[3] == 64, "f64 matmul");
    int64_t shape20[2] = {2, 0};
    int64_t shape02[2] = {0, 2};
    OK(matmul(tensor(NULL, F64, 2, shape20, NULL, 0), tensor(NULL, F64, 2, shape02, NULL, 0),
              tensor(dout64, F64, 2, shape22, NULL, 0), 1.0, 0.0, 0, 0));
    download(out64, dout64, sizeof out64);
    CHECK(out64[0] == 0 && out64[3] == 0, "K = 0 matmul should give zeros");

    /* Errors: inner dimensions, out shape, dtypes. */
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, matmul(tensor(da, F32, 2, shape23, NULL, 0), tensor(db, F32, 2, shape43, NULL, 0), tout, 1.0, 0.0, 0, 0));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, matmul(tensor(da, F32, 2, shape23, NULL, 0), tensor(db, F32, 2, shape43, NULL, 0),
                                              tensor(dout, F32, 2, shape22, NULL, 0), 1.0, 0.0, 0, 1));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, matmul(tensor(da, F32, 2, shape23, NULL, 0), tensor(db, BF16, 2, shape43, NULL, 0), tout, 1.0, 0.0, 0, 1));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->matmul(0, NULL, NULL));

    void *all[] = {da, db, dout, db_plain, da64, db64, dout64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static void check_softmax(void) {
    float x[2][3] = {{1000, 1001, 1002}, {-INFINITY, -INFINITY, -INFINITY}};
    void *dx = upload(x, sizeof x);
    void *dout = NULL;
    OK(P->mem_alloc(0, sizeof x, &dout));
    int64_t shape23[2] = {2, 3};
    OK(softmax(tensor(dx, F32, 2, shape23, NULL, 0), tensor(dout, F32, 2, shape23, NULL, 0)));
    float out[2][3];
    download(out, dout, sizeof out);
    double sum = exp(-2.0) + exp(-1.0) + 1.0;
    double want[3] = {exp(-2.0) / sum, exp(-1.0) / sum, 1.0 / sum};
    for (int j = 0; j < 3; j++) {
        CHECK(close_to(out[0][j], want[j], 1e-6), "softmax([1000, 1001, 1002])[%d] = %.9g, expected %.9g", j,
              (double)out[0][j], want[j]);
        CHECK(isnan(out[1][j]), "softmax of an all -inf row should be NaN, got %g", (double)out[1][j]);
    }
    /* f64, in place. */
    double y[4] = {0.0, log(3.0), 1e300, 1e300};
    void *dy = upload(y, sizeof y);
    int64_t shape22[2] = {2, 2};
    PolychipTensor ty = tensor(dy, F64, 2, shape22, NULL, 0);
    OK(softmax(ty, ty));
    download(y, dy, sizeof y);
    CHECK(close_to(y[0], 0.25, 1e-15) && close_to(y[1], 0.75, 1e-15) && y[2] == 0.5 && y[3] == 0.5,
          "f64 softmax gave %g %g %g %g", y[0], y[1], y[2], y[3]);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, softmax(tensor(dx, F32, 2, shape23, NULL, 0), tensor(dout, F32, 1, (int64_t[]){6}, NULL, 0)));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, softmax(tensor(dx, F32, 2, shape23, NULL, 0), tensor(dout, F16, 2, shape23, NULL, 0)));
    release(dx);
    release(dout);
    release(dy);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <plugin library> [devices] [MiB per device]\n", argv[0]);
        return 2;
    }
    uint32_t devices = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 1;
    uint64_t mib = argc > 3 ? strtoull(argv[3], NULL, 10) : 256;

    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(library != NULL, "dlopen(%s): %s", argv[1], dlerror());
    void *symbol = dlsym(library, "polychip_plugin_init_v1");
    CHECK(symbol != NULL, "dlsym(polychip_plugin_init_v1): %s", dlerror());
    PolychipPluginInitV1 init;
    memcpy(&init, &symbol, sizeof init); /* ISO C has no object-to-function pointer cast */

    check_init(init);
    check_table();
    check_devices(devices, mib * 1024 * 1024);
    if (devices == 0) {
        void *p = NULL;
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, P->mem_alloc(0, 64, &p));
        printf("ok\n");
        return 0;
    }
    check_memory(mib * 1024 * 1024);
    check_streams(devices);
    check_fill();
    check_copy();
    check_cast();
    check_elementwise();
    check_matmul();
    check_softmax();
    check_unary_ops();
    check_reduce_ops();
    check_norm_ops();
    check_attention_ops();
    check_training_ops();
    printf("ok\n");
    return 0;
}
