/*
 * The Cobalt plugin's entry point: polychip_plugin_init_v1 (the library's one
 * exported symbol), the static plugin and operator tables, device properties,
 * configuration from the environment, and the error and log helpers every
 * other file uses.
 *
 * Configuration (read once, at the first successful init):
 *   POLYCHIP_COBALT_DEVICES     number of devices, 0..=16 (default 1)
 *   POLYCHIP_COBALT_MEMORY_MIB  memory per device in MiB, 1..=65536 (default 256)
 * An unset or empty variable means the default; a malformed or out-of-range
 * one also means the default, with a warning through the host's log.
 */

#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

/* The host that initialized us (its table lives for the whole process). */
static const PolychipHostApi *g_host;
static int g_initialized;
static uint32_t g_device_count = COBALT_DEFAULT_DEVICES;

/* ---- errors and logs ----------------------------------------------------- */

static PolychipError *host_error_v(const PolychipHostApi *host, PolychipErrorCode code,
                                   const char *fmt, va_list ap) {
    char message[1024];
    int n = vsnprintf(message, sizeof message, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof message ? (size_t)n : sizeof message - 1;
    return host->error_new(host->context, code, message, len);
}

static PolychipError *host_error(const PolychipHostApi *host, PolychipErrorCode code,
                                 const char *fmt, ...) COBALT_PRINTF(3, 4);

static PolychipError *host_error(const PolychipHostApi *host, PolychipErrorCode code,
                                 const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PolychipError *error = host_error_v(host, code, fmt, ap);
    va_end(ap);
    return error;
}

PolychipError *cobalt_error(PolychipErrorCode code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PolychipError *error = host_error_v(g_host, code, fmt, ap);
    va_end(ap);
    return error;
}

void cobalt_log(PolychipLogLevel level, const char *fmt, ...) {
    const PolychipHostApi *host = g_host;
    if (host == NULL || !COBALT_HAS_FIELD(host->struct_size, PolychipHostApi, log) ||
        host->log == NULL) {
        return;
    }
    /* Records more verbose than the host keeps are not even formatted. */
    if (COBALT_HAS_FIELD(host->struct_size, PolychipHostApi, log_level) && level > host->log_level) {
        return;
    }
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    size_t len = (size_t)n < sizeof message ? (size_t)n : sizeof message - 1;
    host->log(host->context, level, message, len);
}

/* ---- configuration ------------------------------------------------------- */

/*
 * Parses environment variable `name` as a decimal integer in [min, max].
 * Unset or empty: `fallback`, silently. Anything else invalid: `fallback`
 * with a warning.
 */
static uint64_t env_integer(const char *name, uint64_t min, uint64_t max, uint64_t fallback) {
    const char *text = getenv(name);
    if (text == NULL || text[0] == '\0') {
        return fallback;
    }
    const char *p = text;
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    uint64_t value = 0;
    int digits = 0;
    int overflow = 0;
    while (*p >= '0' && *p <= '9') {
        uint64_t digit = (uint64_t)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10u) {
            overflow = 1;
        } else {
            value = value * 10u + digit;
        }
        digits++;
        p++;
    }
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    if (digits == 0 || *p != '\0' || overflow || value < min || value > max) {
        cobalt_log(POLYCHIP_LOG_WARN,
                   "cobalt: ignoring %s=\"%s\": expected a whole number from %llu to %llu; "
                   "using the default %llu",
                   name, text, (unsigned long long)min, (unsigned long long)max,
                   (unsigned long long)fallback);
        return fallback;
    }
    return value;
}

static void read_configuration(void) {
    g_device_count = (uint32_t)env_integer("POLYCHIP_COBALT_DEVICES", 0, COBALT_MAX_DEVICES,
                                           COBALT_DEFAULT_DEVICES);
    uint64_t mib = env_integer("POLYCHIP_COBALT_MEMORY_MIB", 1, COBALT_MAX_MEMORY_MIB,
                               COBALT_DEFAULT_MEMORY_MIB);
    cobalt_memory_init(mib * 1024u * 1024u);
    cobalt_set_strict_streams(env_integer("POLYCHIP_COBALT_STRICT_STREAMS", 0, 1, 0) != 0);
    cobalt_log(POLYCHIP_LOG_INFO, "cobalt: %u device(s), %llu MiB of memory each",
               (unsigned)g_device_count, (unsigned long long)mib);
}

uint32_t cobalt_devices(void) { return g_device_count; }

PolychipError *cobalt_check_device(uint32_t device, const char *what) {
    if (device >= g_device_count) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: device %u does not exist; this plugin has %u device(s)",
                            what, (unsigned)device, (unsigned)g_device_count);
    }
    return NULL;
}

/* ---- device queries ------------------------------------------------------ */

