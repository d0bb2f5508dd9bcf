/*
 * Tensor descriptors for the Cobalt operators: checking a PolychipTensor
 * against the contract, broadcasting, and moving elements between device
 * memory (encoded, strided) and plain contiguous host scratch buffers.
 *
 * Every operator works the same way: check its descriptors into cobalt_views,
 * gather each input into a row-major plain buffer (decoding and following
 * strides, including zero and negative ones), compute on plain numbers, then
 * scatter the result into the output (encoding). Because all inputs are read
 * before any output is written, an output that aliases an input is harmless.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

const char *cobalt_shape_str(char *buf, int ndim, const int64_t *shape) {
    size_t used = 0;
    buf[used++] = '[';
    for (int k = 0; k < ndim; k++) {
        int n = snprintf(buf + used, COBALT_SHAPE_STR_BYTES - used, "%s%" PRId64, k ? ", " : "",
                         shape[k]);
        if (n < 0 || (size_t)n >= COBALT_SHAPE_STR_BYTES - used - 1) {
            break;
        }
        used += (size_t)n;
    }
    buf[used++] = ']';
    buf[used] = '\0';
    return buf;
}

/* a * b for a >= 0, b >= 0; 0 on overflow past INT64_MAX. */
static int mul_nonneg(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a) {
        return 0;
    }
    *out = a * b;
    return 1;
}

/* a * b for any signs with |a|, |b| < 2^63; 0 on overflow. */
static int mul_signed(int64_t a, int64_t b, int64_t *out) {
    int64_t ua = a < 0 ? -a : a;
    int64_t ub = b < 0 ? -b : b;
    int64_t product;
    if (a == INT64_MIN || b == INT64_MIN || !mul_nonneg(ua, ub, &product)) {
        return 0;
    }
    *out = (a < 0) != (b < 0) ? -product : product;
    return 1;
}

static int add_signed(int64_t a, int64_t b, int64_t *out) {
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) {
        return 0;
    }
    *out = a + b;
    return 1;
}

PolychipError *cobalt_view_init(cobalt_view *out, const PolychipTensor *tensor, uint32_t device,
                                const char *op, const char *name) {
    cobalt_view v;
    memset(&v, 0, sizeof v);
    if (tensor->device.device_type != POLYCHIP_DEVICE_TYPE_EXT) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %s has device type %d; cobalt tensors have device type %d "
                            "(POLYCHIP_DEVICE_TYPE_EXT)",
                            op, name, (int)tensor->device.device_type, POLYCHIP_DEVICE_TYPE_EXT);
    }
    if ((int64_t)tensor->device.device_id != (int64_t)device) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %s is on device %d but the operator runs on device %u", op,
                            name, (int)tensor->device.device_id, (unsigned)device);
    }
    if (tensor->ndim < 0) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: %s: %s has ndim %d, below 0", op,
                            name, (int)tensor->ndim);
    }
    if (tensor->ndim > COBALT_MAX_DIMS) {
        return cobalt_error(POLYCHIP_ERROR_UNIMPLEMENTED,
                            "cobalt: %s: %s has %d dims; cobalt supports at most %d", op, name,
                            (int)tensor->ndim, COBALT_MAX_DIMS);
    }
    v.ndim = tensor->ndim;
    if (v.ndim > 0 && tensor->shape == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %s has %d dims but its shape is NULL", op, name, v.ndim);
    }
    if (!cobalt_dtype_from_abi(tensor->dtype, &v.dtype)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: %s has dtype (code %u, bits %u, lanes %u), which is not one "
                            "of ABI v1's (f32, f16, bf16, f64, i32, i64, u8, bool with 1 lane)",
                            op, name, (unsigned)tensor->dtype.code, (unsigned)tensor->dtype.bits,
                            (unsigned)tensor->dtype.lanes);
    }
    v.elem_size = cobalt_dtype_size(v.dtype);
    v.numel = 1;
    for (int k = 0; k < v.ndim; k++) {
        v.shape[k] = tensor->shape[k];
        if (v.shape[k] < 0) {
            char s[COBALT_SHAPE_STR_BYTES];
            return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                "cobalt: %s: %s has shape %s; extents must be >= 0", op, name,
                                cobalt_shape_str(s, v.ndim, tensor->shape));
        }
    }
    int overflow = 0;
    for (int k = 0; k < v.ndim; k++) {
        overflow |= !mul_nonneg(v.numel, v.shape[k], &v.numel);
    }
    for (int k = 0; k < v.ndim; k++) {
        if (v.shape[k] == 0) {
            v.numel = 0;
            overflow = 0;
        }
    }
    if (overflow) {
        char s[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %s has shape %s, more than 2^63 elements", op, name,
                            cobalt_shape_str(s, v.ndim, v.shape));
    }
    if (tensor->strides != NULL) {
        for (int k = 0; k < v.ndim; k++) {
            v.strides[k] = tensor->strides[k];
        }
    } else {
        int64_t stride = 1;
        for (int k = v.ndim - 1; k >= 0; k--) {
            v.strides[k] = stride;
            stride *= v.shape[k] > 0 ? v.shape[k] : 1; /* cannot overflow: numel fits */
        }
    }
    if (v.numel == 0) {
        *out = v; /* nothing is read or written: data may be anything */
        return NULL;
    }
    if (tensor->data == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: %s: %s has NULL data", op, name);
    }
    /* The lowest and highest element offsets, in elements, then in bytes. */
    int64_t lo = 0;
    int64_t hi = 0;
    int ok = 1;
    for (int k = 0; k < v.ndim && ok; k++) {
        int64_t reach;
        ok = mul_signed(v.shape[k] - 1, v.strides[k], &reach) &&
             add_signed(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
    }
    int64_t lo_bytes = 0;
    int64_t end_bytes = 0;
    ok = ok && mul_signed(lo, (int64_t)v.elem_size, &lo_bytes) &&
         mul_signed(hi + 1, (int64_t)v.elem_size, &end_bytes);
    uint64_t first = (uint64_t)(uintptr_t)tensor->data + tensor->byte_offset;
    ok = ok && first >= tensor->byte_offset && (lo_bytes >= 0 || first >= (uint64_t)-lo_bytes);
    if (!ok) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %s's strides and byte_offset reach outside the address space",
                            op, name);
    }
    uint64_t start = first + (uint64_t)lo_bytes; /* wraps correctly for lo_bytes < 0 */
    uint64_t length = (uint64_t)end_bytes - (uint64_t)lo_bytes;
    char what[96];
    snprintf(what, sizeof what, "%s: %s", op, name);
    uint64_t start_offset;
    PolychipError *error =
        cobalt_check_range(device, what, (uintptr_t)start, length, &v.arena, &start_offset);
    if (error != NULL) {
        return error;
    }
    v.origin = (int64_t)start_offset - lo_bytes;
    *out = v;
    return NULL;
}

