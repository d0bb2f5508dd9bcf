/*
 * Checks of the training-step operators ABI 1.1 added: embedding (i32 and
 * i64 indices, a 0-dim index, out-of-range indices refused before anything
 * is written), embedding_backward (accumulating, repeated indices, an f16
 * table rounded once), cross_entropy and its backward (an ignored row,
 * every row ignored, bad targets), and one AdamW step (f32 and bf16, step
 * 0 refused). Expected values are computed here in double.
 */

#include "driver.h"

static void check_embedding(void) {
    CHECK(OPS->embedding && OPS->embedding_backward, "embedding is missing");
    double w[15];
    for (int v = 0; v < 5; v++) {
        for (int h = 0; h < 3; h++) {
            w[v * 3 + h] = v * 10 + h;
        }
    }
    int64_t ws[2] = {5, 3};
    void *dw = upload_as(F32, w, 15);
    int64_t ix[4] = {4, 0, 4, 2};
    void *di = upload(ix, sizeof ix);
    void *dout = device_alloc(12 * 4);
    PolychipEmbeddingArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.weight = tensor(dw, F32, 2, ws, NULL, 0);
    a.indices = tensor(di, I64, 2, (int64_t[]){2, 2}, NULL, 0);
    a.out = tensor(dout, F32, 3, (int64_t[]){2, 2, 3}, NULL, 0);
    OK(OPS->embedding(0, NULL, &a));
    double got[15];
    download_as(F32, got, dout, 12);
    for (int i = 0; i < 4; i++) {
        for (int h = 0; h < 3; h++) {
            CHECK(got[i * 3 + h] == w[ix[i] * 3 + h], "embedding row %d col %d = %g", i, h, got[i * 3 + h]);
        }
    }
    /* A 0-dim i32 index gives one row [H]. */
    int32_t three = 3;
    void *d3 = upload(&three, sizeof three);
    a.indices = tensor(d3, I32, 0, NULL, NULL, 0);
    a.out = tensor(dout, F32, 1, (int64_t[]){3}, NULL, 0);
    OK(OPS->embedding(0, NULL, &a));
    download_as(F32, got, dout, 3);
    CHECK(got[0] == 30 && got[2] == 32, "embedding of a 0-dim index");
    /* Out of range (5 and -1): an error, and out is untouched. */
    int32_t bad[2] = {1, 5};
    void *dbad = upload(bad, sizeof bad);
    OK(OPS->fill(0, NULL, &(PolychipFillArgs){sizeof(PolychipFillArgs), tensor(dout, F32, 1, (int64_t[]){6}, NULL, 0), -7.0}));
    a.indices = tensor(dbad, I32, 1, (int64_t[]){2}, NULL, 0);
    a.out = tensor(dout, F32, 2, (int64_t[]){2, 3}, NULL, 0);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->embedding(0, NULL, &a));
    download_as(F32, got, dout, 6);
    CHECK(got[0] == -7 && got[5] == -7, "a failed embedding wrote out");
    bad[1] = -1;
    OK(P->memcpy_h2d(0, NULL, dbad, bad, sizeof bad));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->embedding(0, NULL, &a));
    a.indices = tensor(dbad, F32, 1, (int64_t[]){2}, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->embedding(0, NULL, &a));
    a.indices = tensor(di, I64, 1, (int64_t[]){2}, NULL, 0);
    a.out = tensor(dout, F32, 2, (int64_t[]){2, 2}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->embedding(0, NULL, &a));

    /* Backward accumulates, repeated indices add up. */
    double gw0[15];
    double rows[12];
    for (int i = 0; i < 15; i++) {
        gw0[i] = 1.0;
    }
    for (int i = 0; i < 12; i++) {
        rows[i] = 0.5 * i;
    }
    void *dgw = upload_as(F32, gw0, 15);
    void *drows = upload_as(F32, rows, 12);
    PolychipEmbeddingBackwardArgs b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.grad_out = tensor(drows, F32, 3, (int64_t[]){2, 2, 3}, NULL, 0);
    b.indices = tensor(di, I64, 2, (int64_t[]){2, 2}, NULL, 0);
    b.grad_weight = tensor(dgw, F32, 2, ws, NULL, 0);
    OK(OPS->embedding_backward(0, NULL, &b));
    OK(OPS->embedding_backward(0, NULL, &b)); /* twice: everything added twice */
    double want[15];
    memcpy(want, gw0, sizeof want);
    for (int i = 0; i < 4; i++) {
        for (int h = 0; h < 3; h++) {
            want[ix[i] * 3 + h] += 2 * rows[i * 3 + h];
        }
    }
    download_as(F32, got, dgw, 15);
    check_all_close("embedding_backward", got, want, 15, 0.0);
    b.indices = tensor(dbad, I32, 1, (int64_t[]){2}, NULL, 0);
    b.grad_out = tensor(drows, F32, 2, (int64_t[]){2, 3}, NULL, 0);
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->embedding_backward(0, NULL, &b));
    download_as(F32, got, dgw, 15);
    check_all_close("grad_weight after a refused embedding_backward", got, want, 15, 0.0);

    /* f16: 1 + 3 * 2^-11 is a tie rounded once to 1 + 2^-9; per update it would stay 1. */
    double one = 1.0;
    double tiny[3] = {0x1p-11, 0x1p-11, 0x1p-11};
    void *dh = upload_as(F16, &one, 1);
    void *dtiny = upload_as(F16, tiny, 3);
    int64_t zeros[3] = {0, 0, 0};
    void *dz = upload(zeros, sizeof zeros);
    b.grad_out = tensor(dtiny, F16, 2, (int64_t[]){3, 1}, NULL, 0);
    b.indices = tensor(dz, I64, 1, (int64_t[]){3}, NULL, 0);
    b.grad_weight = tensor(dh, F16, 2, (int64_t[]){1, 1}, NULL, 0);
    OK(OPS->embedding_backward(0, NULL, &b));
    uint16_t bits;
    download(&bits, dh, 2);
    CHECK(bits == 0x3C02, "f16 embedding_backward gave 0x%04x, expected 0x3C02", (unsigned)bits);
    void *all[] = {dw, di, dout, d3, dbad, dgw, drows, dh, dtiny, dz};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static void check_cross_entropy(void) {
    CHECK(OPS->cross_entropy && OPS->cross_entropy_backward, "cross_entropy is missing");
    double x[12] = {1, 2, 3, 4, 100, -100, 0, NAN, -1, 0.5, 0.25, 2};
    int64_t t[3] = {2, -100, 0}; /* the middle row is ignored (even its NaN) */
    int64_t shape[2] = {3, 4};
    void *dx = upload_as(F32, x, 12);
    void *dt = upload(t, sizeof t);
    void *dloss = device_alloc(4);
    void *dgrad = device_alloc(12 * 4);
    PolychipCrossEntropyArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.logits = tensor(dx, F32, 2, shape, NULL, 0);
    a.targets = tensor(dt, I64, 1, (int64_t[]){3}, NULL, 0);
    a.loss = tensor(dloss, F32, 0, NULL, NULL, 0);
    a.ignore_index = -100;
    OK(OPS->cross_entropy(0, NULL, &a));
    double lse[3];
    for (int r = 0; r < 3; r += 2) {
        double m = fmax(fmax(x[4 * r], x[4 * r + 1]), fmax(x[4 * r + 2], x[4 * r + 3]));
        double s = 0;
        for (int j = 0; j < 4; j++) {
            s += exp(x[4 * r + j] - m);
        }
        lse[r] = m + log(s);
    }
    double want_loss = ((lse[0] - x[2]) + (lse[2] - x[8])) / 2.0;
    double got[12];
    download_as(F32, got, dloss, 1);
    CHECK(close_to(got[0], want_loss, 2e-7), "cross_entropy = %.9g, expected %.9g", got[0], want_loss);

    PolychipCrossEntropyBackwardArgs b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.logits = a.logits;
    b.targets = a.targets;
    b.grad_logits = tensor(dgrad, F32, 2, shape, NULL, 0);
    b.grad_loss = 2.0;
    b.ignore_index = -100;
    OK(OPS->cross_entropy_backward(0, NULL, &b));
    double want[12];
    for (int r = 0; r < 3; r++) {
        for (int j = 0; j < 4; j++) {
            want[4 * r + j] = r == 1 ? 0.0 : 2.0 * (exp(x[4 * r + j] - lse[r]) - (j == t[r])) / 2.0;
        }
    }
    download_as(F32, got, dgrad, 12);
    check_all_close("cross_entropy_backward", got, want, 12, 2e-7);

    /* i32 targets, all ignored (ignore_index 1): NaN loss, zero gradient. */
    int32_t ones[3] = {1, 1, 1};
    void *d1 = upload(ones, sizeof ones);
    a.targets = tensor(d1, I32, 1, (int64_t[]){3}, NULL, 0);
    a.ignore_index = 1;
    OK(OPS->cross_entropy(0, NULL, &a));
    download_as(F32, got, dloss, 1);
    CHECK(isnan(got[0]), "cross_entropy with every row ignored = %g, expected NaN", got[0]);
    b.targets = a.targets;
    b.ignore_index = 1;
    OK(OPS->cross_entropy_backward(0, NULL, &b));
    download_as(F32, got, dgrad, 12);
    for (int i = 0; i < 12; i++) {
        CHECK(got[i] == 0.0, "gradient with every row ignored [%d] = %g", i, got[i]);
    }
    /* Targets outside [0, C) that are not ignore_index; wrong dtypes and shapes. */
    int64_t bad[3] = {0, 4, 0};
    void *dbad = upload(bad, sizeof bad);
    a.targets = tensor(dbad, I64, 1, (int64_t[]){3}, NULL, 0);
    a.ignore_index = -100;
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->cross_entropy(0, NULL, &a));
    b.targets = a.targets;
    b.ignore_index = -100;
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->cross_entropy_backward(0, NULL, &b));
    a.targets = tensor(dt, I64, 1, (int64_t[]){2}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->cross_entropy(0, NULL, &a));
    a.targets = tensor(dt, I64, 1, (int64_t[]){3}, NULL, 0);
    a.loss = tensor(dloss, F16, 0, NULL, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->cross_entropy(0, NULL, &a));
    a.loss = tensor(dloss, F32, 1, (int64_t[]){1}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->cross_entropy(0, NULL, &a));
    void *all[] = {dx, dt, dloss, dgrad, d1, dbad};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static PolychipAdamwArgs adamw_args(PolychipTensor p, PolychipTensor g, PolychipTensor m,
                                    PolychipTensor v, int64_t step) {
    PolychipAdamwArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.param = p;
    a.grad = g;
    a.exp_avg = m;
    a.exp_avg_sq = v;
    a.lr = 1e-2;
    a.beta1 = 0.9;
    a.beta2 = 0.999;
    a.eps = 1e-8;
    a.weight_decay = 0.1;
    a.step = step;
    return a;
}