static PolychipError *cobalt_device_count(uint32_t *out_count) {
    if (out_count == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: device_count: out_count is NULL");
    }
    *out_count = g_device_count;
    return NULL;
}

/*
 * Writes only the fields that end within the caller's struct_size and sets
 * struct_size to the end of the last field written (the header's "number of
 * bytes it wrote"; equal to min(caller's size, sizeof) for any size that
 * falls on a field boundary, which every real version of the struct does).
 */
static PolychipError *cobalt_device_props(uint32_t device, PolychipDeviceProps *out_props) {
    PolychipError *error = cobalt_check_device(device, "device_props");
    if (error != NULL) {
        return error;
    }
    if (out_props == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: device_props: out_props is NULL");
    }
    size_t size = out_props->struct_size;
    if (!COBALT_HAS_FIELD(size, PolychipDeviceProps, struct_size)) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: device_props: out_props->struct_size is %zu, smaller than the "
                            "struct_size field itself (%zu bytes)",
                            size, sizeof out_props->struct_size);
    }
    size_t written = COBALT_FIELD_END(PolychipDeviceProps, struct_size);
#define COBALT_PUT(field, value)                                        \
    do {                                                                \
        if (COBALT_HAS_FIELD(size, PolychipDeviceProps, field)) {       \
            out_props->field = (value);                                 \
            written = COBALT_FIELD_END(PolychipDeviceProps, field);     \
        }                                                               \
    } while (0)
    if (COBALT_HAS_FIELD(size, PolychipDeviceProps, name)) {
        memset(out_props->name, 0, sizeof out_props->name);
        snprintf(out_props->name, sizeof out_props->name, "Cobalt C1");
        written = COBALT_FIELD_END(PolychipDeviceProps, name);
    }
    COBALT_PUT(memory_bytes, cobalt_memory_capacity());
    /* Not host-visible (bytes are stored encoded) and not RDMA-exportable. */
    COBALT_PUT(memory_flags, 0u);
    COBALT_PUT(compute_units, 1u);
    /* Above what its plain C loops reach on one core (a matmul 6.2
       GFLOP/s, a transformer block 3.6 on the project's machine): a peak
       is a ceiling, and 2e9, declared before, made measured profiles look
       faster than the chip. */
    COBALT_PUT(peak_flops_f32, 8e9);
    COBALT_PUT(peak_flops_bf16, 8e9);
    COBALT_PUT(peak_flops_f16, 8e9);
    COBALT_PUT(memory_bandwidth, 5e9);
    COBALT_PUT(link_bandwidth, 2e9);
#undef COBALT_PUT
    out_props->struct_size = written;
    return NULL;
}

/* ---- tables -------------------------------------------------------------- */

static const PolychipOpTable g_ops = {
    .struct_size = sizeof(PolychipOpTable),
    .fill = cobalt_op_fill,
    .copy = cobalt_op_copy,
    .cast = cobalt_op_cast,
    .add = cobalt_op_add,
    .sub = cobalt_op_sub,
    .mul = cobalt_op_mul,
    .div = cobalt_op_div,
    .matmul = cobalt_op_matmul,
    .softmax = cobalt_op_softmax,
    /* ABI 1.1 */
    .neg = cobalt_op_neg,
    .exp = cobalt_op_exp,
    .log = cobalt_op_log,
    .sqrt = cobalt_op_sqrt,
    .rsqrt = cobalt_op_rsqrt,
    .tanh = cobalt_op_tanh,
    .pow_scalar = cobalt_op_pow_scalar,
    .relu = cobalt_op_relu,
    .relu_backward = cobalt_op_relu_backward,
    .silu = cobalt_op_silu,
    .silu_backward = cobalt_op_silu_backward,
    .gelu = cobalt_op_gelu,
    .gelu_backward = cobalt_op_gelu_backward,
    .swiglu = cobalt_op_swiglu,
    .swiglu_backward = cobalt_op_swiglu_backward,
    .sum = cobalt_op_sum,
    .mean = cobalt_op_mean,
    .max = cobalt_op_max,
    .argmax = cobalt_op_argmax,
    .sum_squares = cobalt_op_sum_squares,
    .linear = cobalt_op_linear,
    .softmax_backward = cobalt_op_softmax_backward,
    .log_softmax = cobalt_op_log_softmax,
    .log_softmax_backward = cobalt_op_log_softmax_backward,
    .rms_norm = cobalt_op_rms_norm,
    .rms_norm_backward = cobalt_op_rms_norm_backward,
    .layer_norm = cobalt_op_layer_norm,
    .layer_norm_backward = cobalt_op_layer_norm_backward,
    .rope = cobalt_op_rope,
    .rope_backward = cobalt_op_rope_backward,
    .attention = cobalt_op_attention,
    .attention_backward = cobalt_op_attention_backward,
    .embedding = cobalt_op_embedding,
    .embedding_backward = cobalt_op_embedding_backward,
    .cross_entropy = cobalt_op_cross_entropy,
    .cross_entropy_backward = cobalt_op_cross_entropy_backward,
    .adamw = cobalt_op_adamw,
    .scale = cobalt_op_scale,
    .gelu_erf = cobalt_op_gelu_erf,
    .gelu_erf_backward = cobalt_op_gelu_erf_backward,
    .sigmoid = cobalt_op_sigmoid,
    .sigmoid_backward = cobalt_op_sigmoid_backward,
    .tanh_backward = cobalt_op_tanh_backward,
    .sin = cobalt_op_sin,
    .cos = cobalt_op_cos,
    .select = cobalt_op_select,
    .masked_fill = cobalt_op_masked_fill,
    .convert = cobalt_op_convert,
    .arange = cobalt_op_arange,
    .eq = cobalt_op_eq,
    .ne = cobalt_op_ne,
    .lt = cobalt_op_lt,
    .le = cobalt_op_le,
    .gt = cobalt_op_gt,
    .ge = cobalt_op_ge,
    .gather = cobalt_op_gather,
    .scatter_add = cobalt_op_scatter_add,
    .cumsum = cobalt_op_cumsum,
    .any = cobalt_op_any,
    .all = cobalt_op_all,
    .bitwise_and = cobalt_op_bitwise_and,
    .bitwise_or = cobalt_op_bitwise_or,
    .bitwise_xor = cobalt_op_bitwise_xor,
};

