// Elementwise operators, on any strides (each operand comes with its own
// layout; stride 0 broadcasts): binary, unary, pow_scalar, the activation
// backwards (from the input, and since ABI 1.2 from the output),
// swiglu(+backward) and scale. Computed in A (f32, or f64 for
// f64) and rounded once.

#pragma OPENCL FP_CONTRACT OFF

// Operator codes, as the plugin's ops/elementwise.rs numbers them.
#define PC_ADD 0
#define PC_SUB 1
#define PC_MUL 2
#define PC_DIV 3

__kernel void pc_binary(__global const S *a, pc_layout al, __global const S *b, pc_layout bl,
                        __global S *out, pc_layout ol, int op, A alpha, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A x = LD(a, pc_at(&al, i));
    A y = LD(b, pc_at(&bl, i));
    A r;
    switch (op) {
    case PC_ADD: r = x + alpha * y; break;
    case PC_SUB: r = x - alpha * y; break;
    case PC_MUL: r = x * y; break;
    default: r = x / y; break;
    }
    ST(out, pc_at(&ol, i), r);
}

// sigmoid(x) and 1 - sigmoid(x), without cancellation for large x.
inline A pc_sigmoid_c(A x, A *c) {
    A e = exp(-x);
    A s = (A)1 / ((A)1 + e);
    *c = isinf(e) ? (A)1 : e * s;
    return s;
}

#define PC_GELU_K ((A)0.7978845608028654)
#define PC_GELU_C ((A)0.044715)

inline A pc_gelu(A x) {
    A u = PC_GELU_K * (x + PC_GELU_C * x * x * x);
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u)
    A c;
    A s = pc_sigmoid_c(u + u, &c);
    return x * s;
}

#define PC_NEG 0
#define PC_EXP 1
#define PC_LOG 2
#define PC_SQRT 3
#define PC_RSQRT 4
#define PC_TANH 5
#define PC_RELU 6
#define PC_SILU 7
#define PC_GELU 8
#define PC_GELU_ERF 9
#define PC_SIGMOID 10
#define PC_SIN 11
#define PC_COS 12

// sin and cos (ABI 1.3) in double where the device has it (its argument
// reduction is exact for every finite argument, a rotary table's 1e5 rad
// included), rounded once to A; in A otherwise (OpenCL's full profile
// bounds float sin and cos to 4 ULPs).
#if defined(PC_F64) || defined(PC_HAS_FP64)
inline A pc_sin(A x) { return (A)sin((double)x); }
inline A pc_cos(A x) { return (A)cos((double)x); }
#else
inline A pc_sin(A x) { return sin(x); }
inline A pc_cos(A x) { return cos(x); }
#endif

#define PC_FRAC_1_SQRT_2 ((A)0.7071067811865476)
#define PC_FRAC_1_SQRT_2PI ((A)0.3989422804014327)

// The exact GELU, x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 (erfc keeps
// the negative tail accurate where 1 + erf would cancel); -inf gives
// -inf * 0, NaN, as the ABI says.
inline A pc_gelu_erf(A x) { return x * ((A)0.5 * erfc(-x * PC_FRAC_1_SQRT_2)); }

// Its derivative, Phi(x) + x phi(x) (NaN at +-inf).
inline A pc_gelu_erf_grad(A x) {
    return (A)0.5 * erfc(-x * PC_FRAC_1_SQRT_2) + x * (PC_FRAC_1_SQRT_2PI * exp((A)-0.5 * x * x));
}

// sigmoid(x), as e^x / (1 + e^x) for negative x so the tail keeps its
// relative accuracy down to the subnormals.
inline A pc_sigmoid(A x) {
    if (x < (A)0) {
        A e = exp(x);
        return e / ((A)1 + e);
    }
    return (A)1 / ((A)1 + exp(-x));
}

__kernel void pc_unary(__global const S *x, pc_layout xl, __global S *out, pc_layout ol, int op,
                       long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A v = LD(x, pc_at(&xl, i));
    A r, c;
    switch (op) {
    case PC_NEG: r = -v; break;
    case PC_EXP: r = exp(v); break;
    case PC_LOG: r = log(v); break;
    case PC_SQRT: r = sqrt(v); break;
    case PC_RSQRT: r = (A)1 / sqrt(v); break;
    case PC_TANH: r = tanh(v); break;
    case PC_RELU: r = (v <= (A)0) ? (A)0 : v; break;
    case PC_SILU: r = v * pc_sigmoid_c(v, &c); break;
    case PC_GELU: r = pc_gelu(v); break;
    case PC_GELU_ERF: r = pc_gelu_erf(v); break;
    case PC_SIN: r = pc_sin(v); break;
    case PC_COS: r = pc_cos(v); break;
    default: r = pc_sigmoid(v); break;
    }
    ST(out, pc_at(&ol, i), r);
}

