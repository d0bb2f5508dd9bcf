/*
 * Checks of the normalisations and rotary embeddings ABI 1.1 added:
 * rms_norm and layer_norm (outputs and f32 statistics against double
 * references, a bf16 case), their backward operators against central
 * differences of those references, and rope / rope_backward in both pair
 * layouts (rotation, inverse, in place). Also the shape and dtype errors.
 */

#include "driver.h"

enum { ROWS = 2, H = 4, NUMEL = ROWS * H };
static const double EPS = 1e-6;
/* Inputs of the references; numeric_grad perturbs them. */
static double nx[NUMEL] = {1, 2, 3, 4, -1, 0.5, 2, -3};
static double nw[H] = {0.5, 1, 2, -1};
static double nb[H] = {0.25, -1, 0, 3};
static double ng[NUMEL] = {1, -2, 0.5, 3, 0.75, 1, -1, 2};

static void rms_ref(double *out, double *inv) {
    for (int r = 0; r < ROWS; r++) {
        double sq = 0;
        for (int j = 0; j < H; j++) {
            sq += nx[r * H + j] * nx[r * H + j];
        }
        inv[r] = 1.0 / sqrt(sq / H + EPS);
        for (int j = 0; j < H; j++) {
            out[r * H + j] = nx[r * H + j] * inv[r] * nw[j];
        }
    }
}

static void layer_ref(double *out, double *mean, double *rstd) {
    for (int r = 0; r < ROWS; r++) {
        double mu = 0;
        for (int j = 0; j < H; j++) {
            mu += nx[r * H + j] / H;
        }
        double var = 0;
        for (int j = 0; j < H; j++) {
            var += (nx[r * H + j] - mu) * (nx[r * H + j] - mu) / H; /* biased */
        }
        mean[r] = mu;
        rstd[r] = 1.0 / sqrt(var + EPS);
        for (int j = 0; j < H; j++) {
            out[r * H + j] = (nx[r * H + j] - mu) * rstd[r] * nw[j] + nb[j];
        }
    }
}

static double rms_loss(void) {
    double out[NUMEL];
    double inv[ROWS];
    rms_ref(out, inv);
    double loss = 0;
    for (int i = 0; i < NUMEL; i++) {
        loss += ng[i] * out[i];
    }
    return loss;
}

static double layer_loss(void) {
    double out[NUMEL];
    double mean[ROWS];
    double rstd[ROWS];
    layer_ref(out, mean, rstd);
    double loss = 0;
    for (int i = 0; i < NUMEL; i++) {
        loss += ng[i] * out[i];
    }
    return loss;
}

