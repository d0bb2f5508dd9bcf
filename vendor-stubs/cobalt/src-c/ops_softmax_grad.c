/*
 * The Cobalt relatives of softmax that ABI 1.1 added, all over the last
 * dimension: log_softmax (out = x - max - log(sum(exp(x - max)))),
 * softmax_backward (grad_in = y * (g - sum(g * y))) and log_softmax_backward
 * (grad_in = g - exp(y) * sum(g)), where y is the forward output and g its
 * gradient.
 *
 * Rows are computed in double and each output is rounded once. As with
 * softmax, NaN propagates to its whole row and so does a row of all -inf.
 * Tensors are f32, f16 or bf16 with at least one dim; shapes are equal, any strides;
 * log_softmax works in place (out being exactly input), and so do the
 * backward operators (all inputs are read before grad_in is written).
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

/* Rows and their length for a tensor (of at least 1 dim) whose last dimension is the row. */
static void rows_of(const cobalt_view *v, int64_t *rows, int64_t *length) {
    *length = v->shape[v->ndim - 1];
    *rows = *length > 0 ? v->numel / *length : 0;
}

PolychipError *cobalt_op_log_softmax(uint32_t device, PolychipStream *stream,
                                     const PolychipSoftmaxArgs *args) {
    const char *op = "log_softmax";
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipSoftmaxArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input;
    cobalt_view out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 2);
    error = error ? error : cobalt_need_float(op, list, 2);
    error = error ? error : cobalt_need_rank1(op, "input", &input, "[..., N]");
    error = error ? error : cobalt_need_same_shapes(op, list, 2);
    error = error ? error : cobalt_need_writable(op, "out", &out);
    if (error != NULL || input.numel == 0) {
        return error;
    }
    int64_t rows;
    int64_t length;
    rows_of(&input, &rows, &length);
    double *x;
    error = cobalt_load_f64(op, &input, &x);
    if (error != NULL) {
        return error;
    }
    for (int64_t r = 0; r < rows; r++) {
        double *row = x + r * length;
        double max = -INFINITY;
        for (int64_t j = 0; j < length; j++) {
            max = row[j] > max ? row[j] : max;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < length; j++) {
            sum += exp(row[j] - max);
        }
        double log_sum = log(sum);
        for (int64_t j = 0; j < length; j++) {
            row[j] = row[j] - max - log_sum;
        }
    }
    error = cobalt_store_f64(op, &out, x);
    cobalt_scratch_free(x);
    return error;
}

/* softmax_backward (log == 0) and log_softmax_backward (log != 0). */
static PolychipError *backward(const char *op, int log_form, uint32_t device,
                               PolychipStream *stream, const PolychipSoftmaxBackwardArgs *args) {
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipSoftmaxBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view y;
    cobalt_view g;
    cobalt_view grad_in;
    const cobalt_arg list[] = {{&y, &args->out, "out"},
                               {&g, &args->grad_out, "grad_out"},
                               {&grad_in, &args->grad_in, "grad_in"}};
    error = cobalt_views(op, device, list, 3);
    error = error ? error : cobalt_need_float(op, list, 3);
    error = error ? error : cobalt_need_rank1(op, "out", &y, "[..., N]");
    error = error ? error : cobalt_need_same_shapes(op, list, 3);
    error = error ? error : cobalt_need_writable(op, "grad_in", &grad_in);
    if (error != NULL || y.numel == 0) {
        return error;
    }
    int64_t rows;
    int64_t length;
    rows_of(&y, &rows, &length);
    double *yv = NULL;
    double *gv = NULL;
    error = cobalt_load_f64(op, &y, &yv);
    if (error == NULL) {
        error = cobalt_load_f64(op, &g, &gv);
    }
    for (int64_t r = 0; error == NULL && r < rows; r++) {
        double *yr = yv + r * length;
        double *gr = gv + r * length;
        double dot = 0.0;
        for (int64_t j = 0; j < length; j++) {
            dot += log_form ? gr[j] : gr[j] * yr[j];
        }
        for (int64_t j = 0; j < length; j++) {
            gr[j] = log_form ? gr[j] - exp(yr[j]) * dot : yr[j] * (gr[j] - dot);
        }
    }
    if (error == NULL) {
        error = cobalt_store_f64(op, &grad_in, gv);
    }
    cobalt_scratch_free(yv);
    cobalt_scratch_free(gv);
    return error;
}

PolychipError *cobalt_op_softmax_backward(uint32_t device, PolychipStream *stream,
                                          const PolychipSoftmaxBackwardArgs *args) {
    return backward("softmax_backward", 0, device, stream, args);
}

PolychipError *cobalt_op_log_softmax_backward(uint32_t device, PolychipStream *stream,
                                              const PolychipSoftmaxBackwardArgs *args) {
    return backward("log_softmax_backward", 1, device, stream, args);
}