int cobalt_same_shape(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b) {
    if (ndim_a != ndim_b) {
        return 0;
    }
    for (int k = 0; k < ndim_a; k++) {
        if (a[k] != b[k]) {
            return 0;
        }
    }
    return 1;
}

int cobalt_broadcast_shape(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b,
                           int *out_ndim, int64_t *out_shape) {
    int ndim = ndim_a > ndim_b ? ndim_a : ndim_b;
    for (int k = 0; k < ndim; k++) {
        int ka = k - (ndim - ndim_a);
        int kb = k - (ndim - ndim_b);
        int64_t ea = ka >= 0 ? a[ka] : 1;
        int64_t eb = kb >= 0 ? b[kb] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            return 0;
        }
        out_shape[k] = ea == 1 ? eb : ea;
    }
    *out_ndim = ndim;
    return 1;
}

int cobalt_view_broadcast(const cobalt_view *in, int ndim, const int64_t *shape, cobalt_view *out) {
    if (in->ndim > ndim) {
        return 0;
    }
    cobalt_view v = *in;
    v.ndim = ndim;
    v.numel = 1;
    for (int k = 0; k < ndim; k++) {
        int src = k - (ndim - in->ndim);
        int64_t extent = src >= 0 ? in->shape[src] : 1;
        if (extent != shape[k] && extent != 1) {
            return 0;
        }
        v.shape[k] = shape[k];
        v.strides[k] = extent == shape[k] && src >= 0 ? in->strides[src] : 0;
        if (!mul_nonneg(v.numel, shape[k], &v.numel)) {
            return 0; /* more than 2^63 elements */
        }
    }
    *out = v;
    return 1;
}

/*
 * Moves every element between the device view and a plain row-major buffer:
 * from the device into `into` when it is not NULL, else from `from` to the
 * device.
 */
