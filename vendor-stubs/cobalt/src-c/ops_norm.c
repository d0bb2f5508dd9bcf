/*
 * The Cobalt normalisations of ABI 1.1, over the last dimension H of an
 * input [..., H] (each index of the leading dimensions is a row):
 *
 *   rms_norm    out = x * r * w,  r = 1 / sqrt(mean(x^2) + eps)  (r saved as inv_rms)
 *   layer_norm  out = (x - mu) * rstd * w + b,  rstd = 1 / sqrt(var + eps), biased var
 *
 * and their backward operators, the exact derivatives given the saved f32
 * statistics (g = grad_out, gw = g * w, xhat = (x - mu) * rstd):
 *
 *   rms_norm:   grad_input = r * gw - r^3 / H * x * sum(gw * x),  grad_weight = sum_rows(g * x * r)
 *   layer_norm: grad_input = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),
 *               grad_weight = sum_rows(g * xhat),  grad_bias = sum_rows(g)
 *
 * Gradients are written, not accumulated (with no rows, grad_weight and
 * grad_bias are zeros). Weights and biases are [H] in the input's dtype;
 * statistics are f32 with the input's leading shape. Everything is computed
 * in double and rounded once. With H = 0 the mean of nothing is NaN, so the
 * statistics are NaN.
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

/* SHAPE_MISMATCH unless parameter `name` is [H]. */
static PolychipError *need_param(const char *op, const char *name, const cobalt_view *p,
                                 const cobalt_view *input) {
    int64_t h = input->shape[input->ndim - 1];
    if (cobalt_same_shape(p->ndim, p->shape, 1, &h)) {
        return NULL;
    }
    char s[COBALT_SHAPE_STR_BYTES];
    return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                        "cobalt: %s: %s has shape %s but input's last dimension is %lld", op, name,
                        cobalt_shape_str(s, p->ndim, p->shape), (long long)h);
}

/* DTYPE_MISMATCH or SHAPE_MISMATCH unless statistic `name` is f32 [leading dims]. */
static PolychipError *need_stats(const char *op, const char *name, const cobalt_view *s,
                                 const cobalt_view *input) {
    PolychipError *error = cobalt_need_f32(op, name, s, "normalisation statistics");
    if (error == NULL) {
        error = cobalt_need_shape(op, name, s, "input", input, input->ndim - 1, input->shape);
    }
    return error;
}

/* Loads the first `count` views of `list` as double (out[i] stays NULL past an error). */
static PolychipError *load_all(const char *op, const cobalt_arg *list, int count, double **out) {
    PolychipError *error = NULL;
    for (int i = 0; error == NULL && i < count; i++) {
        error = cobalt_load_f64(op, list[i].view, &out[i]);
    }
    return error;
}

PolychipError *cobalt_op_rms_norm(uint32_t device, PolychipStream *stream,
                                  const PolychipRmsNormArgs *args) {
    const char *op = "rms_norm";
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipRmsNormArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, weight, out, inv_rms;
    const cobalt_arg list[] = {{&input, &args->input, "input"},
                               {&weight, &args->weight, "weight"},
                               {&out, &args->out, "out"},
                               {&inv_rms, &args->inv_rms, "inv_rms"}};
    error = cobalt_views(op, device, list, 4);
    error = error ? error : cobalt_need_float(op, list, 3);
    error = error ? error : cobalt_need_rank1(op, "input", &input, "[..., H]");
    error = error ? error : cobalt_need_same_shapes(op, (const cobalt_arg[]){list[0], list[2]}, 2);
    error = error ? error : need_param(op, "weight", &weight, &input);
    error = error ? error : need_stats(op, "inv_rms", &inv_rms, &input);
    error = error ? error : cobalt_need_writable(op, "out", &out);
    error = error ? error : cobalt_need_writable(op, "inv_rms", &inv_rms);
    if (error != NULL || inv_rms.numel == 0) {
        return error;
    }
    int64_t h = weight.numel;
    int64_t rows = inv_rms.numel;
    double *v[2] = {NULL, NULL};
    double *r = cobalt_scratch(op, rows, sizeof *r, &error);
    error = error ? error : load_all(op, list, 2, v);
    for (int64_t row = 0; error == NULL && row < rows; row++) {
        double *x = v[0] + row * h;
        double squares = 0.0;
        for (int64_t j = 0; j < h; j++) {
            squares += x[j] * x[j];
        }
        r[row] = 1.0 / sqrt(squares / (double)h + args->eps);
        for (int64_t j = 0; j < h; j++) {
            x[j] = x[j] * r[row] * v[1][j];
        }
    }
    error = error ? error : cobalt_store_f64(op, &out, v[0]);
    error = error ? error : cobalt_store_f64(op, &inv_rms, r);
    void *all[] = {v[0], v[1], r};
    cobalt_free_all(all, 3);
    return error;
}

