/*
 * The Cobalt unary elementwise operators of ABI 1.1: neg, exp, log, sqrt,
 * rsqrt, tanh, pow_scalar, relu, silu and gelu (tanh form), and
 * cobalt_pointwise, the engine every elementwise operator runs on.
 *
 * Each element is computed in double from the exact input value with C's
 * libm, so the IEEE edge cases come out as documented (log(0) = -inf,
 * log(-1) = NaN, sqrt(-0) = -0, rsqrt(0) = +inf, exp(large) = +inf,
 * pow(x, 0) = 1 even for NaN), then rounded once to the output dtype. relu
 * keeps NaN; silu and gelu use their textbook formulas (so silu(-inf) and
 * gelu(-inf) are NaN, as -inf * 0 is). Shapes must be equal (no
 * broadcasting), any strides; in place (out being exactly input) works.
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

#define MAX_OPERANDS 5

PolychipError *cobalt_pointwise(const char *op, uint32_t device, const cobalt_arg *list, int n_in,
                                int n_out, cobalt_pointwise_fn fn, double param) {
    int count = n_in + n_out;
    PolychipError *error = cobalt_views(op, device, list, count);
    if (error == NULL) {
        error = cobalt_need_float(op, list, count);
    }
    if (error == NULL) {
        error = cobalt_need_same_shapes(op, list, count);
    }
    for (int k = n_in; error == NULL && k < count; k++) {
        error = cobalt_need_writable(op, list[k].name, list[k].view);
    }
    if (error != NULL || list[0].view->numel == 0) {
        return error;
    }
    double *buffers[MAX_OPERANDS] = {NULL};
    int64_t numel = list[0].view->numel;
    for (int k = 0; error == NULL && k < count; k++) {
        if (k < n_in) {
            error = cobalt_load_f64(op, list[k].view, &buffers[k]);
        } else {
            buffers[k] = cobalt_scratch(op, numel, sizeof(double), &error);
        }
    }
    if (error == NULL) {
        double in[MAX_OPERANDS];
        double out[MAX_OPERANDS];
        for (int64_t i = 0; i < numel; i++) {
            for (int k = 0; k < n_in; k++) {
                in[k] = buffers[k][i];
            }
            fn(in, out, param);
            for (int k = 0; k < n_out; k++) {
                buffers[n_in + k][i] = out[k];
            }
        }
        for (int k = n_in; error == NULL && k < count; k++) {
            error = cobalt_store_f64(op, list[k].view, buffers[k]);
        }
    }
    for (int k = 0; k < count; k++) {
        cobalt_scratch_free(buffers[k]);
    }
    return error;
}

static void f_neg(const double *in, double *out, double p) { (void)p, out[0] = -in[0]; }
static void f_exp(const double *in, double *out, double p) { (void)p, out[0] = exp(in[0]); }
static void f_log(const double *in, double *out, double p) { (void)p, out[0] = log(in[0]); }
static void f_sqrt(const double *in, double *out, double p) { (void)p, out[0] = sqrt(in[0]); }
static void f_rsqrt(const double *in, double *out, double p) { (void)p, out[0] = 1.0 / sqrt(in[0]); }
static void f_tanh(const double *in, double *out, double p) { (void)p, out[0] = tanh(in[0]); }
static void f_pow(const double *in, double *out, double p) { out[0] = pow(in[0], p); }
static void f_silu(const double *in, double *out, double p) { (void)p, out[0] = cobalt_silu(in[0]); }
static void f_gelu(const double *in, double *out, double p) { (void)p, out[0] = cobalt_gelu(in[0]); }

static void f_relu(const double *in, double *out, double p) {
    (void)p;
    double x = in[0];
    out[0] = x > 0.0 || isnan(x) ? x : 0.0;
}

/* The checks of the unary operators, then the elementwise engine. */
PolychipError *cobalt_unary(const char *op, uint32_t device, PolychipStream *stream,
                            const PolychipUnaryArgs *args, cobalt_pointwise_fn fn) {
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipUnaryArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input;
    cobalt_view out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    return cobalt_pointwise(op, device, list, 1, 1, fn, 0.0);
}

#define COBALT_UNARY(name)                                                                      \
    PolychipError *cobalt_op_##name(uint32_t device, PolychipStream *stream,                    \
                                    const PolychipUnaryArgs *args) {                            \
        return cobalt_unary(#name, device, stream, args, f_##name);                                    \
    }
COBALT_UNARY(neg)
COBALT_UNARY(exp)
COBALT_UNARY(log)
COBALT_UNARY(sqrt)
COBALT_UNARY(rsqrt)
COBALT_UNARY(tanh)
COBALT_UNARY(relu)
COBALT_UNARY(silu)
COBALT_UNARY(gelu)
#undef COBALT_UNARY

PolychipError *cobalt_op_pow_scalar(uint32_t device, PolychipStream *stream,
                                    const PolychipPowScalarArgs *args) {
    const char *op = "pow_scalar";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipPowScalarArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input;
    cobalt_view out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    return cobalt_pointwise(op, device, list, 1, 1, f_pow, args->exponent);
}