__kernel void pc_pow_scalar(__global const S *x, pc_layout xl, __global S *out, pc_layout ol,
                            A exponent, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    ST(out, pc_at(&ol, i), pow(LD(x, pc_at(&xl, i)), exponent));
}

// grad_in = grad_out * f'(x): 0 relu (a select), 1 silu, 2 gelu, 3 gelu_erf.
__kernel void pc_activation_backward(__global const S *g, pc_layout gl, __global const S *x,
                                     pc_layout xl, __global S *out, pc_layout ol, int op, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A go = LD(g, pc_at(&gl, i));
    A v = LD(x, pc_at(&xl, i));
    A d, c, s;
    if (op == 0) {
        // A select, as PyTorch's threshold_backward: 0 even for an infinite
        // or NaN gradient where x <= 0; a NaN x passes the gradient.
        ST(out, pc_at(&ol, i), (v <= (A)0) ? (A)0 : go);
        return;
    } else if (op == 1) {
        s = pc_sigmoid_c(v, &c);
        d = s * ((A)1 + v * c);
    } else if (op == 3) {
        d = pc_gelu_erf_grad(v);
    } else if (fabs(v) > (A)20) {
        // 1 (or 0) to every float's precision; v^2 overflows from 1.8e19
        // on in f32, which made the product below 0 * inf.
        d = (v > (A)0) ? (A)1 : (A)0;
    } else {
        A v2 = v * v;
        A u = PC_GELU_K * (v + PC_GELU_C * v2 * v);
        A du = PC_GELU_K * ((A)1 + (A)3 * PC_GELU_C * v2);
        s = pc_sigmoid_c(u + u, &c);
        // d/dx [x sigmoid(2u)] = s + x * 2 s (1 - s) du
        d = s + v * (A)2 * s * c * du;
    }
    ST(out, pc_at(&ol, i), go * d);
}

// grad_in = grad_out * f'(y) from the activation's output y: 0 sigmoid
// (y (1 - y)), 1 tanh ((1 - y) (1 + y), which does not cancel near |y| = 1).
__kernel void pc_output_backward(__global const S *g, pc_layout gl, __global const S *y,
                                 pc_layout yl, __global S *out, pc_layout ol, int op, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A go = LD(g, pc_at(&gl, i));
    A v = LD(y, pc_at(&yl, i));
    A d = (op == 0) ? v * ((A)1 - v) : ((A)1 - v) * ((A)1 + v);
    ST(out, pc_at(&ol, i), go * d);
}

__kernel void pc_swiglu(__global const S *gate, pc_layout gl, __global const S *up, pc_layout ul,
                        __global S *out, pc_layout ol, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A g = LD(gate, pc_at(&gl, i));
    A u = LD(up, pc_at(&ul, i));
    A c;
    ST(out, pc_at(&ol, i), g * pc_sigmoid_c(g, &c) * u);
}

__kernel void pc_swiglu_backward(__global const S *gate, pc_layout gl, __global const S *up,
                                 pc_layout ul, __global const S *go, pc_layout gol,
                                 __global S *dgate, pc_layout dgl, __global S *dup, pc_layout dul,
                                 long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A g = LD(gate, pc_at(&gl, i));
    A u = LD(up, pc_at(&ul, i));
    A o = LD(go, pc_at(&gol, i));
    A c;
    A s = pc_sigmoid_c(g, &c);
    A silu = g * s;
    A dsilu = s * ((A)1 + g * c);
    long gi = pc_at(&dgl, i), ui = pc_at(&dul, i);
    ST(dgate, gi, o * u * dsilu);
    ST(dup, ui, o * silu);
}

__kernel void pc_scale(__global S *x, pc_layout xl, A alpha, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    long j = pc_at(&xl, i);
    ST(x, j, LD(x, j) * alpha);
}

// The comparisons of ABI 1.3 on a floating dtype (values widened exactly
// to A; IEEE: only != is true with NaN, -0 == +0): 0 eq, 1 ne, 2 lt, 3 le,
// 4 gt, 5 ge. out is bool (uchar).
__kernel void pc_compare(__global const S *a, pc_layout al, __global const S *b, pc_layout bl,
                         __global uchar *out, pc_layout ol, int op, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A x = LD(a, pc_at(&al, i));
    A y = LD(b, pc_at(&bl, i));
    int r;
    switch (op) {
    case 0: r = x == y; break;
    case 1: r = x != y; break;
    case 2: r = x < y; break;
    case 3: r = x <= y; break;
    case 4: r = x > y; break;
    default: r = x >= y; break;
    }
    out[pc_at(&ol, i)] = (uchar)(r ? 1 : 0);
}
