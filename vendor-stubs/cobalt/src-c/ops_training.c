/*
 * The Cobalt optimizer-side operators of ABI 1.1: one AdamW step and scale
 * (tensor *= alpha, for gradient clipping), both in place.
 *
 * AdamW, element by element in double, with bias correction for the 1-based
 * `step` (step < 1 is an INVALID_ARGUMENT error):
 *   p -= lr * weight_decay * p
 *   m  = beta1 m + (1 - beta1) g
 *   v  = beta2 v + (1 - beta2) g^2
 *   p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
 * param and grad share a floating dtype; exp_avg (m) and exp_avg_sq (v) are
 * f32; all four have one shape. The new p uses m and v before they are
 * rounded to f32; p, m and v are each rounded once when stored.
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

PolychipError *cobalt_op_adamw(uint32_t device, PolychipStream *stream, const PolychipAdamwArgs *args) {
    const char *op = "adamw";
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipAdamwArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view param, grad, exp_avg, exp_avg_sq;
    const cobalt_arg list[] = {{&param, &args->param, "param"},
                               {&grad, &args->grad, "grad"},
                               {&exp_avg, &args->exp_avg, "exp_avg"},
                               {&exp_avg_sq, &args->exp_avg_sq, "exp_avg_sq"}};
    error = cobalt_views(op, device, list, 4);
    error = error ? error : cobalt_need_float(op, list, 2);
    error = error ? error : cobalt_need_f32(op, "exp_avg", &exp_avg, "AdamW moments");
    error = error ? error : cobalt_need_f32(op, "exp_avg_sq", &exp_avg_sq, "AdamW moments");
    error = error ? error : cobalt_need_same_shapes(op, list, 4);
    error = error ? error : cobalt_need_writable(op, "param", &param);
    error = error ? error : cobalt_need_writable(op, "exp_avg", &exp_avg);
    error = error ? error : cobalt_need_writable(op, "exp_avg_sq", &exp_avg_sq);
    if (error == NULL && args->step < 1) {
        error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                             "cobalt: adamw: step is %lld; it is 1-based and must be at least 1",
                             (long long)args->step);
    }
    if (error != NULL || param.numel == 0) {
        return error;
    }
    double *v[4] = {NULL, NULL, NULL, NULL}; /* param, grad, m, v */
    for (int i = 0; error == NULL && i < 4; i++) {
        error = cobalt_load_f64(op, list[i].view, &v[i]);
    }
    if (error == NULL) {
        double lr = args->lr;
        double beta1 = args->beta1;
        double beta2 = args->beta2;
        double correction1 = 1.0 - pow(beta1, (double)args->step);
        double correction2 = 1.0 - pow(beta2, (double)args->step);
        for (int64_t i = 0; i < param.numel; i++) {
            double p = v[0][i];
            double g = v[1][i];
            p -= lr * args->weight_decay * p;
            double m = beta1 * v[2][i] + (1.0 - beta1) * g;
            double s = beta2 * v[3][i] + (1.0 - beta2) * g * g;
            p -= lr * (m / correction1) / (sqrt(s / correction2) + args->eps);
            v[0][i] = p;
            v[2][i] = m;
            v[3][i] = s;
        }
        error = cobalt_store_f64(op, &param, v[0]);
        error = error ? error : cobalt_store_f64(op, &exp_avg, v[2]);
        error = error ? error : cobalt_store_f64(op, &exp_avg_sq, v[3]);
    }
    void *all[] = {v[0], v[1], v[2], v[3]};
    cobalt_free_all(all, 4);
    return error;
}

PolychipError *cobalt_op_scale(uint32_t device, PolychipStream *stream, const PolychipScaleArgs *args) {
    const char *op = "scale";
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipScaleArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view tensor;
    const cobalt_arg list[] = {{&tensor, &args->tensor, "tensor"}};
    error = cobalt_views(op, device, list, 1);
    error = error ? error : cobalt_need_float(op, list, 1);
    error = error ? error : cobalt_need_writable(op, "tensor", &tensor);
    if (error != NULL || tensor.numel == 0) {
        return error;
    }
    double *x = NULL;
    error = cobalt_load_f64(op, &tensor, &x);
    for (int64_t i = 0; error == NULL && i < tensor.numel; i++) {
        x[i] *= args->alpha;
    }
    error = error ? error : cobalt_store_f64(op, &tensor, x);
    cobalt_scratch_free(x);
    return error;
}