static void transfer(const cobalt_view *view, uint8_t *into, const uint8_t *from) {
    if (view->numel == 0) {
        return;
    }
    size_t size = view->elem_size;
    int nd = view->ndim;
    int64_t inner = nd > 0 ? view->shape[nd - 1] : 1;
    int64_t inner_stride = nd > 0 ? view->strides[nd - 1] : 0;
    /* A contiguous innermost dimension moves as one run; otherwise one
     * element at a time. */
    int64_t runs = inner_stride == 1 ? 1 : inner;
    size_t run_bytes = inner_stride == 1 ? (size_t)inner * size : size;
    int64_t index[COBALT_MAX_DIMS] = {0};
    int64_t offset = 0; /* in elements, from the origin */
    size_t pos = 0;     /* in bytes, into the plain buffer */
    for (;;) {
        for (int64_t j = 0; j < runs; j++) {
            uint64_t at = (uint64_t)(view->origin + (offset + j * inner_stride) * (int64_t)size);
            if (into != NULL) {
                cobalt_xcode(into + pos, view->arena + at, at, run_bytes);
            } else {
                cobalt_xcode(view->arena + at, from + pos, at, run_bytes);
            }
            pos += run_bytes;
        }
        /* Advance the outer dimensions like an odometer. */
        int k = nd - 2;
        for (; k >= 0; k--) {
            index[k]++;
            offset += view->strides[k];
            if (index[k] < view->shape[k]) {
                break;
            }
            offset -= view->strides[k] * view->shape[k];
            index[k] = 0;
        }
        if (k < 0) {
            return;
        }
    }
}

void cobalt_gather(const cobalt_view *view, void *plain) { transfer(view, plain, NULL); }

void cobalt_scatter(const cobalt_view *view, const void *plain) { transfer(view, NULL, plain); }

PolychipError *cobalt_load_f32(const char *op, const cobalt_view *view, float **out) {
    PolychipError *error = NULL;
    float *values = cobalt_scratch(op, view->numel, sizeof *values, &error);
    uint8_t *raw = values == NULL ? NULL : cobalt_scratch(op, view->numel, view->elem_size, &error);
    if (raw == NULL) {
        cobalt_scratch_free(values);
        return error;
    }
    cobalt_gather(view, raw);
    for (int64_t i = 0; i < view->numel; i++) {
        values[i] = cobalt_read_f32(view->dtype, raw + (size_t)i * view->elem_size);
    }
    cobalt_scratch_free(raw);
    *out = values;
    return NULL;
}

PolychipError *cobalt_load_f64(const char *op, const cobalt_view *view, double **out) {
    PolychipError *error = NULL;
    double *values = cobalt_scratch(op, view->numel, sizeof *values, &error);
    uint8_t *raw = values == NULL ? NULL : cobalt_scratch(op, view->numel, view->elem_size, &error);
    if (raw == NULL) {
        cobalt_scratch_free(values);
        return error;
    }
    cobalt_gather(view, raw);
    for (int64_t i = 0; i < view->numel; i++) {
        values[i] = cobalt_read_f64(view->dtype, raw + (size_t)i * view->elem_size);
    }
    cobalt_scratch_free(raw);
    *out = values;
    return NULL;
}

PolychipError *cobalt_store_f32(const char *op, const cobalt_view *view, const float *values) {
    PolychipError *error = NULL;
    uint8_t *raw = cobalt_scratch(op, view->numel, view->elem_size, &error);
    if (raw == NULL) {
        return error;
    }
    for (int64_t i = 0; i < view->numel; i++) {
        cobalt_write_f32(view->dtype, raw + (size_t)i * view->elem_size, values[i]);
    }
    cobalt_scatter(view, raw);
    cobalt_scratch_free(raw);
    return NULL;
}

PolychipError *cobalt_store_f64(const char *op, const cobalt_view *view, const double *values) {
    PolychipError *error = NULL;
    uint8_t *raw = cobalt_scratch(op, view->numel, view->elem_size, &error);
    if (raw == NULL) {
        return error;
    }
    for (int64_t i = 0; i < view->numel; i++) {
        cobalt_write_f64(view->dtype, raw + (size_t)i * view->elem_size, values[i]);
    }
    cobalt_scatter(view, raw);
    cobalt_scratch_free(raw);
    return NULL;
}

PolychipError *cobalt_op_begin(const char *op, uint32_t device, const PolychipStream *stream,
                               const void *args, size_t needed, const char *last_field) {
    PolychipError *error = cobalt_check_device(device, op);
    if (error == NULL) {
        error = cobalt_check_stream(device, stream, op);
    }
    if (error != NULL) {
        return error;
    }
    if (args == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: %s: args is NULL", op);
    }
    size_t size;
    memcpy(&size, args, sizeof size); /* every args struct starts with struct_size */
    if (size < needed) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: args->struct_size is %zu bytes, too small to hold %s (the "
                            "first %zu bytes)",
                            op, size, last_field, needed);
    }
    return NULL;
}