static void check_rms_norm(void) {
    CHECK(OPS->rms_norm && OPS->rms_norm_backward, "rms_norm is missing");
    /* The brief's example: rms_norm([1, 2, 3, 4]) with weight 1, eps 1e-6. */
    double ones[4] = {1, 1, 1, 1};
    void *dx1 = upload_as(F32, nx, 4);
    void *dw1 = upload_as(F32, ones, 4);
    void *dout = device_alloc(NUMEL * 8);
    void *dinv = device_alloc(ROWS * 4);
    PolychipRmsNormArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.input = tensor(dx1, F32, 1, (int64_t[]){4}, NULL, 0);
    a.weight = tensor(dw1, F32, 1, (int64_t[]){4}, NULL, 0);
    a.out = tensor(dout, F32, 1, (int64_t[]){4}, NULL, 0);
    a.inv_rms = tensor(dinv, F32, 0, NULL, NULL, 0);
    a.eps = EPS;
    OK(OPS->rms_norm(0, NULL, &a));
    double got[NUMEL];
    double inv_got[ROWS];
    double r = 1.0 / sqrt(7.5 + 1e-6);
    download_as(F32, got, dout, 4);
    download_as(F32, inv_got, dinv, 1);
    CHECK(close_to(inv_got[0], r, 1e-7), "inv_rms = %.9g, expected %.9g", inv_got[0], r);
    check_all_close("rms_norm([1, 2, 3, 4])", got, (double[]){r, 2 * r, 3 * r, 4 * r}, 4, 2e-7);

    /* Two rows, a real weight, then the backward against central differences. */
    int64_t shape[2] = {ROWS, H};
    void *dx = upload_as(F32, nx, NUMEL);
    void *dw = upload_as(F32, nw, H);
    a.input = tensor(dx, F32, 2, shape, NULL, 0);
    a.weight = tensor(dw, F32, 1, (int64_t[]){H}, NULL, 0);
    a.out = tensor(dout, F32, 2, shape, NULL, 0);
    a.inv_rms = tensor(dinv, F32, 1, (int64_t[]){ROWS}, NULL, 0);
    OK(OPS->rms_norm(0, NULL, &a));
    double want[NUMEL];
    double inv_want[ROWS];
    rms_ref(want, inv_want);
    download_as(F32, got, dout, NUMEL);
    download_as(F32, inv_got, dinv, ROWS);
    check_all_close("rms_norm", got, want, NUMEL, 2e-7);
    check_all_close("inv_rms", inv_got, inv_want, ROWS, 1e-7);

    void *dg = upload_as(F32, ng, NUMEL);
    void *dgi = device_alloc(NUMEL * 4);
    void *dgw = device_alloc(H * 4);
    PolychipRmsNormBackwardArgs b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.grad_out = tensor(dg, F32, 2, shape, NULL, 0);
    b.input = a.input;
    b.weight = a.weight;
    b.inv_rms = a.inv_rms;
    b.grad_input = tensor(dgi, F32, 2, shape, NULL, 0);
    b.grad_weight = tensor(dgw, F32, 1, (int64_t[]){H}, NULL, 0);
    OK(OPS->rms_norm_backward(0, NULL, &b));
    numeric_grad(rms_loss, nx, NUMEL, want);
    download_as(F32, got, dgi, NUMEL);
    check_all_close("rms_norm_backward grad_input", got, want, NUMEL, 1e-5);
    numeric_grad(rms_loss, nw, H, want);
    download_as(F32, got, dgw, H);
    check_all_close("rms_norm_backward grad_weight", got, want, H, 1e-5);

    /* bf16 input, weight and out (inv_rms stays f32). */
    void *bx = upload_as(BF16, nx, NUMEL);
    void *bw = upload_as(BF16, nw, H);
    a.input = tensor(bx, BF16, 2, shape, NULL, 0);
    a.weight = tensor(bw, BF16, 1, (int64_t[]){H}, NULL, 0);
    a.out = tensor(dout, BF16, 2, shape, NULL, 0);
    OK(OPS->rms_norm(0, NULL, &a));
    rms_ref(want, inv_want);
    download_as(BF16, got, dout, NUMEL);
    check_all_close("bf16 rms_norm", got, want, NUMEL, 0x1p-8);

    /* Errors: weight shape, statistics dtype and shape, a 0-dim input. */
    a.input = tensor(dx, F32, 2, shape, NULL, 0);
    a.out = tensor(dout, F32, 2, shape, NULL, 0);
    a.weight = tensor(dw, F32, 1, (int64_t[]){3}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->rms_norm(0, NULL, &a));
    a.weight = tensor(dw, F32, 1, (int64_t[]){H}, NULL, 0);
    a.inv_rms = tensor(dinv, BF16, 1, (int64_t[]){ROWS}, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->rms_norm(0, NULL, &a));
    a.inv_rms = tensor(dinv, F32, 2, (int64_t[]){ROWS, 1}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->rms_norm(0, NULL, &a));
    a.weight = tensor(bw, BF16, 1, (int64_t[]){H}, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->rms_norm(0, NULL, &a));
    a.struct_size = offsetof(PolychipRmsNormArgs, eps);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->rms_norm(0, NULL, &a));
    b.grad_weight = tensor(dgw, F32, 1, (int64_t[]){H + 1}, NULL, 0);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->rms_norm_backward(0, NULL, &b)); /* past its allocation */
    b.grad_weight = tensor(dgw, F32, 1, (int64_t[]){H - 1}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->rms_norm_backward(0, NULL, &b));
    void *all[] = {dx1, dw1, dout, dinv, dx, dw, dg, dgi, dgw, bx, bw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static void check_layer_norm(void) {
    CHECK(OPS->layer_norm && OPS->layer_norm_backward, "layer_norm is missing");
    int64_t shape[2] = {ROWS, H};
    int64_t hs[1] = {H};
    int64_t rs[1] = {ROWS};
    void *dx = upload_as(F32, nx, NUMEL);
    void *dw = upload_as(F32, nw, H);
    void *db = upload_as(F32, nb, H);
    void *dout = device_alloc(NUMEL * 4);
    void *dmean = device_alloc(ROWS * 4);
    void *drstd = device_alloc(ROWS * 4);
    PolychipLayerNormArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.input = tensor(dx, F32, 2, shape, NULL, 0);
    a.weight = tensor(dw, F32, 1, hs, NULL, 0);
    a.bias = tensor(db, F32, 1, hs, NULL, 0);
    a.out = tensor(dout, F32, 2, shape, NULL, 0);
    a.mean = tensor(dmean, F32, 1, rs, NULL, 0);
    a.rstd = tensor(drstd, F32, 1, rs, NULL, 0);
    a.eps = EPS;
    OK(OPS->layer_norm(0, NULL, &a));
    double want[NUMEL], got[NUMEL], mean[ROWS], rstd[ROWS], got_mean[ROWS], got_rstd[ROWS];
    layer_ref(want, mean, rstd);
    download_as(F32, got, dout, NUMEL);
    download_as(F32, got_mean, dmean, ROWS);
    download_as(F32, got_rstd, drstd, ROWS);
    check_all_close("layer_norm", got, want, NUMEL, 2e-7);
    check_all_close("layer_norm mean", got_mean, mean, ROWS, 1e-7);
    check_all_close("layer_norm rstd", got_rstd, rstd, ROWS, 1e-7);

    void *dg = upload_as(F32, ng, NUMEL);
    void *dgi = device_alloc(NUMEL * 4);
    void *dgw = device_alloc(H * 4);
    void *dgb = device_alloc(H * 4);
    PolychipLayerNormBackwardArgs b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.grad_out = tensor(dg, F32, 2, shape, NULL, 0);
    b.input = a.input;
    b.weight = a.weight;
    b.mean = a.mean;
    b.rstd = a.rstd;
    b.grad_input = tensor(dgi, F32, 2, shape, NULL, 0);
    b.grad_weight = tensor(dgw, F32, 1, hs, NULL, 0);
    b.grad_bias = tensor(dgb, F32, 1, hs, NULL, 0);
    OK(OPS->layer_norm_backward(0, NULL, &b));
    numeric_grad(layer_loss, nx, NUMEL, want);
    download_as(F32, got, dgi, NUMEL);
    check_all_close("layer_norm_backward grad_input", got, want, NUMEL, 1e-5);
    numeric_grad(layer_loss, nw, H, want);
    download_as(F32, got, dgw, H);
    check_all_close("layer_norm_backward grad_weight", got, want, H, 1e-5);
    numeric_grad(layer_loss, nb, H, want);
    download_as(F32, got, dgb, H);
    check_all_close("layer_norm_backward grad_bias", got, want, H, 1e-5);

    /* No rows: grad_weight and grad_bias are written as zeros. */
    b.grad_out = tensor(NULL, F32, 2, (int64_t[]){0, H}, NULL, 0);
    b.input = b.grad_out;
    b.grad_input = b.grad_out;
    b.mean = tensor(NULL, F32, 1, (int64_t[]){0}, NULL, 0);
    b.rstd = b.mean;
    OK(OPS->layer_norm_backward(0, NULL, &b));
    download_as(F32, got, dgw, H);
    CHECK(got[0] == 0 && got[3] == 0, "grad_weight with no rows should be zeros");

    a.bias = tensor(db, F32, 1, (int64_t[]){H - 1}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->layer_norm(0, NULL, &a));
    a.bias = tensor(db, F32, 1, hs, NULL, 0);
    a.mean = tensor(dmean, F16, 1, rs, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->layer_norm(0, NULL, &a));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->layer_norm_backward(0, NULL, NULL));
    void *all[] = {dx, dw, db, dout, dmean, drstd, dg, dgi, dgw, dgb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

/* rope of x [1, S, HEADS, D] with angle theta(s, j) = (s + 1) * (j + 1) * 0.3, by `sign`. */
enum { S = 2, HEADS = 2, D = 4, RN = S * HEADS * D };

static void rope_ref(const double *x, double *out, int interleaved, double sign) {
    for (int s = 0; s < S; s++) {
        for (int h = 0; h < HEADS; h++) {
            const double *xh = x + (s * HEADS + h) * D;
            double *oh = out + (s * HEADS + h) * D;
            for (int j = 0; j < D / 2; j++) {
                double c = (double)(float)cos((s + 1) * (j + 1) * 0.3);
                double t = sign * (double)(float)sin((s + 1) * (j + 1) * 0.3);
                int ia = interleaved ? 2 * j : j;
                int ib = interleaved ? 2 * j + 1 : j + D / 2;
                oh[ia] = xh[ia] * c - xh[ib] * t;
                oh[ib] = xh[ia] * t + xh[ib] * c;
            }
        }
    }
}

static void check_rope(void) {
    CHECK(OPS->rope && OPS->rope_backward, "rope is missing");
    double x[RN];
    for (int i = 0; i < RN; i++) {
        x[i] = 0.25 * i - 1.5;
    }
    double cs[S * D / 2];
    double sn[S * D / 2];
    for (int s = 0; s < S; s++) {
        for (int j = 0; j < D / 2; j++) {
            cs[s * D / 2 + j] = cos((s + 1) * (j + 1) * 0.3);
            sn[s * D / 2 + j] = sin((s + 1) * (j + 1) * 0.3);
        }
    }
    int64_t shape[4] = {1, S, HEADS, D};
    int64_t tshape[2] = {S, D / 2};
    void *dx = upload_as(F32, x, RN);
    void *dc = upload_as(F32, cs, S * D / 2);
    void *ds = upload_as(F32, sn, S * D / 2);
    void *dout = device_alloc(RN * 4);
    PolychipRopeArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.input = tensor(dx, F32, 4, shape, NULL, 0);
    a.cos = tensor(dc, F32, 2, tshape, NULL, 0);
    a.sin = tensor(ds, F32, 2, tshape, NULL, 0);
    a.out = tensor(dout, F32, 4, shape, NULL, 0);
    double want[RN], got[RN];
    for (int interleaved = 0; interleaved < 2; interleaved++) {
        a.interleaved = (uint8_t)interleaved;
        a.input = tensor(dx, F32, 4, shape, NULL, 0);
        a.out = tensor(dout, F32, 4, shape, NULL, 0);
        OK(OPS->rope(0, NULL, &a));
        rope_ref(x, want, interleaved, 1.0);
        download_as(F32, got, dout, RN);
        check_all_close(interleaved ? "rope (interleaved)" : "rope (half-split)", got, want, RN, 2e-7);
        OK(OPS->rope_backward(0, NULL, &a)); /* rotation by -theta of x */
        rope_ref(x, want, interleaved, -1.0);
        download_as(F32, got, dout, RN);
        check_all_close("rope_backward", got, want, RN, 2e-7);
        /* rope then rope_backward in place gives x back. */
        a.out = a.input;
        OK(OPS->rope(0, NULL, &a));
        OK(OPS->rope_backward(0, NULL, &a));
        download_as(F32, got, dx, RN);
        check_all_close("rope_backward(rope(x)) in place", got, x, RN, 1e-6);
        void *fresh = upload_as(F32, x, RN);
        OK(P->memcpy_d2d(0, NULL, dx, fresh, RN * 4));
        release(fresh);
    }
    a.input = tensor(dx, F32, 4, (int64_t[]){1, S, 1, 3}, NULL, 0);
    a.out = a.input;
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->rope(0, NULL, &a)); /* odd head_dim */
    a.input = tensor(dx, F32, 4, shape, NULL, 0);
    a.out = tensor(dout, F32, 4, shape, NULL, 0);
    a.cos = tensor(dc, F32, 2, (int64_t[]){S, D}, NULL, 0);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->rope(0, NULL, &a)); /* past its allocation */
    a.cos = tensor(dc, F32, 2, (int64_t[]){1, D / 2}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->rope(0, NULL, &a));
    a.cos = tensor(dc, F16, 2, tshape, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->rope(0, NULL, &a));
    a.cos = tensor(dc, F32, 2, tshape, NULL, 0);
    a.input = tensor(dx, F32, 3, shape, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->rope(0, NULL, &a));
    release(dx);
    release(dc);
    release(ds);
    release(dout);
}

void check_norm_ops(void) {
    check_rms_norm();
    check_layer_norm();
    check_rope();
}
