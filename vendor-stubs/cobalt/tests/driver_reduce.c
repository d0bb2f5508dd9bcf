/*
 * Checks of the reductions and softmax relatives ABI 1.1 added: sum, mean,
 * max and argmax over a dimension (negative dims, keepdim, NaN, ties, empty
 * dimensions), sum_squares, log_softmax, softmax_backward,
 * log_softmax_backward, and linear (with and without bias, K = 0). Expected
 * values are computed here in double.
 */

#include "driver.h"

static PolychipError *reduce(PolychipReduceFn fn, PolychipTensor input, PolychipTensor out, int dim,
                             int keepdim) {
    PolychipReduceArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.input = input;
    args.out = out;
    args.dim = dim;
    args.keepdim = (uint8_t)keepdim;
    return fn(0, NULL, &args);
}

static void check_reductions(void) {
    CHECK(OPS->sum && OPS->mean && OPS->max && OPS->argmax && OPS->sum_squares,
          "a reduction is missing");
    /* x[a][b][c] = (a * 12 + b * 4 + c) * 0.5 - 3, shape [2, 3, 4]. */
    double x[24];
    for (int i = 0; i < 24; i++) {
        x[i] = i * 0.5 - 3.0;
    }
    int64_t shape[3] = {2, 3, 4};
    void *dx = upload_as(F32, x, 24);
    void *dout = device_alloc(24 * 8);
    PolychipTensor tx = tensor(dx, F32, 3, shape, NULL, 0);
    double got[24];
    double want[24];

    /* sum over dim 1 -> [2, 4]. */
    OK(reduce(OPS->sum, tx, tensor(dout, F32, 2, (int64_t[]){2, 4}, NULL, 0), 1, 0));
    download_as(F32, got, dout, 8);
    for (int a = 0; a < 2; a++) {
        for (int c = 0; c < 4; c++) {
            want[a * 4 + c] = x[a * 12 + c] + x[a * 12 + 4 + c] + x[a * 12 + 8 + c];
        }
    }
    check_all_close("sum(dim 1)", got, want, 8, 0.0);
    /* mean over dim -1 with keepdim -> [2, 3, 1]. */
    OK(reduce(OPS->mean, tx, tensor(dout, F32, 3, (int64_t[]){2, 3, 1}, NULL, 0), -1, 1));
    download_as(F32, got, dout, 6);
    for (int r = 0; r < 6; r++) {
        want[r] = (x[r * 4] + x[r * 4 + 1] + x[r * 4 + 2] + x[r * 4 + 3]) / 4.0;
    }
    check_all_close("mean(dim -1, keepdim)", got, want, 6, 0.0);
    /* max over dim 0 -> [3, 4]. */
    OK(reduce(OPS->max, tx, tensor(dout, F32, 2, (int64_t[]){3, 4}, NULL, 0), 0, 0));
    download_as(F32, got, dout, 12);
    check_all_close("max(dim 0)", got, x + 12, 12, 0.0);

    /* max propagates NaN; argmax picks the first maximum or the first NaN. */
    double rows[12] = {1, 5, 5, 2, /* ties: index 1 */ -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       3, NAN, 9, NAN};
    void *dr = upload_as(F32, rows, 12);
    PolychipTensor tr = tensor(dr, F32, 2, (int64_t[]){3, 4}, NULL, 0);
    OK(reduce(OPS->max, tr, tensor(dout, F32, 1, (int64_t[]){3}, NULL, 0), 1, 0));
    download_as(F32, got, dout, 3);
    CHECK(got[0] == 5 && got[1] == -INFINITY && isnan(got[2]), "max rows: %g %g %g", got[0], got[1],
          got[2]);
    int64_t idx[3];
    OK(reduce(OPS->argmax, tr, tensor(dout, I64, 2, (int64_t[]){3, 1}, NULL, 0), -1, 1));
    download(idx, dout, sizeof idx);
    CHECK(idx[0] == 1 && idx[1] == 0 && idx[2] == 1, "argmax rows: %lld %lld %lld",
          (long long)idx[0], (long long)idx[1], (long long)idx[2]);
    OK(reduce(OPS->argmax, tr, tensor(dout, I64, 1, (int64_t[]){4}, NULL, 0), 0, 0));
    download(idx, dout, 3 * sizeof idx[0]);
    CHECK(idx[0] == 2 && idx[1] == 2 && idx[2] == 2, "argmax columns: %lld %lld %lld",
          (long long)idx[0], (long long)idx[1], (long long)idx[2]);

    /* An empty reduced dimension: sum 0, mean NaN, max -inf, argmax an error. */
    PolychipTensor empty = tensor(NULL, F32, 2, (int64_t[]){2, 0}, NULL, 0);
    PolychipTensor two = tensor(dout, F32, 1, (int64_t[]){2}, NULL, 0);
    OK(reduce(OPS->sum, empty, two, 1, 0));
    download_as(F32, got, dout, 2);
    CHECK(got[0] == 0.0 && got[1] == 0.0, "sum over nothing");
    OK(reduce(OPS->mean, empty, two, 1, 0));
    download_as(F32, got, dout, 2);
    CHECK(isnan(got[0]) && isnan(got[1]), "mean over nothing");
    OK(reduce(OPS->max, empty, two, -1, 0));
    download_as(F32, got, dout, 2);
    CHECK(got[0] == -INFINITY, "max over nothing");
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT,
        reduce(OPS->argmax, empty, tensor(dout, I64, 1, (int64_t[]){2}, NULL, 0), 1, 0));
    OK(reduce(OPS->sum, empty, tensor(NULL, F32, 1, (int64_t[]){0}, NULL, 0), 0, 0));

    /* f16 sum rounds once: 1 + 2^-11 + 2^-11 = 1 + 2^-10 exactly (f16 would lose each 2^-11). */
    double halves[3] = {1.0, 0x1p-11, 0x1p-11};
    void *dh = upload_as(F16, halves, 3);
    OK(reduce(OPS->sum, tensor(dh, F16, 1, (int64_t[]){3}, NULL, 0), tensor(dout, F16, 0, NULL, NULL, 0), 0, 0));
    uint16_t bits;
    download(&bits, dout, 2);
    CHECK(bits == 0x3C01, "f16 sum gave 0x%04x, expected 0x3C01", (unsigned)bits);

    /* Errors. */
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, reduce(OPS->sum, tx, two, 3, 0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, reduce(OPS->sum, tx, two, -4, 0));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, reduce(OPS->sum, tx, tensor(dout, F32, 2, (int64_t[]){2, 3}, NULL, 0), 1, 0));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, reduce(OPS->argmax, tr, tensor(dout, F32, 1, (int64_t[]){3}, NULL, 0), 1, 0));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, reduce(OPS->sum, tr, tensor(dout, F16, 1, (int64_t[]){3}, NULL, 0), 1, 0));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH,
        reduce(OPS->sum, tensor(dx, I32, 1, (int64_t[]){3}, NULL, 0), tensor(dout, I32, 0, NULL, NULL, 0), 0, 0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->mean(0, NULL, NULL));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, /* a 0-dim input has no dimension to reduce */
        reduce(OPS->sum, tensor(dx, F32, 0, NULL, NULL, 0), tensor(dout, F32, 0, NULL, NULL, 0), 0, 0));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH,
        reduce(OPS->max, tensor(dx, F64, 1, (int64_t[]){3}, NULL, 0), tensor(dout, F64, 0, NULL, NULL, 0), 0, 0));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, /* out [2, 4] with a zero stride writes elements twice */
        reduce(OPS->sum, tx, tensor(dout, F32, 2, (int64_t[]){2, 4}, (int64_t[]){0, 1}, 0), 1, 0));

    /* sum_squares: every element, a 0-dim f32, from f32 or bf16. */
    PolychipSumSquaresArgs ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    ss.input = tensor(dx, F32, 3, shape, NULL, 0);
    ss.out = tensor(dout, F32, 0, NULL, NULL, 0);
    OK(OPS->sum_squares(0, NULL, &ss));
    double total = 0;
    for (int i = 0; i < 24; i++) {
        total += x[i] * x[i];
    }
    download_as(F32, got, dout, 1);
    CHECK(got[0] == round_to(F32, total), "sum_squares = %g, expected %g", got[0], total);
    void *db = upload_as(BF16, (double[]){3.0, -4.0}, 2);
    ss.input = tensor(db, BF16, 1, (int64_t[]){2}, NULL, 0);
    OK(OPS->sum_squares(0, NULL, &ss));
    download_as(F32, got, dout, 1);
    CHECK(got[0] == 25.0, "bf16 sum_squares = %g", got[0]);
    ss.out = tensor(dout, F32, 1, (int64_t[]){1}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->sum_squares(0, NULL, &ss));
    ss.out = tensor(dout, BF16, 0, NULL, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->sum_squares(0, NULL, &ss));
    void *all[] = {dx, dout, dr, dh, db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static PolychipError *softmax_backward(PolychipSoftmaxBackwardFn fn, PolychipTensor y,
                                       PolychipTensor g, PolychipTensor grad_in) {
    PolychipSoftmaxBackwardArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.out = y;
    args.grad_out = g;
    args.grad_in = grad_in;
    return fn(0, NULL, &args);
}

static void check_softmax_family(void) {
    CHECK(OPS->log_softmax && OPS->softmax_backward && OPS->log_softmax_backward,
          "a softmax relative is missing");
    double x[6] = {1.0, 2.0, 3.0, -1.0, 0.5, 1000.0};
    double g[6] = {0.3, -1.0, 2.0, 1.0, 1.0, -0.5};
    int64_t shape[2] = {2, 3};
    void *dx = upload_as(F32, x, 6);
    void *dout = device_alloc(6 * sizeof(float));
    PolychipSoftmaxArgs ls;
    memset(&ls, 0, sizeof ls);
    ls.struct_size = sizeof ls;
    ls.input = tensor(dx, F32, 2, shape, NULL, 0);
    ls.out = tensor(dout, F32, 2, shape, NULL, 0);
    OK(OPS->log_softmax(0, NULL, &ls));
    double got[6];
    double want[6];
    double y[6]; /* softmax, for the backward checks */
    for (int r = 0; r < 2; r++) {
        double m = fmax(fmax(x[3 * r], x[3 * r + 1]), x[3 * r + 2]);
        double s = exp(x[3 * r] - m) + exp(x[3 * r + 1] - m) + exp(x[3 * r + 2] - m);
        for (int j = 0; j < 3; j++) {
            want[3 * r + j] = x[3 * r + j] - m - log(s);
            y[3 * r + j] = exp(x[3 * r + j] - m) / s;
        }
    }
    download_as(F32, got, dout, 6);
    check_all_close("log_softmax", got, want, 6, 2e-7);
    OK(OPS->log_softmax(0, NULL, &(PolychipSoftmaxArgs){sizeof ls, ls.input, ls.input})); /* in place */
    download_as(F32, got, dx, 6);
    check_all_close("in-place log_softmax", got, want, 6, 2e-7);

    /* softmax_backward: y * (g - sum(g * y)), with y as stored in f32. */
    void *dy = upload_as(F32, y, 6);
    void *dg = upload_as(F32, g, 6);
    OK(softmax_backward(OPS->softmax_backward, tensor(dy, F32, 2, shape, NULL, 0),
                        tensor(dg, F32, 2, shape, NULL, 0), tensor(dout, F32, 2, shape, NULL, 0)));
    for (int r = 0; r < 2; r++) {
        double dot = 0;
        for (int j = 0; j < 3; j++) {
            dot += g[3 * r + j] * round_to(F32, y[3 * r + j]);
        }
        for (int j = 0; j < 3; j++) {
            double yj = round_to(F32, y[3 * r + j]);
            want[3 * r + j] = yj * (g[3 * r + j] - dot);
        }
    }
    download_as(F32, got, dout, 6);
    check_all_close("softmax_backward", got, want, 6, 2e-7);
    /* log_softmax_backward: g - exp(y) * sum(g), y the log-probabilities. */
    double logp[6];
    for (int i = 0; i < 6; i++) {
        logp[i] = round_to(F32, log(y[i]));
    }
    void *dl = upload_as(F32, logp, 6);
    OK(softmax_backward(OPS->log_softmax_backward, tensor(dl, F32, 2, shape, NULL, 0),
                        tensor(dg, F32, 2, shape, NULL, 0), tensor(dg, F32, 2, shape, NULL, 0)));
    for (int r = 0; r < 2; r++) {
        double sum = g[3 * r] + g[3 * r + 1] + g[3 * r + 2];
        for (int j = 0; j < 3; j++) {
            want[3 * r + j] = g[3 * r + j] - exp(logp[3 * r + j]) * sum;
        }
    }
    download_as(F32, got, dg, 6);
    check_all_close("log_softmax_backward (in place)", got, want, 6, 2e-7);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH,
        softmax_backward(OPS->softmax_backward, tensor(dy, F32, 2, shape, NULL, 0),
                         tensor(dg, F32, 1, (int64_t[]){6}, NULL, 0), tensor(dout, F32, 2, shape, NULL, 0)));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH,
        softmax_backward(OPS->softmax_backward, tensor(dy, F32, 2, shape, NULL, 0),
                         tensor(dg, BF16, 2, shape, NULL, 0), tensor(dout, F32, 2, shape, NULL, 0)));
    void *all[] = {dx, dout, dy, dg, dl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static PolychipError *linear(PolychipTensor input, PolychipTensor weight, PolychipTensor bias,
                             PolychipTensor out, int has_bias) {
    PolychipLinearArgs args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.input = input;
    args.weight = weight;
    args.bias = bias;
    args.out = out;
    args.has_bias = (uint8_t)has_bias;
    return OPS->linear(0, NULL, &args);
}

static void check_linear(void) {
    CHECK(OPS->linear != NULL, "linear is missing");
    double in[6] = {1, 2, 3, -1, 0.5, 4};                     /* [2, 1, 3] */
    double w[12] = {1, 0, 0, 0, 1, 0, 1, 1, 1, 0.5, -2, 0.25}; /* [4, 3] */
    double b[4] = {10, 20, 30, 40};
    void *di = upload_as(F32, in, 6);
    void *dw = upload_as(F32, w, 12);
    void *db = upload_as(F32, b, 4);
    void *dout = device_alloc(8 * sizeof(float));
    int64_t si[3] = {2, 1, 3};
    int64_t sw[2] = {4, 3};
    int64_t so[3] = {2, 1, 4};
    PolychipTensor ti = tensor(di, F32, 3, si, NULL, 0);
    PolychipTensor tw = tensor(dw, F32, 2, sw, NULL, 0);
    PolychipTensor tb = tensor(db, F32, 1, (int64_t[]){4}, NULL, 0);
    PolychipTensor to = tensor(dout, F32, 3, so, NULL, 0);
    double want[8];
    double got[8];
    for (int r = 0; r < 2; r++) {
        for (int n = 0; n < 4; n++) {
            want[r * 4 + n] = in[r * 3] * w[n * 3] + in[r * 3 + 1] * w[n * 3 + 1] +
                              in[r * 3 + 2] * w[n * 3 + 2] + b[n];
        }
    }
    OK(linear(ti, tw, tb, to, 1));
    download_as(F32, got, dout, 8);
    check_all_close("linear", got, want, 8, 0.0);
    /* Without bias, the bias descriptor is not even looked at. */
    PolychipTensor junk = tb;
    junk.device.device_type = POLYCHIP_DEVICE_TYPE_CPU;
    OK(linear(ti, tw, junk, to, 0));
    download_as(F32, got, dout, 8);
    for (int i = 0; i < 8; i++) {
        want[i] -= b[i % 4];
    }
    check_all_close("linear without bias", got, want, 8, 0.0);
    /* K = 0: out is the bias. */
    OK(linear(tensor(NULL, F32, 2, (int64_t[]){2, 0}, NULL, 0), tensor(NULL, F32, 2, (int64_t[]){4, 0}, NULL, 0),
              tb, tensor(dout, F32, 2, (int64_t[]){2, 4}, NULL, 0), 1));
    download_as(F32, got, dout, 8);
    CHECK(got[0] == 10 && got[7] == 40, "linear with K = 0");
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, linear(ti, tensor(dw, F32, 2, (int64_t[]){3, 4}, NULL, 0), tb, to, 1));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, linear(ti, tw, tensor(db, F32, 1, (int64_t[]){3}, NULL, 0), to, 1));
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, linear(ti, tw, tb, tensor(dout, F32, 2, (int64_t[]){2, 4}, NULL, 0), 1));
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, linear(ti, tensor(dw, BF16, 2, sw, NULL, 0), tb, to, 1));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, linear(ti, tw, junk, to, 1));
    void *all[] = {di, dw, db, dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

void check_reduce_ops(void) {
    check_reductions();
    check_softmax_family();
    check_linear();
}
