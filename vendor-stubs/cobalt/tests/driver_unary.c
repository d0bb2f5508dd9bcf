/*
 * Checks of the elementwise operators ABI 1.1 added: neg, exp, log, sqrt,
 * rsqrt, tanh, pow_scalar, relu, silu, gelu, their backward operators,
 * swiglu and swiglu_backward, and scale. Expected values are computed here
 * in double (activation derivatives also against central differences of the
 * forward functions), including the IEEE edge cases the ABI documents, one
 * f16 and one bf16 case rounded once, in-place use, and the errors (f64 is
 * not among these operators' dtypes).
 */

#include "driver.h"

static double silu_ref(double x) { return x / (1.0 + exp(-x)); }

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

static double central_difference(double (*f)(double), double x) {
    double h = 1e-5;
    return (f(x + h) - f(x - h)) / (2.0 * h);
}

static PolychipError *unary(PolychipUnaryFn fn, PolychipTensor input, PolychipTensor out) {
    PolychipUnaryArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.input = input;
    args.out = out;
    return fn(0, NULL, &args);
}

static PolychipError *pow_scalar(PolychipTensor input, PolychipTensor out, double exponent) {
    PolychipPowScalarArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.input = input;
    args.out = out;
    args.exponent = exponent;
    return OPS->pow_scalar(0, NULL, &args);
}

static PolychipError *activation_backward(PolychipActivationBackwardFn fn, PolychipTensor grad_out,
                                          PolychipTensor input, PolychipTensor grad_in) {
    PolychipActivationBackwardArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.grad_out = grad_out;
    args.input = input;
    args.grad_in = grad_in;
    return fn(0, NULL, &args);
}

static PolychipError *scale(PolychipTensor t, double alpha) {
    PolychipScaleArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.tensor = t;
    args.alpha = alpha;
    return OPS->scale(0, NULL, &args);
}

enum { N = 10 };
static const double X[N] = {-3.0, -1.5, -0.5, -0.0, 0.0, 0.25, 1.0, 2.0, 4.0, 0.75};

/* Runs `fn` on X in f32 and compares with f applied in double. */
static void check_unary_f32(const char *name, PolychipUnaryFn fn, double (*f)(double)) {
    int64_t shape[2] = {2, 5};
    void *din = upload_as(F32, X, N);
    void *dout = device_alloc(N * sizeof(float));
    OK(unary(fn, tensor(din, F32, 2, shape, NULL, 0), tensor(dout, F32, 2, shape, NULL, 0)));
    double got[N];
    double want[N];
    download_as(F32, got, dout, N);
    for (int i = 0; i < N; i++) {
        want[i] = round_to(F32, f(X[i]));
    }
    check_all_close(name, got, want, N, 2e-7);
    release(din);
    release(dout);
}

static double neg_ref(double x) { return -x; }
static double rsqrt_ref(double x) { return 1.0 / sqrt(x); }
static double relu_ref(double x) { return x > 0 || isnan(x) ? x : 0.0; }

