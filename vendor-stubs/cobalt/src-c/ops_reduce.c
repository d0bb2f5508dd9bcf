/*
 * The Cobalt reductions of ABI 1.1: sum, mean, max and argmax over one
 * dimension, and sum_squares over every element.
 *
 * `dim` counts from the end when negative (out of range: INVALID_ARGUMENT);
 * `out` has input's shape with that dimension removed, or set to 1 with
 * keepdim. The input needs at least one dimension (a 0-dim input is a
 * SHAPE_MISMATCH, as the host's checks have it). sum, mean and max keep the
 * input's dtype (f32, f16 or bf16); argmax writes i64.
 * Values accumulate in double and each output is rounded once. Over an empty
 * dimension sum is 0, mean is NaN (0 / 0), max is -inf, and argmax is an
 * INVALID_ARGUMENT error. max propagates NaN; argmax returns the first
 * maximum, or the first NaN when there is one. sum_squares writes a 0-dim
 * f32 (0 for an empty input).
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

typedef enum reduce_kind { REDUCE_SUM, REDUCE_MEAN, REDUCE_MAX, REDUCE_ARGMAX } reduce_kind;

static const char *const g_names[] = {"sum", "mean", "max", "argmax"};

/* One output of the reduction of x[0], x[stride], ..., x[(n - 1) * stride]. */
static double reduce_line(reduce_kind kind, const double *x, int64_t n, int64_t stride) {
    double acc = kind == REDUCE_MAX ? -INFINITY : 0.0;
    int64_t best = 0;
    for (int64_t j = 0; j < n; j++) {
        double value = x[j * stride];
        switch (kind) {
        case REDUCE_SUM:
        case REDUCE_MEAN:
            acc += value;
            break;
        case REDUCE_MAX:
            acc = isnan(value) || value > acc ? value : acc;
            if (isnan(value)) {
                return value;
            }
            break;
        case REDUCE_ARGMAX:
            if (isnan(value)) {
                return (double)j;
            }
            if (j == 0 || value > acc) {
                acc = value;
                best = j;
            }
            break;
        }
    }
    if (kind == REDUCE_MEAN) {
        return acc / (double)n; /* NaN when n == 0 */
    }
    return kind == REDUCE_ARGMAX ? (double)best : acc;
}