static const PolychipPluginApi g_plugin = {
    .struct_size = sizeof(PolychipPluginApi),
    .abi_major = POLYCHIP_ABI_MAJOR,
    .abi_minor = POLYCHIP_ABI_MINOR,
    .vendor = "Cobalt",
    .plugin_version = "1.1.0",
    .device_count = cobalt_device_count,
    .device_props = cobalt_device_props,
    .mem_alloc = cobalt_mem_alloc,
    .mem_free = cobalt_mem_free,
    .stream_create = cobalt_stream_create,
    .stream_destroy = cobalt_stream_destroy,
    .stream_synchronize = cobalt_stream_synchronize,
    .event_create = cobalt_event_create,
    .event_destroy = cobalt_event_destroy,
    .event_record = cobalt_event_record,
    .stream_wait_event = cobalt_stream_wait_event,
    .event_synchronize = cobalt_event_synchronize,
    .memcpy_h2d = cobalt_memcpy_h2d,
    .memcpy_d2h = cobalt_memcpy_d2h,
    .memcpy_d2d = cobalt_memcpy_d2d,
    .ops = &g_ops,
};

/* ---- the entry symbol ---------------------------------------------------- */

/*
 * On failure we must return an error made with host->error_new. When `host`
 * is NULL, or its table is too small to hold error_new, or error_new is NULL,
 * no error object can be made: we then return NULL and leave *out_plugin
 * untouched. A host therefore sets *out_plugin to NULL before the call and
 * treats "NULL error, *out_plugin still NULL" as a failed load.
 *
 * The contract says init runs once per process from one thread; a repeated
 * call succeeds again, adopting the newer host table but keeping the
 * configuration (and the memory) of the first.
 */
POLYCHIP_EXPORT PolychipError *polychip_plugin_init_v1(const PolychipHostApi *host,
                                                       const PolychipPluginApi **out_plugin) {
    if (host == NULL || !COBALT_HAS_FIELD(host->struct_size, PolychipHostApi, error_new) ||
        host->error_new == NULL) {
        return NULL;
    }
    if (host->abi_major != POLYCHIP_ABI_MAJOR) {
        return host_error(host, POLYCHIP_ERROR_VERSION_MISMATCH,
                          "cobalt: the host speaks plugin ABI %u.%u but this plugin was built for "
                          "ABI %u.%u; the majors must be equal",
                          (unsigned)host->abi_major, (unsigned)host->abi_minor,
                          (unsigned)POLYCHIP_ABI_MAJOR, (unsigned)POLYCHIP_ABI_MINOR);
    }
    if (!COBALT_HAS_FIELD(host->struct_size, PolychipHostApi, error_destroy)) {
        return host_error(host, POLYCHIP_ERROR_INVALID_ARGUMENT,
                          "cobalt: the host table is %zu bytes, but ABI 1.0 defines it through "
                          "error_destroy (%zu bytes)",
                          host->struct_size, COBALT_FIELD_END(PolychipHostApi, error_destroy));
    }
    if (out_plugin == NULL) {
        return host_error(host, POLYCHIP_ERROR_INVALID_ARGUMENT,
                          "cobalt: polychip_plugin_init_v1: out_plugin is NULL");
    }
    g_host = host;
    if (!g_initialized) {
        read_configuration();
        g_initialized = 1;
    }
    *out_plugin = &g_plugin;
    return NULL;
}