static void check_math(void) {
    CHECK(OPS->neg && OPS->exp && OPS->log && OPS->sqrt && OPS->rsqrt && OPS->tanh && OPS->relu &&
              OPS->silu && OPS->gelu && OPS->pow_scalar,
          "a unary operator is missing");
    check_unary_f32("neg", OPS->neg, neg_ref);
    check_unary_f32("exp", OPS->exp, exp);
    check_unary_f32("log", OPS->log, log);
    check_unary_f32("sqrt", OPS->sqrt, sqrt);
    check_unary_f32("rsqrt", OPS->rsqrt, rsqrt_ref);
    check_unary_f32("tanh", OPS->tanh, tanh);
    check_unary_f32("relu", OPS->relu, relu_ref);
    check_unary_f32("silu", OPS->silu, silu_ref);
    check_unary_f32("gelu", OPS->gelu, gelu_ref);
    /* A few gelu values from the tanh form, rounded: gelu(1) = 0.841192, gelu(-1) = -0.158808. */
    CHECK(fabs(gelu_ref(1.0) - 0.8411919906) < 1e-9 && fabs(gelu_ref(-1.0) + 0.1588080094) < 1e-9,
          "the driver's gelu reference");

    /* IEEE edges: log(0), log(-1), sqrt(-0), rsqrt(0), exp(large), relu(NaN). */
    double edges[4] = {0.0, -1.0, -0.0, 100.0};
    int64_t shape4[1] = {4};
    void *de = upload_as(F32, edges, 4);
    void *dout = device_alloc(4 * sizeof(float));
    PolychipTensor te = tensor(de, F32, 1, shape4, NULL, 0);
    PolychipTensor to = tensor(dout, F32, 1, shape4, NULL, 0);
    double got[4];
    OK(unary(OPS->log, te, to));
    download_as(F32, got, dout, 4);
    CHECK(got[0] == -INFINITY && isnan(got[1]) && got[2] == -INFINITY, "log edges: %g %g %g", got[0],
          got[1], got[2]);
    OK(unary(OPS->sqrt, te, to));
    download_as(F32, got, dout, 4);
    CHECK(got[2] == 0.0 && signbit(got[2]) && isnan(got[1]), "sqrt(-0) = %g, sqrt(-1) = %g", got[2],
          got[1]);
    OK(unary(OPS->rsqrt, te, to));
    download_as(F32, got, dout, 4);
    CHECK(got[0] == INFINITY && got[3] == 0.1f, "rsqrt(0) = %g, rsqrt(100) = %g", got[0], got[3]);
    OK(unary(OPS->exp, te, to));
    download_as(F32, got, dout, 4);
    CHECK(got[3] == INFINITY && got[0] == 1.0, "exp(100) = %g in f32", got[3]);
    double nan_in[4] = {NAN, -2.0, 3.0, -0.0};
    void *dn = upload_as(F32, nan_in, 4);
    OK(unary(OPS->relu, tensor(dn, F32, 1, shape4, NULL, 0), to));
    download_as(F32, got, dout, 4);
    CHECK(isnan(got[0]) && got[1] == 0.0 && got[2] == 3.0 && got[3] == 0.0, "relu(NaN, -2, 3, -0)");

    /* pow_scalar: C pow semantics, including pow(NaN, 0) = 1 and pow(-8, 1/3) = NaN. */
    double bases[4] = {NAN, -8.0, 0.0, 2.0};
    void *db = upload_as(F32, bases, 4);
    PolychipTensor tb = tensor(db, F32, 1, shape4, NULL, 0);
    OK(pow_scalar(tb, to, 0.0));
    download_as(F32, got, dout, 4);
    CHECK(got[0] == 1.0 && got[1] == 1.0 && got[2] == 1.0 && got[3] == 1.0, "pow(x, 0) must be 1");
    OK(pow_scalar(tb, to, 1.0 / 3.0));
    download_as(F32, got, dout, 4);
    CHECK(isnan(got[1]) && got[2] == 0.0 && close_to(got[3], pow(2.0, 1.0 / 3.0), 1e-7), "pow(x, 1/3)");
    OK(pow_scalar(tb, to, -1.0));
    download_as(F32, got, dout, 4);
    CHECK(got[2] == INFINITY && got[3] == 0.5 && got[1] == -0.125, "pow(x, -1)");
    OK(pow_scalar(tb, tb, 2.0)); /* in place */
    download_as(F32, got, db, 4);
    CHECK(isnan(got[0]) && got[1] == 64.0 && got[3] == 4.0, "in-place pow");

    /* f16: exp rounded once to f16; bf16: silu rounded once to bf16; f64 is refused. */
    double small[4] = {0.5, -1.25, 3.0, 0.1};
    void *dh = upload_as(F16, small, 4);
    void *dho = device_alloc(8);
    OK(unary(OPS->exp, tensor(dh, F16, 1, shape4, NULL, 0), tensor(dho, F16, 1, shape4, NULL, 0)));
    download_as(F16, got, dho, 4);
    for (int i = 0; i < 4; i++) {
        double want = round_to(F16, exp(from_f16(to_f16(small[i]))));
        CHECK(got[i] == want, "f16 exp(%g) = %.9g, expected %.9g", small[i], got[i], want);
    }
    void *dbf = upload_as(BF16, small, 4);
    OK(unary(OPS->silu, tensor(dbf, BF16, 1, shape4, NULL, 0), tensor(dbf, BF16, 1, shape4, NULL, 0)));
    download_as(BF16, got, dbf, 4);
    for (int i = 0; i < 4; i++) {
        double want = round_to(BF16, silu_ref(from_bf16(to_bf16(small[i]))));
        CHECK(got[i] == want, "bf16 silu(%g) = %.9g, expected %.9g", small[i], got[i], want);
    }
    void *dd = upload_as(F64, small, 4);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH,
        unary(OPS->tanh, tensor(dd, F64, 1, shape4, NULL, 0), tensor(dd, F64, 1, shape4, NULL, 0)));
    /* An output that writes an element twice (a zero stride) is refused. */
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT,
        unary(OPS->neg, te, tensor(dout, F32, 1, shape4, (int64_t[]){0}, 0)));

    /* Errors: integer dtype, mixed dtypes, shapes, NULL args, a short struct. */
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH,
        unary(OPS->exp, tensor(de, I32, 1, shape4, NULL, 0), tensor(dout, I32, 1, shape4, NULL, 0)));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, unary(OPS->exp, te, tensor(dho, F16, 1, shape4, NULL, 0)));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH,
        unary(OPS->neg, te, tensor(dout, F32, 2, (int64_t[]){2, 2}, NULL, 0)));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->sqrt(0, NULL, NULL));
    PolychipPowScalarArgs small_args;
    memset(&small_args, 0, sizeof small_args);
    small_args.struct_size = offsetof(PolychipPowScalarArgs, exponent);
    small_args.input = te;
    small_args.out = to;
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->pow_scalar(0, NULL, &small_args));
    OK(unary(OPS->exp, tensor(NULL, F32, 1, (int64_t[]){0}, NULL, 0),
             tensor(NULL, F32, 1, (int64_t[]){0}, NULL, 0)));
    void *all[] = {de, dout, dn, db, dh, dho, dbf, dd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static void check_activation_grads(void) {
    CHECK(OPS->relu_backward && OPS->silu_backward && OPS->gelu_backward && OPS->swiglu &&
              OPS->swiglu_backward && OPS->scale,
          "an activation operator is missing");
    double g[N];
    for (int i = 0; i < N; i++) {
        g[i] = 0.5 + 0.25 * i;
    }
    int64_t shape[1] = {N};
    void *dg = upload_as(F32, g, N);
    void *dx = upload_as(F32, X, N);
    void *dout = device_alloc(N * sizeof(float));
    PolychipTensor tg = tensor(dg, F32, 1, shape, NULL, 0);
    PolychipTensor tx = tensor(dx, F32, 1, shape, NULL, 0);
    PolychipTensor to = tensor(dout, F32, 1, shape, NULL, 0);
    double got[N];
    double want[N];
    OK(activation_backward(OPS->relu_backward, tg, tx, to));
    download_as(F32, got, dout, N);
    for (int i = 0; i < N; i++) {
        want[i] = X[i] > 0 ? g[i] : 0.0;
    }
    check_all_close("relu_backward", got, want, N, 0.0);
    OK(activation_backward(OPS->silu_backward, tg, tx, to));
    download_as(F32, got, dout, N);
    for (int i = 0; i < N; i++) {
        want[i] = g[i] * central_difference(silu_ref, X[i]);
    }
    check_all_close("silu_backward", got, want, N, 1e-6);
    OK(activation_backward(OPS->gelu_backward, tg, tx, tx)); /* in place into input */
    download_as(F32, got, dx, N);
    for (int i = 0; i < N; i++) {
        want[i] = g[i] * central_difference(gelu_ref, X[i]);
    }
    check_all_close("gelu_backward", got, want, N, 1e-6);

    /* swiglu = silu(gate) * up, and its backward in place into gate and up. */
    double up[N];
    for (int i = 0; i < N; i++) {
        up[i] = 1.0 - 0.3 * i;
    }
    void *dgate = upload_as(F32, X, N);
    void *dup = upload_as(F32, up, N);
    PolychipTensor tgate = tensor(dgate, F32, 1, shape, NULL, 0);
    PolychipTensor tup = tensor(dup, F32, 1, shape, NULL, 0);
    PolychipSwigluArgs sw;
    memset(&sw, 0, sizeof sw);
    sw.struct_size = sizeof sw;
    sw.gate = tgate;
    sw.up = tup;
    sw.out = to;
    OK(OPS->swiglu(0, NULL, &sw));
    download_as(F32, got, dout, N);
    for (int i = 0; i < N; i++) {
        want[i] = round_to(F32, silu_ref(X[i]) * round_to(F32, up[i]));
    }
    check_all_close("swiglu", got, want, N, 2e-7);
    PolychipSwigluBackwardArgs swb;
    memset(&swb, 0, sizeof swb);
    swb.struct_size = sizeof swb;
    swb.gate = tgate;
    swb.up = tup;
    swb.grad_out = tg;
    swb.grad_gate = tgate;
    swb.grad_up = tup;
    OK(OPS->swiglu_backward(0, NULL, &swb));
    double got_up[N];
    download_as(F32, got, dgate, N);
    download_as(F32, got_up, dup, N);
    double want_up[N];
    for (int i = 0; i < N; i++) {
        double u = round_to(F32, up[i]);
        want[i] = g[i] * u * central_difference(silu_ref, X[i]);
        want_up[i] = g[i] * silu_ref(X[i]);
    }
    check_all_close("swiglu_backward grad_gate", got, want, N, 1e-6);
    check_all_close("swiglu_backward grad_up", got_up, want_up, N, 2e-7);
    swb.grad_up = tensor(dup, F32, 1, (int64_t[]){N - 1}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->swiglu_backward(0, NULL, &swb));

    /* scale in place: f32 strided (every other element), bf16 ties to even. */
    double ones[4] = {1.0, 2.0, 3.0, 4.0};
    void *ds = upload_as(F32, ones, 4);
    OK(scale(tensor(ds, F32, 1, (int64_t[]){2}, (int64_t[]){2}, 0), -0.5));
    download_as(F32, got, ds, 4);
    CHECK(got[0] == -0.5 && got[1] == 2.0 && got[2] == -1.5 && got[3] == 4.0, "strided scale");
    double bf[2] = {1.0, 1.0};
    void *dbf = upload_as(BF16, bf, 2);
    OK(scale(tensor(dbf, BF16, 1, (int64_t[]){1}, NULL, 0), 1.0 + 0x1p-8)); /* tie: stays 1 */
    OK(scale(tensor(dbf, BF16, 1, (int64_t[]){1}, NULL, 2), 1.0 + 3 * 0x1p-8)); /* tie: up */
    uint16_t bits[2];
    download(bits, dbf, sizeof bits);
    CHECK(bits[0] == 0x3F80 && bits[1] == 0x3F82, "bf16 scale gave 0x%04x 0x%04x", (unsigned)bits[0],
          (unsigned)bits[1]);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, scale(tensor(ds, I64, 1, (int64_t[]){2}, NULL, 0), 2.0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->scale(0, NULL, NULL));
    void *all[] = {dg, dx, dout, dgate, dup, ds, dbf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

void check_unary_ops(void) {
    check_math();
    check_activation_grads();
}
