/*
 * The Cobalt activation math of ABI 1.1 and the operators built on it:
 * relu_backward, silu_backward, gelu_backward, swiglu and swiglu_backward.
 *
 *   sigmoid(x) = 1 / (1 + e^-x)          silu(x) = x / (1 + e^-x)
 *   silu'(x)   = s (1 + x (1 - s)),  s = sigmoid(x)
 *   gelu(x)    = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *   gelu'(x)   = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(u)
 *   relu_backward selects: 0 where x <= 0, else grad_out (a NaN x passes it)
 *
 * The backward operators compute grad_in = grad_out * f'(input) literally
 * (so an infinite grad_out times a zero derivative is NaN). For a finite x so
 * large that tanh(u) is exactly +-1, gelu' drops its second term (which is
 * then exactly 0 but would compute as 0 * inf in double). Everything is
 * computed in double and rounded once; shapes are equal, any strides, and an
 * output may be exactly one of the inputs.
 */

#include <math.h>

#include "cobalt.h"

#define SQRT_2_OVER_PI 0.79788456080286535587989211986876
#define GELU_A 0.044715

double cobalt_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

double cobalt_silu(double x) { return x / (1.0 + exp(-x)); }

double cobalt_silu_grad(double x) {
    double s = cobalt_sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
}

double cobalt_gelu(double x) {
    double u = SQRT_2_OVER_PI * (x + GELU_A * x * x * x);
    return 0.5 * x * (1.0 + tanh(u));
}

double cobalt_gelu_grad(double x) {
    double t = tanh(SQRT_2_OVER_PI * (x + GELU_A * x * x * x));
    double sech2 = 1.0 - t * t;
    double second = sech2 == 0.0 && isfinite(x)
                        ? 0.0
                        : 0.5 * x * sech2 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_A * x * x);
    return 0.5 * (1.0 + t) + second;
}

/* in = {grad_out, input}; out = {grad_in}. */
static void f_relu_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[1] <= 0.0 ? 0.0 : in[0]; /* a select (a NaN input passes) */
}

static void f_silu_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[0] * cobalt_silu_grad(in[1]);
}

static void f_gelu_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[0] * cobalt_gelu_grad(in[1]);
}

PolychipError *cobalt_activation_backward(const char *op, uint32_t device, PolychipStream *stream,
                                          const PolychipActivationBackwardArgs *args,
                                          cobalt_pointwise_fn fn) {
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipActivationBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view grad_out;
    cobalt_view input;
    cobalt_view grad_in;
    const cobalt_arg list[] = {{&grad_out, &args->grad_out, "grad_out"},
                               {&input, &args->input, "input"},
                               {&grad_in, &args->grad_in, "grad_in"}};
    return cobalt_pointwise(op, device, list, 2, 1, fn, 0.0);
}

PolychipError *cobalt_op_relu_backward(uint32_t device, PolychipStream *stream,
                                       const PolychipActivationBackwardArgs *args) {
    return cobalt_activation_backward("relu_backward", device, stream, args, f_relu_backward);
}

PolychipError *cobalt_op_silu_backward(uint32_t device, PolychipStream *stream,
                                       const PolychipActivationBackwardArgs *args) {
    return cobalt_activation_backward("silu_backward", device, stream, args, f_silu_backward);
}

PolychipError *cobalt_op_gelu_backward(uint32_t device, PolychipStream *stream,
                                       const PolychipActivationBackwardArgs *args) {
    return cobalt_activation_backward("gelu_backward", device, stream, args, f_gelu_backward);
}

/* in = {gate, up}; out = {silu(gate) * up}. */
static void f_swiglu(const double *in, double *out, double p) {
    (void)p;
    out[0] = cobalt_silu(in[0]) * in[1];
}

/* in = {gate, up, grad_out}; out = {grad_gate, grad_up}. */
static void f_swiglu_backward(const double *in, double *out, double p) {
    (void)p;
    out[0] = in[2] * in[1] * cobalt_silu_grad(in[0]);
    out[1] = in[2] * cobalt_silu(in[0]);
}

PolychipError *cobalt_op_swiglu(uint32_t device, PolychipStream *stream,
                                const PolychipSwigluArgs *args) {
    const char *op = "swiglu";
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipSwigluArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view gate;
    cobalt_view up;
    cobalt_view out;
    const cobalt_arg list[] = {
        {&gate, &args->gate, "gate"}, {&up, &args->up, "up"}, {&out, &args->out, "out"}};
    return cobalt_pointwise(op, device, list, 2, 1, f_swiglu, 0.0);
}

PolychipError *cobalt_op_swiglu_backward(uint32_t device, PolychipStream *stream,
                                         const PolychipSwigluBackwardArgs *args) {
    const char *op = "swiglu_backward";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipSwigluBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view gate;
    cobalt_view up;
    cobalt_view grad_out;
    cobalt_view grad_gate;
    cobalt_view grad_up;
    const cobalt_arg list[] = {{&gate, &args->gate, "gate"},
                               {&up, &args->up, "up"},
                               {&grad_out, &args->grad_out, "grad_out"},
                               {&grad_gate, &args->grad_gate, "grad_gate"},
                               {&grad_up, &args->grad_up, "grad_up"}};
    return cobalt_pointwise(op, device, list, 3, 2, f_swiglu_backward, 0.0);
}