PolychipError *cobalt_op_rms_norm_backward(uint32_t device, PolychipStream *stream,
                                           const PolychipRmsNormBackwardArgs *args) {
    const char *op = "rms_norm_backward";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipRmsNormBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view grad_out, input, weight, inv_rms, grad_input, grad_weight;
    const cobalt_arg list[] = {{&grad_out, &args->grad_out, "grad_out"},
                               {&input, &args->input, "input"},
                               {&weight, &args->weight, "weight"},
                               {&inv_rms, &args->inv_rms, "inv_rms"},
                               {&grad_input, &args->grad_input, "grad_input"},
                               {&grad_weight, &args->grad_weight, "grad_weight"}};
    error = cobalt_views(op, device, list, 6);
    const cobalt_arg floats[] = {list[1], list[0], list[2], list[4], list[5]};
    const cobalt_arg shaped[] = {list[1], list[0], list[4]};
    error = error ? error : cobalt_need_float(op, floats, 5);
    error = error ? error : cobalt_need_rank1(op, "input", &input, "[..., H]");
    error = error ? error : cobalt_need_same_shapes(op, shaped, 3);
    error = error ? error : need_param(op, "weight", &weight, &input);
    error = error ? error : need_param(op, "grad_weight", &grad_weight, &input);
    error = error ? error : need_stats(op, "inv_rms", &inv_rms, &input);
    error = error ? error : cobalt_need_writable(op, "grad_input", &grad_input);
    error = error ? error : cobalt_need_writable(op, "grad_weight", &grad_weight);
    if (error != NULL) {
        return error;
    }
    int64_t h = weight.numel;
    int64_t rows = inv_rms.numel;
    double *v[4] = {NULL, NULL, NULL, NULL}; /* grad_out (becomes grad_input), input, weight, inv_rms */
    double *gw = cobalt_scratch(op, h, sizeof *gw, &error);
    error = error ? error : load_all(op, list, 4, v);
    for (int64_t j = 0; error == NULL && j < h; j++) {
        gw[j] = 0.0;
    }
    for (int64_t row = 0; error == NULL && row < rows; row++) {
        double *g = v[0] + row * h;
        const double *x = v[1] + row * h;
        double r = v[3][row];
        double dot = 0.0;
        for (int64_t j = 0; j < h; j++) {
            dot += g[j] * v[2][j] * x[j];
        }
        double c = r * r * r / (double)h * dot;
        for (int64_t j = 0; j < h; j++) {
            gw[j] += g[j] * x[j] * r;
            g[j] = r * g[j] * v[2][j] - c * x[j];
        }
    }
    error = error ? error : cobalt_store_f64(op, &grad_input, v[0]);
    error = error ? error : cobalt_store_f64(op, &grad_weight, gw);
    void *all[] = {v[0], v[1], v[2], v[3], gw};
    cobalt_free_all(all, 5);
    return error;
}

PolychipError *cobalt_op_layer_norm(uint32_t device, PolychipStream *stream,
                                    const PolychipLayerNormArgs *args) {
    const char *op = "layer_norm";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipLayerNormArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, weight, bias, out, mean, rstd;
    const cobalt_arg list[] = {{&input, &args->input, "input"},  {&weight, &args->weight, "weight"},
                               {&bias, &args->bias, "bias"},     {&out, &args->out, "out"},
                               {&mean, &args->mean, "mean"},     {&rstd, &args->rstd, "rstd"}};
    error = cobalt_views(op, device, list, 6);
    error = error ? error : cobalt_need_float(op, list, 4);
    error = error ? error : cobalt_need_rank1(op, "input", &input, "[..., H]");
    error = error ? error : cobalt_need_same_shapes(op, (const cobalt_arg[]){list[0], list[3]}, 2);
    error = error ? error : need_param(op, "weight", &weight, &input);
    error = error ? error : need_param(op, "bias", &bias, &input);
    error = error ? error : need_stats(op, "mean", &mean, &input);
    error = error ? error : need_stats(op, "rstd", &rstd, &input);
    error = error ? error : cobalt_need_writable(op, "out", &out);
    error = error ? error : cobalt_need_writable(op, "mean", &mean);
    error = error ? error : cobalt_need_writable(op, "rstd", &rstd);
    if (error != NULL || mean.numel == 0) {
        return error;
    }
    int64_t h = weight.numel;
    int64_t rows = mean.numel;
    double *v[3] = {NULL, NULL, NULL}; /* input (becomes out), weight, bias */
    double *mu = cobalt_scratch(op, rows, sizeof *mu, &error);
    double *rs = mu == NULL ? NULL : cobalt_scratch(op, rows, sizeof *rs, &error);
    error = error ? error : load_all(op, list, 3, v);
    for (int64_t row = 0; error == NULL && row < rows; row++) {
        double *x = v[0] + row * h;
        double sum = 0.0;
        for (int64_t j = 0; j < h; j++) {
            sum += x[j];
        }
        mu[row] = sum / (double)h;
        double squares = 0.0;
        for (int64_t j = 0; j < h; j++) {
            squares += (x[j] - mu[row]) * (x[j] - mu[row]);
        }
        rs[row] = 1.0 / sqrt(squares / (double)h + args->eps);
        for (int64_t j = 0; j < h; j++) {
            x[j] = (x[j] - mu[row]) * rs[row] * v[1][j] + v[2][j];
        }
    }
    error = error ? error : cobalt_store_f64(op, &out, v[0]);
    error = error ? error : cobalt_store_f64(op, &mean, mu);
    error = error ? error : cobalt_store_f64(op, &rstd, rs);
    void *all[] = {v[0], v[1], v[2], mu, rs};
    cobalt_free_all(all, 5);
    return error;
}

