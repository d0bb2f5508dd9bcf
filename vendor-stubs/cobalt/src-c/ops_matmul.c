/*
 * The Cobalt batched matrix product: out = alpha * op(a) @ op(b) + beta * out.
 *
 * op(a) is [..., M, K] and op(b) is [..., K, N] after the optional transposes
 * of their last two dimensions; their batch dimensions broadcast (NumPy
 * rules) to out's, which must be exactly the broadcast batch shape followed by
 * [M, N]. Both operands are gathered contiguous with the batch broadcast
 * already applied, then multiplied with a plain i-k-j loop. Products
 * accumulate in f32 for f32, f16 and bf16 and in f64 for f64; alpha and beta
 * are applied in double and each output is rounded once. When beta == 0, out
 * is never read, so NaN in it does not propagate. K may be 0 (the product is
 * then all zeros).
 */

#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

/* acc[M x N] = a[M x K] @ b[K x N], accumulating in float. */
static void product_f32(const float *a, const float *b, float *acc, int64_t m, int64_t k, int64_t n) {
    for (int64_t i = 0; i < m; i++) {
        float *row = acc + i * n;
        for (int64_t j = 0; j < n; j++) {
            row[j] = 0.0f;
        }
        for (int64_t p = 0; p < k; p++) {
            float aip = a[i * k + p];
            const float *b_row = b + p * n;
            for (int64_t j = 0; j < n; j++) {
                row[j] += aip * b_row[j];
            }
        }
    }
}

/* acc[M x N] = a[M x K] @ b[K x N], accumulating in double. */
static void product_f64(const double *a, const double *b, double *acc, int64_t m, int64_t k,
                        int64_t n) {
    for (int64_t i = 0; i < m; i++) {
        double *row = acc + i * n;
        for (int64_t j = 0; j < n; j++) {
            row[j] = 0.0;
        }
        for (int64_t p = 0; p < k; p++) {
            double aip = a[i * k + p];
            const double *b_row = b + p * n;
            for (int64_t j = 0; j < n; j++) {
                row[j] += aip * b_row[j];
            }
        }
    }
}

/* `v` with its last two dimensions swapped (a transposed view, no copy). */
static cobalt_view transposed(const cobalt_view *v) {
    cobalt_view t = *v;
    int last = v->ndim - 1;
    t.shape[last] = v->shape[last - 1];
    t.shape[last - 1] = v->shape[last];
    t.strides[last] = v->strides[last - 1];
    t.strides[last - 1] = v->strides[last];
    return t;
}

/*
 * result[i] = alpha * product[i] (+ result[i] when `accumulate`), for the
 * B x M x N outputs; result holds beta * out when accumulating.
 */
static PolychipError *multiply(const char *op, const cobalt_view *op_a, const cobalt_view *op_b,
                               int64_t batches, int64_t m, int64_t k, int64_t n, double alpha,
                               int accumulate, double *result) {
    PolychipError *error = NULL;
    if (op_a->dtype == COBALT_F64) {
        double *a = NULL;
        double *b = NULL;
        double *acc = NULL;
        error = cobalt_load_f64(op, op_a, &a);
        if (error == NULL) {
            error = cobalt_load_f64(op, op_b, &b);
        }
        if (error == NULL) {
            acc = cobalt_scratch(op, m * n, sizeof *acc, &error);
        }
        for (int64_t i = 0; error == NULL && i < batches; i++) {
            product_f64(a + i * m * k, b + i * k * n, acc, m, k, n);
            double *r = result + i * m * n;
            for (int64_t j = 0; j < m * n; j++) {
                r[j] = accumulate ? r[j] + alpha * acc[j] : alpha * acc[j];
            }
        }
        cobalt_scratch_free(a);
        cobalt_scratch_free(b);
        cobalt_scratch_free(acc);
    } else {
        float *a = NULL;
        float *b = NULL;
        float *acc = NULL;
        error = cobalt_load_f32(op, op_a, &a);
        if (error == NULL) {
            error = cobalt_load_f32(op, op_b, &b);
        }
        if (error == NULL) {
            acc = cobalt_scratch(op, m * n, sizeof *acc, &error);
        }
        for (int64_t i = 0; error == NULL && i < batches; i++) {
            product_f32(a + i * m * k, b + i * k * n, acc, m, k, n);
            double *r = result + i * m * n;
            for (int64_t j = 0; j < m * n; j++) {
                r[j] = accumulate ? r[j] + alpha * (double)acc[j] : alpha * (double)acc[j];
            }
        }
        cobalt_scratch_free(a);
        cobalt_scratch_free(b);
        cobalt_scratch_free(acc);
    }
    return error;
}