/* Checks args->dim against the input's rank and returns it in [0, rank). */
static PolychipError *resolve_dim(const char *op, const cobalt_view *input, int32_t dim, int *out) {
    int rank = input->ndim;
    if (dim < -rank || dim >= rank) {
        char s[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: dim %d is out of range for input of shape %s (valid: %d to "
                            "%d)",
                            op, (int)dim, cobalt_shape_str(s, input->ndim, input->shape), -rank,
                            rank - 1);
    }
    *out = dim < 0 ? dim + rank : dim;
    return NULL;
}

static PolychipError *reduce(reduce_kind kind, uint32_t device, PolychipStream *stream,
                             const PolychipReduceArgs *args) {
    const char *op = g_names[kind];
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipReduceArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input;
    cobalt_view out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    int d = 0;
    error = cobalt_views(op, device, list, 2);
    if (error == NULL) {
        error = cobalt_need_float(op, list, kind == REDUCE_ARGMAX ? 1 : 2);
    }
    if (error == NULL && kind == REDUCE_ARGMAX && out.dtype != COBALT_I64) {
        error = cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                             "cobalt: argmax: out is %s; argmax writes i64 indices",
                             cobalt_dtype_name(out.dtype));
    }
    if (error == NULL) {
        error = cobalt_need_rank1(op, "input", &input, "[d0, d1, ...]");
    }
    if (error == NULL) {
        error = resolve_dim(op, &input, args->dim, &d);
    }
    if (error == NULL) {
        error = cobalt_need_writable(op, "out", &out);
    }
    if (error != NULL) {
        return error;
    }
    /* The expected out shape, and input as [outer, n, inner]. */
    int ndim = 0;
    int64_t shape[COBALT_MAX_DIMS];
    int64_t n = input.shape[d];
    for (int k = 0; k < input.ndim; k++) {
        if (k != d) {
            shape[ndim++] = input.shape[k];
        } else if (args->keepdim) {
            shape[ndim++] = 1;
        }
    }
    error = cobalt_need_shape(op, "out", &out, "input", &input, ndim, shape);
    if (error != NULL) {
        return error;
    }
    if (kind == REDUCE_ARGMAX && n == 0) {
        char s[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: argmax: dimension %d of input %s is empty; there is no maximum "
                            "to index",
                            d, cobalt_shape_str(s, input.ndim, input.shape));
    }
    if (out.numel == 0) {
        return NULL;
    }
    int64_t inner = 1;
    for (int k = d + 1; k < input.ndim; k++) {
        inner *= input.shape[k]; /* divides out.numel, so it cannot overflow */
    }
    int64_t outer = out.numel / inner;
    double *x = NULL;
    double *result = cobalt_scratch(op, out.numel, sizeof *result, &error);
    if (result != NULL && n > 0) {
        error = cobalt_load_f64(op, &input, &x);
    }
    if (error == NULL) {
        for (int64_t o = 0; o < outer; o++) {
            for (int64_t i = 0; i < inner; i++) {
                const double *line = x == NULL ? NULL : x + o * n * inner + i;
                result[o * inner + i] = reduce_line(kind, line, n, inner);
            }
        }
        if (kind == REDUCE_ARGMAX) {
            int64_t *indices = cobalt_scratch(op, out.numel, sizeof *indices, &error);
            for (int64_t i = 0; indices != NULL && i < out.numel; i++) {
                indices[i] = (int64_t)result[i]; /* exact: indices are below 2^53 */
            }
            if (indices != NULL) {
                cobalt_scatter(&out, indices);
            }
            cobalt_scratch_free(indices);
        } else {
            error = cobalt_store_f64(op, &out, result);
        }
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(result);
    return error;
}

PolychipError *cobalt_op_sum(uint32_t device, PolychipStream *stream, const PolychipReduceArgs *args) {
    return reduce(REDUCE_SUM, device, stream, args);
}

PolychipError *cobalt_op_mean(uint32_t device, PolychipStream *stream, const PolychipReduceArgs *args) {
    return reduce(REDUCE_MEAN, device, stream, args);
}

PolychipError *cobalt_op_max(uint32_t device, PolychipStream *stream, const PolychipReduceArgs *args) {
    return reduce(REDUCE_MAX, device, stream, args);
}

PolychipError *cobalt_op_argmax(uint32_t device, PolychipStream *stream,
                                const PolychipReduceArgs *args) {
    return reduce(REDUCE_ARGMAX, device, stream, args);
}

PolychipError *cobalt_op_sum_squares(uint32_t device, PolychipStream *stream,
                                     const PolychipSumSquaresArgs *args) {
    const char *op = "sum_squares";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipSumSquaresArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input;
    cobalt_view out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 2);
    if (error == NULL) {
        error = cobalt_need_float(op, list, 1);
    }
    if (error == NULL) {
        error = cobalt_need_f32(op, "out", &out, "sums of squares");
    }
    if (error == NULL) {
        error = cobalt_need_shape(op, "out", &out, "input", &input, 0, NULL);
    }
    if (error != NULL) {
        return error;
    }
    double total = 0.0;
    double *x = NULL;
    if (input.numel > 0) {
        error = cobalt_load_f64(op, &input, &x);
        for (int64_t i = 0; error == NULL && i < input.numel; i++) {
            total += x[i] * x[i];
        }
        cobalt_scratch_free(x);
    }
    if (error == NULL) {
        error = cobalt_store_f64(op, &out, &total);
    }
    return error;
}
