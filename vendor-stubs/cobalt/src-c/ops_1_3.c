/*
 * The Cobalt operators of ABI 1.3: sin and cos (in double, whose libm
 * reduces every finite argument exactly, rounded once), select (cond ? a :
 * b, PyTorch's where) and masked_fill on any dtype, and the comparisons eq,
 * ne, lt, le, gt, ge.
 *
 * select and masked_fill move element bits: every operand is gathered
 * (decoded) into plain buffers over out's shape (broadcast operands with
 * zero strides), the chosen bytes are copied and out is scattered
 * (encoded); inputs are read before out is written, so out may be exactly
 * one of the inputs. masked_fill converts its value with the conversion
 * fill uses (cobalt_write_f64). Comparisons read floats exactly as double
 * and integers as int64_t, and write bools. convert takes any dtype to any
 * other: floats through cobalt_write_f64 (one rounding, saturating integer
 * conversions, NaN to 0), integers exactly or wrapped to a narrower
 * integer's low bits (as PyTorch narrows), and an int64_t
 * to f16 or bf16 through a double rounded to odd (one rounding overall).
 * arange computes start + i * step in double and converts it as fill does.
 */

#include <math.h>
#include <string.h>

#include "cobalt.h"

static void f_sin(const double *in, double *out, double p) {
    (void)p;
    out[0] = sin(in[0]);
}

static void f_cos(const double *in, double *out, double p) {
    (void)p;
    out[0] = cos(in[0]);
}

PolychipError *cobalt_op_sin(uint32_t device, PolychipStream *stream,
                             const PolychipUnaryArgs *args) {
    return cobalt_unary("sin", device, stream, args, f_sin);
}

PolychipError *cobalt_op_cos(uint32_t device, PolychipStream *stream,
                             const PolychipUnaryArgs *args) {
    return cobalt_unary("cos", device, stream, args, f_cos);
}

/* SHAPE_MISMATCH unless `v` broadcasts to out's shape; on success `wide`
 * is `v` over out's shape. */
static PolychipError *widen(const char *op, const char *name, const cobalt_view *v,
                            const cobalt_view *out, cobalt_view *wide) {
    int ndim;
    int64_t shape[COBALT_MAX_DIMS];
    if (cobalt_broadcast_shape(v->ndim, v->shape, out->ndim, out->shape, &ndim, shape) &&
        cobalt_same_shape(ndim, shape, out->ndim, out->shape) &&
        cobalt_view_broadcast(v, out->ndim, out->shape, wide)) {
        return NULL;
    }
    char sv[COBALT_SHAPE_STR_BYTES];
    char so[COBALT_SHAPE_STR_BYTES];
    return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                        "cobalt: %s: %s has shape %s, which does not broadcast to out's shape %s",
                        op, name, cobalt_shape_str(sv, v->ndim, v->shape),
                        cobalt_shape_str(so, out->ndim, out->shape));
}

/* Gathers `v` over out's shape into a new plain buffer (cobalt.h). */
PolychipError *cobalt_gather_wide(const char *op, const char *name, const cobalt_view *v,
                                  const cobalt_view *out, uint8_t **plain) {
    cobalt_view wide;
    PolychipError *error = widen(op, name, v, out, &wide);
    if (error != NULL) {
        return error;
    }
    *plain = cobalt_scratch(op, out->numel, v->elem_size, &error);
    if (*plain == NULL) {
        return error;
    }
    cobalt_gather(&wide, *plain);
    return NULL;
}

PolychipError *cobalt_op_select(uint32_t device, PolychipStream *stream,
                                const PolychipSelectArgs *args) {
    const char *op = "select";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipSelectArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view cond, a, b, out;
    const cobalt_arg list[] = {{&cond, &args->cond, "cond"},
                               {&a, &args->a, "a"},
                               {&b, &args->b, "b"},
                               {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 4);
    if (error != NULL) {
        return error;
    }
    if (cond.dtype != COBALT_BOOL || a.dtype != out.dtype || b.dtype != out.dtype) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: select: cond is %s, a is %s, b is %s and out is %s; cond must "
                            "be bool and a, b and out of one dtype",
                            cobalt_dtype_name(cond.dtype), cobalt_dtype_name(a.dtype),
                            cobalt_dtype_name(b.dtype), cobalt_dtype_name(out.dtype));
    }
    error = cobalt_need_writable(op, "out", &out);
    if (error != NULL || out.numel == 0) {
        return error;
    }
    uint8_t *c = NULL, *x = NULL, *y = NULL;
    error = cobalt_gather_wide(op, "cond", &cond, &out, &c);
    if (error == NULL) {
        error = cobalt_gather_wide(op, "a", &a, &out, &x);
    }
    if (error == NULL) {
        error = cobalt_gather_wide(op, "b", &b, &out, &y);
    }
    if (error == NULL) {
        size_t size = out.elem_size;
        for (int64_t i = 0; i < out.numel; i++) {
            if (c[i] == 0) {
                memcpy(x + (size_t)i * size, y + (size_t)i * size, size);
            }
        }
        cobalt_scatter(&out, x);
    }
    cobalt_scratch_free(c);
    cobalt_scratch_free(x);
    cobalt_scratch_free(y);
    return error;
}