PolychipError *cobalt_op_matmul(uint32_t device, PolychipStream *stream,
                                const PolychipMatmulArgs *args) {
    const char *op = "matmul";
    PolychipError *error = cobalt_op_begin(op, device, stream, args,
                                           COBALT_FIELD_END(PolychipMatmulArgs, transpose_b),
                                           "transpose_b");
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
    if (a.dtype != b.dtype || a.dtype != out.dtype || !cobalt_dtype_is_float(a.dtype)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: matmul: a is %s, b is %s and out is %s; all three must have the "
                            "same floating dtype (f32, f16, bf16 or f64)",
                            cobalt_dtype_name(a.dtype), cobalt_dtype_name(b.dtype),
                            cobalt_dtype_name(out.dtype));
    }
    char sa[COBALT_SHAPE_STR_BYTES];
    char sb[COBALT_SHAPE_STR_BYTES];
    char so[COBALT_SHAPE_STR_BYTES];
    if (a.ndim < 2 || b.ndim < 2 || out.ndim < 2) {
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: matmul: a has shape %s, b has shape %s and out has shape %s; "
                            "all three need at least 2 dims",
                            cobalt_shape_str(sa, a.ndim, a.shape), cobalt_shape_str(sb, b.ndim, b.shape),
                            cobalt_shape_str(so, out.ndim, out.shape));
    }
    const char *ta = args->transpose_a ? " (transposed)" : "";
    const char *tb = args->transpose_b ? " (transposed)" : "";
    cobalt_view op_a = args->transpose_a ? transposed(&a) : a;
    cobalt_view op_b = args->transpose_b ? transposed(&b) : b;
    int64_t m = op_a.shape[op_a.ndim - 2];
    int64_t k = op_a.shape[op_a.ndim - 1];
    int64_t k_b = op_b.shape[op_b.ndim - 2];
    int64_t n = op_b.shape[op_b.ndim - 1];
    if (k != k_b) {
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: matmul: a has %d dims %s%s but b has shape %s%s; inner "
                            "dimensions %lld and %lld differ",
                            a.ndim, cobalt_shape_str(sa, a.ndim, a.shape), ta,
                            cobalt_shape_str(sb, b.ndim, b.shape), tb, (long long)k, (long long)k_b);
    }
    /* The expected out shape: broadcast batch dims, then [M, N]. */
    int ndim;
    int64_t shape[COBALT_MAX_DIMS];
    if (!cobalt_broadcast_shape(a.ndim - 2, a.shape, b.ndim - 2, b.shape, &ndim, shape)) {
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: matmul: the batch dimensions of a %s and b %s do not broadcast "
                            "together",
                            cobalt_shape_str(sa, a.ndim, a.shape), cobalt_shape_str(sb, b.ndim, b.shape));
    }
    if (ndim + 2 > COBALT_MAX_DIMS) {
        return cobalt_error(POLYCHIP_ERROR_UNIMPLEMENTED,
                            "cobalt: matmul: the result would have %d dims; cobalt supports at most %d",
                            ndim + 2, COBALT_MAX_DIMS);
    }
    shape[ndim] = m;
    shape[ndim + 1] = n;
    ndim += 2;
    if (!cobalt_same_shape(ndim, shape, out.ndim, out.shape)) {
        char se[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: matmul: a has shape %s%s and b has shape %s%s, so out should "
                            "have shape %s, but it has shape %s",
                            cobalt_shape_str(sa, a.ndim, a.shape), ta,
                            cobalt_shape_str(sb, b.ndim, b.shape), tb,
                            cobalt_shape_str(se, ndim, shape), cobalt_shape_str(so, out.ndim, out.shape));
    }
    if (out.numel == 0) {
        return NULL;
    }
    int64_t batches = out.numel / (m * n);
    /* op(a) as [batch..., M, K] and op(b) as [batch..., K, N], broadcast. */
    int64_t a_shape[COBALT_MAX_DIMS];
    int64_t b_shape[COBALT_MAX_DIMS];
    memcpy(a_shape, out.shape, sizeof a_shape);
    memcpy(b_shape, out.shape, sizeof b_shape);
    a_shape[ndim - 1] = k;
    b_shape[ndim - 2] = k;
    cobalt_view wide_a;
    cobalt_view wide_b;
    if (!cobalt_view_broadcast(&op_a, ndim, a_shape, &wide_a) ||
        !cobalt_view_broadcast(&op_b, ndim, b_shape, &wide_b)) {
        return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                            "cobalt: matmul: the operands broadcast to the batch would have more than "
                            "2^63 elements");
    }
    /* result starts as beta * out; when beta == 0, out is not read at all. */
    int accumulate = args->beta != 0.0;
    double *result = NULL;
    if (accumulate) {
        error = cobalt_load_f64(op, &out, &result);
        for (int64_t i = 0; error == NULL && i < out.numel; i++) {
            result[i] *= args->beta;
        }
    } else {
        result = cobalt_scratch(op, out.numel, sizeof *result, &error);
    }
    if (error == NULL && args->alpha == 0.0) {
        /* alpha == 0: a and b are not read (BLAS), so NaN in them cannot leak. */
        for (int64_t i = 0; !accumulate && i < out.numel; i++) {
            result[i] = 0.0;
        }
    } else if (error == NULL) {
        error = multiply(op, &wide_a, &wide_b, batches, m, k, n, args->alpha, accumulate, result);
    }
    if (error == NULL) {
        error = cobalt_store_f64(op, &out, result);
    }
    cobalt_scratch_free(result);
    return error;
}