static void check_adamw(void) {
    CHECK(OPS->adamw != NULL, "adamw is missing");
    double p[3] = {1, -2, 0.5};
    double g[3] = {0.1, -0.2, 0.3};
    double m[3] = {0, 0.01, -0.02};
    double v[3] = {0, 0.001, 0.002};
    int64_t shape[1] = {3};
    for (int pass = 0; pass < 2; pass++) {
        PolychipDataType dt = pass == 0 ? F32 : BF16;
        double tolerance = pass == 0 ? 2e-7 : 0x1p-8;
        void *dp = upload_as(dt, p, 3);
        void *dg = upload_as(dt, g, 3);
        void *dm = upload_as(F32, m, 3);
        void *dv = upload_as(F32, v, 3);
        PolychipAdamwArgs a = adamw_args(tensor(dp, dt, 1, shape, NULL, 0), tensor(dg, dt, 1, shape, NULL, 0),
                                         tensor(dm, F32, 1, shape, NULL, 0), tensor(dv, F32, 1, shape, NULL, 0), 3);
        OK(OPS->adamw(0, NULL, &a));
        double want_p[3], want_m[3], want_v[3], got[3];
        for (int i = 0; i < 3; i++) {
            double pi = round_to(dt, p[i]);
            double gi = round_to(dt, g[i]);
            pi -= a.lr * a.weight_decay * pi;
            want_m[i] = a.beta1 * round_to(F32, m[i]) + (1 - a.beta1) * gi;
            want_v[i] = a.beta2 * round_to(F32, v[i]) + (1 - a.beta2) * gi * gi;
            double mhat = want_m[i] / (1 - pow(a.beta1, 3));
            double vhat = want_v[i] / (1 - pow(a.beta2, 3));
            want_p[i] = pi - a.lr * mhat / (sqrt(vhat) + a.eps);
        }
        download_as(dt, got, dp, 3);
        check_all_close("adamw param", got, want_p, 3, tolerance);
        download_as(F32, got, dm, 3);
        check_all_close("adamw exp_avg", got, want_m, 3, 2e-7);
        download_as(F32, got, dv, 3);
        check_all_close("adamw exp_avg_sq", got, want_v, 3, 2e-7);
        a.step = 0;
        ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->adamw(0, NULL, &a));
        a.step = 1;
        a.exp_avg = tensor(dm, BF16, 1, shape, NULL, 0);
        ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->adamw(0, NULL, &a));
        a.exp_avg = tensor(dm, F32, 1, (int64_t[]){2}, NULL, 0);
        ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->adamw(0, NULL, &a));
        release(dp);
        release(dg);
        release(dm);
        release(dv);
    }
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->adamw(0, NULL, NULL));
}

void check_training_ops(void) {
    check_embedding();
    check_cross_entropy();
    check_adamw();
}