PolychipError *cobalt_op_masked_fill(uint32_t device, PolychipStream *stream,
                                     const PolychipMaskedFillArgs *args) {
    const char *op = "masked_fill";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipMaskedFillArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, mask, out;
    const cobalt_arg list[] = {
        {&input, &args->input, "input"}, {&mask, &args->mask, "mask"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 3);
    if (error != NULL) {
        return error;
    }
    if (mask.dtype != COBALT_BOOL || input.dtype != out.dtype) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: masked_fill: input is %s, mask is %s and out is %s; mask "
                            "must be bool and out input's dtype",
                            cobalt_dtype_name(input.dtype), cobalt_dtype_name(mask.dtype),
                            cobalt_dtype_name(out.dtype));
    }
    if (!cobalt_same_shape(input.ndim, input.shape, out.ndim, out.shape)) {
        char si[COBALT_SHAPE_STR_BYTES];
        char so[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: masked_fill: out has shape %s but input has shape %s",
                            cobalt_shape_str(so, out.ndim, out.shape),
                            cobalt_shape_str(si, input.ndim, input.shape));
    }
    error = cobalt_need_writable(op, "out", &out);
    if (error != NULL || out.numel == 0) {
        return error;
    }
    uint8_t fill[8];
    cobalt_write_f64(out.dtype, fill, args->value);
    uint8_t *m = NULL, *x = NULL;
    error = cobalt_gather_wide(op, "mask", &mask, &out, &m);
    if (error == NULL) {
        error = cobalt_gather_wide(op, "input", &input, &out, &x);
    }
    if (error == NULL) {
        size_t size = out.elem_size;
        for (int64_t i = 0; i < out.numel; i++) {
            if (m[i] != 0) {
                memcpy(x + (size_t)i * size, fill, size);
            }
        }
        cobalt_scatter(&out, x);
    }
    cobalt_scratch_free(m);
    cobalt_scratch_free(x);
    return error;
}

typedef enum compare_kind { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE } compare_kind;

/* -1, 0 or 1 as x is below, equal to or above y; 2 when unordered (NaN). */
static int order_f64(double x, double y) {
    if (x < y) return -1;
    if (x > y) return 1;
    if (x == y) return 0;
    return 2;
}

static int order_i64(int64_t x, int64_t y) { return (x > y) - (x < y); }

static int decide(compare_kind kind, int order) {
    switch (kind) {
    case CMP_EQ: return order == 0;
    case CMP_NE: return order != 0;
    case CMP_LT: return order == -1;
    case CMP_LE: return order == -1 || order == 0;
    case CMP_GT: return order == 1;
    case CMP_GE: return order == 1 || order == 0;
    }
    return 0;
}

int64_t cobalt_read_int(cobalt_dtype dtype, const uint8_t *p) {
    switch (dtype) {
    case COBALT_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case COBALT_I64: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    default:
        return p[0];
    }
}

static const char *const g_compare_names[] = {"eq", "ne", "lt", "le", "gt", "ge"};

