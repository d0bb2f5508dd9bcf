/*
 * The Cobalt linear layer of ABI 1.1: out = input @ weight^T + bias, with
 * input [..., K], weight [N, K], bias [N] (neither checked nor read when
 * has_bias is zero) and out [..., N], one floating dtype.
 *
 * Products accumulate in double and each output is rounded once. K may be 0
 * (the product is then zeros, plus the bias). Its backward is two matmuls
 * and a sum, so it has no operator of its own.
 */

#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

PolychipError *cobalt_op_linear(uint32_t device, PolychipStream *stream,
                                const PolychipLinearArgs *args) {
    const char *op = "linear";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipLinearArgs);
    if (error != NULL) {
        return error;
    }
    int has_bias = args->has_bias != 0;
    cobalt_view input;
    cobalt_view weight;
    cobalt_view out;
    cobalt_view bias;
    const cobalt_arg list[] = {{&input, &args->input, "input"},
                               {&weight, &args->weight, "weight"},
                               {&out, &args->out, "out"},
                               {&bias, &args->bias, "bias"}};
    int count = has_bias ? 4 : 3;
    error = cobalt_views(op, device, list, count);
    if (error == NULL) {
        error = cobalt_need_float(op, list, count);
    }
    if (error == NULL) {
        error = cobalt_need_ndim(op, "weight", &weight, 2, "[N, K]");
    }
    if (error == NULL) {
        error = cobalt_need_rank1(op, "input", &input, "[..., K]");
    }
    if (error == NULL) {
        error = cobalt_need_writable(op, "out", &out);
    }
    if (error != NULL) {
        return error;
    }
    int64_t k = input.shape[input.ndim - 1];
    int64_t n = weight.shape[0];
    if (weight.shape[1] != k) {
        char si[COBALT_SHAPE_STR_BYTES];
        char sw[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: linear: weight has shape %s but input has shape %s; weight must "
                            "be [N, %lld]",
                            cobalt_shape_str(sw, weight.ndim, weight.shape),
                            cobalt_shape_str(si, input.ndim, input.shape), (long long)k);
    }
    int64_t shape[COBALT_MAX_DIMS];
    memcpy(shape, input.shape, sizeof shape);
    shape[input.ndim - 1] = n;
    error = cobalt_need_shape(op, "out", &out, "input", &input, input.ndim, shape);
    if (error == NULL && has_bias) {
        error = cobalt_need_shape(op, "bias", &bias, "weight", &weight, 1, &n);
    }
    if (error != NULL || out.numel == 0) {
        return error;
    }
    int64_t m = out.numel / n;
    double *x = NULL;
    double *w = NULL;
    double *b = NULL;
    double *y = cobalt_scratch(op, out.numel, sizeof *y, &error);
    if (y != NULL && k > 0) {
        error = cobalt_load_f64(op, &input, &x);
        if (error == NULL) {
            error = cobalt_load_f64(op, &weight, &w);
        }
    }
    if (error == NULL && has_bias) {
        error = cobalt_load_f64(op, &bias, &b);
    }
    if (error == NULL) {
        for (int64_t r = 0; r < m; r++) {
            for (int64_t j = 0; j < n; j++) {
                double acc = 0.0;
                for (int64_t p = 0; p < k; p++) {
                    acc += x[r * k + p] * w[j * k + p];
                }
                y[r * n + j] = has_bias ? acc + b[j] : acc;
            }
        }
        error = cobalt_store_f64(op, &out, y);
    }
    void *all[] = {x, w, b, y};
    cobalt_free_all(all, 4);
    return error;
}