PolychipError *cobalt_op_layer_norm_backward(uint32_t device, PolychipStream *stream,
                                             const PolychipLayerNormBackwardArgs *args) {
    const char *op = "layer_norm_backward";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipLayerNormBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view grad_out, input, weight, mean, rstd, grad_input, grad_weight, grad_bias;
    const cobalt_arg list[] = {{&grad_out, &args->grad_out, "grad_out"},
                               {&input, &args->input, "input"},
                               {&weight, &args->weight, "weight"},
                               {&mean, &args->mean, "mean"},
                               {&rstd, &args->rstd, "rstd"},
                               {&grad_input, &args->grad_input, "grad_input"},
                               {&grad_weight, &args->grad_weight, "grad_weight"},
                               {&grad_bias, &args->grad_bias, "grad_bias"}};
    error = cobalt_views(op, device, list, 8);
    const cobalt_arg floats[] = {list[1], list[0], list[2], list[5], list[6], list[7]};
    const cobalt_arg shaped[] = {list[1], list[0], list[5]};
    error = error ? error : cobalt_need_float(op, floats, 6);
    error = error ? error : cobalt_need_rank1(op, "input", &input, "[..., H]");
    error = error ? error : cobalt_need_same_shapes(op, shaped, 3);
    error = error ? error : need_param(op, "weight", &weight, &input);
    error = error ? error : need_param(op, "grad_weight", &grad_weight, &input);
    error = error ? error : need_param(op, "grad_bias", &grad_bias, &input);
    error = error ? error : need_stats(op, "mean", &mean, &input);
    error = error ? error : need_stats(op, "rstd", &rstd, &input);
    error = error ? error : cobalt_need_writable(op, "grad_input", &grad_input);
    error = error ? error : cobalt_need_writable(op, "grad_weight", &grad_weight);
    error = error ? error : cobalt_need_writable(op, "grad_bias", &grad_bias);
    if (error != NULL) {
        return error;
    }
    int64_t h = weight.numel;
    int64_t rows = mean.numel;
    /* grad_out (becomes grad_input), input (becomes xhat), weight, mean, rstd */
    double *v[5] = {NULL, NULL, NULL, NULL, NULL};
    double *gw = cobalt_scratch(op, h, sizeof *gw, &error);
    double *gb = gw == NULL ? NULL : cobalt_scratch(op, h, sizeof *gb, &error);
    error = error ? error : load_all(op, list, 5, v);
    for (int64_t j = 0; error == NULL && j < h; j++) {
        gw[j] = 0.0;
        gb[j] = 0.0;
    }
    for (int64_t row = 0; error == NULL && row < rows; row++) {
        double *g = v[0] + row * h;
        double *xhat = v[1] + row * h;
        double mean_gw = 0.0;
        double mean_gw_xhat = 0.0;
        for (int64_t j = 0; j < h; j++) {
            xhat[j] = (xhat[j] - v[3][row]) * v[4][row];
            mean_gw += g[j] * v[2][j];
            mean_gw_xhat += g[j] * v[2][j] * xhat[j];
        }
        mean_gw /= (double)h;
        mean_gw_xhat /= (double)h;
        for (int64_t j = 0; j < h; j++) {
            gw[j] += g[j] * xhat[j];
            gb[j] += g[j];
            g[j] = v[4][row] * (g[j] * v[2][j] - mean_gw - xhat[j] * mean_gw_xhat);
        }
    }
    error = error ? error : cobalt_store_f64(op, &grad_input, v[0]);
    error = error ? error : cobalt_store_f64(op, &grad_weight, gw);
    error = error ? error : cobalt_store_f64(op, &grad_bias, gb);
    void *all[] = {v[0], v[1], v[2], v[3], v[4], gw, gb};
    cobalt_free_all(all, 7);
    return error;
}