static PolychipError *compare(compare_kind kind, uint32_t device, PolychipStream *stream,
                              const PolychipCompareArgs *args) {
    const char *op = g_compare_names[kind];
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipCompareArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view a, b, out;
    const cobalt_arg list[] = {{&a, &args->a, "a"}, {&b, &args->b, "b"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 3);
    if (error != NULL) {
        return error;
    }
    if (a.dtype != b.dtype || a.dtype == COBALT_BOOL || out.dtype != COBALT_BOOL) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: a is %s, b is %s and out is %s; a and b must have one "
                            "dtype other than bool, and out must be bool",
                            op, cobalt_dtype_name(a.dtype), cobalt_dtype_name(b.dtype),
                            cobalt_dtype_name(out.dtype));
    }
    error = cobalt_need_writable(op, "out", &out);
    if (error != NULL || out.numel == 0) {
        return error;
    }
    uint8_t *x = NULL, *y = NULL, *r = NULL;
    error = cobalt_gather_wide(op, "a", &a, &out, &x);
    if (error == NULL) {
        error = cobalt_gather_wide(op, "b", &b, &out, &y);
    }
    if (error == NULL) {
        r = cobalt_scratch(op, out.numel, 1, &error);
    }
    if (error == NULL) {
        size_t size = a.elem_size;
        int is_float = cobalt_dtype_is_float(a.dtype);
        for (int64_t i = 0; i < out.numel; i++) {
            const uint8_t *p = x + (size_t)i * size;
            const uint8_t *q = y + (size_t)i * size;
            int order = is_float ? order_f64(cobalt_read_f64(a.dtype, p), cobalt_read_f64(a.dtype, q))
                                 : order_i64(cobalt_read_int(a.dtype, p), cobalt_read_int(a.dtype, q));
            r[i] = (uint8_t)decide(kind, order);
        }
        cobalt_scatter(&out, r);
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(y);
    cobalt_scratch_free(r);
    return error;
}

PolychipError *cobalt_op_eq(uint32_t device, PolychipStream *stream,
                            const PolychipCompareArgs *args) {
    return compare(CMP_EQ, device, stream, args);
}

PolychipError *cobalt_op_ne(uint32_t device, PolychipStream *stream,
                            const PolychipCompareArgs *args) {
    return compare(CMP_NE, device, stream, args);
}

PolychipError *cobalt_op_lt(uint32_t device, PolychipStream *stream,
                            const PolychipCompareArgs *args) {
    return compare(CMP_LT, device, stream, args);
}

PolychipError *cobalt_op_le(uint32_t device, PolychipStream *stream,
                            const PolychipCompareArgs *args) {
    return compare(CMP_LE, device, stream, args);
}

PolychipError *cobalt_op_gt(uint32_t device, PolychipStream *stream,
                            const PolychipCompareArgs *args) {
    return compare(CMP_GT, device, stream, args);
}

PolychipError *cobalt_op_ge(uint32_t device, PolychipStream *stream,
                            const PolychipCompareArgs *args) {
    return compare(CMP_GE, device, stream, args);
}

/* The double nearest x rounded to odd (toward zero, last bit set when
 * inexact): rounding that to nearest even in f16 or bf16 rounds x once. */
static double i64_to_double_odd(int64_t x) {
    double r = (double)x;
    int toward_zero_needed;
    if (r >= 9223372036854775808.0) {
        toward_zero_needed = 1; /* x < 2^63 = r */
    } else {
        int64_t back = (int64_t)r;
        if (back == x) {
            return r;
        }
        toward_zero_needed = (x > 0) ? back > x : back < x;
    }
    uint64_t bits;
    memcpy(&bits, &r, sizeof bits);
    if (toward_zero_needed) {
        bits -= 1;
    }
    bits |= 1;
    memcpy(&r, &bits, sizeof r);
    return r;
}

static void convert_one(cobalt_dtype from, const uint8_t *p, cobalt_dtype to, uint8_t *q) {
    if (cobalt_dtype_is_float(from)) {
        cobalt_write_f64(to, q, cobalt_read_f64(from, p));
        return;
    }
    int64_t x = cobalt_read_int(from, p);
    switch (to) {
    case COBALT_I64:
        memcpy(q, &x, sizeof x);
        return;
    case COBALT_I32: {
        /* The low 32 bits (two's complement), as PyTorch narrows: through
         * an unsigned type, where C defines the wrap. */
        uint32_t v = (uint32_t)(uint64_t)x;
        memcpy(q, &v, sizeof v);
        return;
    }
    case COBALT_U8:
        q[0] = (uint8_t)(uint64_t)x;
        return;
    case COBALT_BOOL:
        q[0] = x != 0;
        return;
    case COBALT_F32: {
        float f = (float)x; /* one rounding, to nearest even */
        memcpy(q, &f, sizeof f);
        return;
    }
    case COBALT_F64:
        cobalt_write_f64(to, q, (double)x);
        return;
    default:
        cobalt_write_f64(to, q, i64_to_double_odd(x));
        return;
    }
}

