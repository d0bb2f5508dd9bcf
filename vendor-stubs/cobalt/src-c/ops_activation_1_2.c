/*
 * The Cobalt activation operators of ABI 1.2: gelu_erf (the exact GELU,
 * PyTorch's default) and its backward, sigmoid, and the two backward
 * operators computed from an activation's output y, sigmoid_backward and
 * tanh_backward.
 *
 *   gelu_erf(x)  = x Phi(x),  Phi(x) = erfc(-x / sqrt 2) / 2
 *   gelu_erf'(x) = Phi(x) + x phi(x),  phi(x) = e^(-x^2/2) / sqrt(2 pi)
 *   sigmoid(x)   = 1 / (1 + e^-x)
 *   sigmoid_backward: grad_in = grad_out * y (1 - y)
 *   tanh_backward:    grad_in = grad_out * (1 - y) (1 + y)
 *
 * erfc rather than 1 + erf keeps Phi accurate in the negative tail. The
 * formulas are evaluated literally in double (so gelu_erf(-inf) and
 * gelu_erf' at +-inf are NaN, as -inf * 0 is) and rounded once; shapes are
 * equal, any strides, and an output may be exactly one of the inputs.
 */

#include <math.h>

#include "cobalt.h"

#define FRAC_1_SQRT_2 0.70710678118654752440084436210485
#define FRAC_1_SQRT_2PI 0.39894228040143267793994605993438

static double gelu_erf(double x) { return x * (0.5 * erfc(-x * FRAC_1_SQRT_2)); }

static double gelu_erf_grad(double x) {
    return 0.5 * erfc(-x * FRAC_1_SQRT_2) + x * (FRAC_1_SQRT_2PI * exp(-0.5 * x * x));
}

static void f_gelu_erf(const double *in, double *out, double p) {
    (void)p;
    out[0] = gelu_erf(in[0]);
}

static void f_sigmoid(const double *in, double *out, double p) {
    (void)p;
    out[0] = cobalt_sigmoid(in[0]);
}

/* in = {grad_out, input}; out = {grad_in}. */
static void f_gelu_erf_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[0] * gelu_erf_grad(in[1]);
}

/* in = {grad_out, output}; out = {grad_in}. */
static void f_sigmoid_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[0] * (in[1] * (1.0 - in[1]));
}

static void f_tanh_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[0] * ((1.0 - in[1]) * (1.0 + in[1]));
}

PolychipError *cobalt_op_gelu_erf(uint32_t device, PolychipStream *stream,
                                  const PolychipUnaryArgs *args) {
    return cobalt_unary("gelu_erf", device, stream, args, f_gelu_erf);
}

PolychipError *cobalt_op_sigmoid(uint32_t device, PolychipStream *stream,
                                 const PolychipUnaryArgs *args) {
    return cobalt_unary("sigmoid", device, stream, args, f_sigmoid);
}

PolychipError *cobalt_op_gelu_erf_backward(uint32_t device, PolychipStream *stream,
                                           const PolychipActivationBackwardArgs *args) {
    return cobalt_activation_backward("gelu_erf_backward", device, stream, args,
                                      f_gelu_erf_backward);
}

static PolychipError *output_backward(const char *op, uint32_t device, PolychipStream *stream,
                                      const PolychipOutputBackwardArgs *args,
                                      cobalt_pointwise_fn fn) {
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipOutputBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view grad_out;
    cobalt_view output;
    cobalt_view grad_in;
    const cobalt_arg list[] = {{&grad_out, &args->grad_out, "grad_out"},
                               {&output, &args->output, "output"},
                               {&grad_in, &args->grad_in, "grad_in"}};
    return cobalt_pointwise(op, device, list, 2, 1, fn, 0.0);
}

PolychipError *cobalt_op_sigmoid_backward(uint32_t device, PolychipStream *stream,
                                          const PolychipOutputBackwardArgs *args) {
    return output_backward("sigmoid_backward", device, stream, args, f_sigmoid_backward);
}

PolychipError *cobalt_op_tanh_backward(uint32_t device, PolychipStream *stream,
                                       const PolychipOutputBackwardArgs *args) {
    return output_backward("tanh_backward", device, stream, args, f_tanh_backward);
}
