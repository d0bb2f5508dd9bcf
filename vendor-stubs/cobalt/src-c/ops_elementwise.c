/*
 * The Cobalt binary elementwise operators: add (a + alpha * b), sub
 * (a - alpha * b), mul (a * b) and div (a / b), with NumPy broadcasting of
 * a and b to out's shape, on one floating dtype.
 *
 * Every element is computed in double from the exact input values and rounded
 * once to out's dtype. For mul, div and add/sub with alpha == 1 this gives
 * bit for bit what computing in f32 and rounding once to f16/bf16 gives
 * (double has more than twice f32's precision plus two bits, so the extra
 * rounding is innocuous); with another alpha it is at least as accurate.
 * In place (out being exactly a or b) works: inputs are read first.
 */

#include <stdlib.h>

#include "cobalt.h"

typedef enum binary_kind { BINARY_ADD, BINARY_SUB, BINARY_MUL, BINARY_DIV } binary_kind;

static const char *const g_names[] = {"add", "sub", "mul", "div"};

static PolychipError *binary(binary_kind kind, uint32_t device, PolychipStream *stream,
                             const PolychipBinaryArgs *args) {
    const char *op = g_names[kind];
    int uses_alpha = kind == BINARY_ADD || kind == BINARY_SUB;
    size_t needed = uses_alpha ? COBALT_FIELD_END(PolychipBinaryArgs, alpha)
                               : COBALT_FIELD_END(PolychipBinaryArgs, out);
    PolychipError *error =
        cobalt_op_begin(op, device, stream, args, needed, uses_alpha ? "alpha" : "out");
    cobalt_view a;
    cobalt_view b;
    cobalt_view out;
    if (error == NULL) {
        error = cobalt_view_init(&a, &args->a, device, op, "a");
    }
    if (error == NULL) {
        error = cobalt_view_init(&b, &args->b, device, op, "b");
    }
    if (error == NULL) {
        error = cobalt_view_init(&out, &args->out, device, op, "out");
    }
    if (error != NULL) {
        return error;
    }
    int integer = (a.dtype == COBALT_I32 || a.dtype == COBALT_I64) && kind != BINARY_DIV;
    if (a.dtype != b.dtype || a.dtype != out.dtype || !(cobalt_dtype_is_float(a.dtype) || integer)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: a is %s, b is %s and out is %s; all three must have the "
                            "same floating dtype (f32, f16, bf16 or f64), or for add, sub and mul "
                            "(ABI 1.3) i32 or i64",
                            op, cobalt_dtype_name(a.dtype), cobalt_dtype_name(b.dtype),
                            cobalt_dtype_name(out.dtype));
    }
    char sa[COBALT_SHAPE_STR_BYTES];
    char sb[COBALT_SHAPE_STR_BYTES];
    char so[COBALT_SHAPE_STR_BYTES];
    int ndim;
    int64_t shape[COBALT_MAX_DIMS];
    if (!cobalt_broadcast_shape(a.ndim, a.shape, b.ndim, b.shape, &ndim, shape)) {
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: a has shape %s and b has shape %s, which do not broadcast "
                            "together",
                            op, cobalt_shape_str(sa, a.ndim, a.shape),
                            cobalt_shape_str(sb, b.ndim, b.shape));
    }
    if (!cobalt_same_shape(ndim, shape, out.ndim, out.shape)) {
        char sbc[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: a has shape %s and b has shape %s, which broadcast to %s, "
                            "but out has shape %s",
                            op, cobalt_shape_str(sa, a.ndim, a.shape),
                            cobalt_shape_str(sb, b.ndim, b.shape), cobalt_shape_str(sbc, ndim, shape),
                            cobalt_shape_str(so, out.ndim, out.shape));
    }
    if (out.numel == 0) {
        return NULL;
    }
    cobalt_view wide_a;
    cobalt_view wide_b;
    if (!cobalt_view_broadcast(&a, out.ndim, out.shape, &wide_a) ||
        !cobalt_view_broadcast(&b, out.ndim, out.shape, &wide_b)) {
        return cobalt_error(POLYCHIP_ERROR_INTERNAL, "cobalt: %s: broadcasting failed after its check",
                            op);
    }
    if (integer) {
        return cobalt_binary_int(op, kind == BINARY_ADD ? 1 : kind == BINARY_SUB ? -1 : 0,
                                 &wide_a, &wide_b, &out, uses_alpha ? args->alpha : 1.0);
    }
    double *x = NULL;
    double *y = NULL;
    error = cobalt_load_f64(op, &wide_a, &x);
    if (error == NULL) {
        error = cobalt_load_f64(op, &wide_b, &y);
    }
    if (error == NULL) {
        double alpha = uses_alpha ? args->alpha : 1.0;
        for (int64_t i = 0; i < out.numel; i++) {
            switch (kind) {
            case BINARY_ADD:
                x[i] = x[i] + alpha * y[i];
                break;
            case BINARY_SUB:
                x[i] = x[i] - alpha * y[i];
                break;
            case BINARY_MUL:
                x[i] = x[i] * y[i];
                break;
            case BINARY_DIV:
                x[i] = x[i] / y[i];
                break;
            }
        }
        error = cobalt_store_f64(op, &out, x);
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(y);
    return error;
}

PolychipError *cobalt_op_add(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args) {
    return binary(BINARY_ADD, device, stream, args);
}

PolychipError *cobalt_op_sub(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args) {
    return binary(BINARY_SUB, device, stream, args);
}

PolychipError *cobalt_op_mul(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args) {
    return binary(BINARY_MUL, device, stream, args);
}

PolychipError *cobalt_op_div(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args) {
    return binary(BINARY_DIV, device, stream, args);
}