PolychipError *cobalt_op_convert(uint32_t device, PolychipStream *stream,
                                 const PolychipConvertArgs *args) {
    const char *op = "convert";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipConvertArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view src, dst;
    const cobalt_arg list[] = {{&src, &args->src, "src"}, {&dst, &args->dst, "dst"}};
    error = cobalt_views(op, device, list, 2);
    if (error != NULL) {
        return error;
    }
    if (!cobalt_same_shape(src.ndim, src.shape, dst.ndim, dst.shape)) {
        char ss[COBALT_SHAPE_STR_BYTES];
        char sd[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: convert: dst has shape %s but src has shape %s",
                            cobalt_shape_str(sd, dst.ndim, dst.shape),
                            cobalt_shape_str(ss, src.ndim, src.shape));
    }
    error = cobalt_need_writable(op, "dst", &dst);
    if (error != NULL || dst.numel == 0) {
        return error;
    }
    uint8_t *x = cobalt_scratch(op, src.numel, src.elem_size, &error);
    uint8_t *y = x == NULL ? NULL : cobalt_scratch(op, dst.numel, dst.elem_size, &error);
    if (y != NULL) {
        cobalt_gather(&src, x);
        for (int64_t i = 0; i < dst.numel; i++) {
            convert_one(src.dtype, x + (size_t)i * src.elem_size, dst.dtype,
                        y + (size_t)i * dst.elem_size);
        }
        cobalt_scatter(&dst, y);
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(y);
    return error;
}

PolychipError *cobalt_op_arange(uint32_t device, PolychipStream *stream,
                                const PolychipArangeArgs *args) {
    const char *op = "arange";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipArangeArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view out;
    const cobalt_arg list[] = {{&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 1);
    if (error != NULL) {
        return error;
    }
    if (out.ndim != 1 || out.dtype == COBALT_BOOL) {
        char so[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: arange: out is %s %s; it must be 1-D and not bool",
                            cobalt_dtype_name(out.dtype), cobalt_shape_str(so, out.ndim, out.shape));
    }
    error = cobalt_need_writable(op, "out", &out);
    if (error != NULL || out.numel == 0) {
        return error;
    }
    uint8_t *y = cobalt_scratch(op, out.numel, out.elem_size, &error);
    if (y == NULL) {
        return error;
    }
    for (int64_t i = 0; i < out.numel; i++) {
        /* A product and a sum in double, each rounded (no contraction:
         * -std=c11 turns it off), then one conversion. */
        volatile double product = (double)i * args->step;
        cobalt_write_f64(out.dtype, y + (size_t)i * out.elem_size, args->start + product);
    }
    cobalt_scatter(&out, y);
    cobalt_scratch_free(y);
    return NULL;
}

PolychipError *cobalt_binary_int(const char *op, int sign, const cobalt_view *a,
                                 const cobalt_view *b, const cobalt_view *out, double alpha) {
    PolychipError *error = NULL;
    uint8_t *x = cobalt_scratch(op, out->numel, out->elem_size, &error);
    uint8_t *y = x == NULL ? NULL : cobalt_scratch(op, out->numel, out->elem_size, &error);
    if (y != NULL) {
        cobalt_gather(a, x);
        cobalt_gather(b, y);
        /* Unsigned arithmetic wraps without undefined behaviour; alpha is an
         * integer of at most 2^53 (the host checks it), exact as int64_t. */
        uint64_t al = (uint64_t)(int64_t)alpha;
        size_t size = out->elem_size;
        for (int64_t i = 0; i < out->numel; i++) {
            uint64_t p = (uint64_t)cobalt_read_int(out->dtype, x + (size_t)i * size);
            uint64_t q = (uint64_t)cobalt_read_int(out->dtype, y + (size_t)i * size);
            uint64_t r = sign > 0 ? p + al * q : sign < 0 ? p - al * q : p * q;
            if (out->dtype == COBALT_I32) {
                uint32_t v = (uint32_t)r;
                memcpy(x + (size_t)i * size, &v, sizeof v);
            } else {
                memcpy(x + (size_t)i * size, &r, sizeof r);
            }
        }
        cobalt_scatter(out, x);
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(y);
    return error;
}
