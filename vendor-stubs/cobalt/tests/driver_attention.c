/*
 * Checks of attention and attention_backward (ABI 1.1): one head and two
 * causal positions worked by hand; grouped-query attention (4 query heads
 * sharing 2 key/value heads) with and without the causal mask and with
 * seq_q != seq_kv; queries that see no key (zeros, lse = -inf); the
 * backward against central differences of a double reference (grad_k and
 * grad_v summed over the query heads of a group); a bf16 case; and the
 * shape and dtype errors.
 */

#include "driver.h"

/* The reference's geometry and inputs (f32-exact values); numeric_grad perturbs them. */
enum { MAXN = 2 * 4 * 5 * 4 };
static int nb, hq, hkv, sq, skv, dd, causal;
static double scale_;
static double rq[MAXN], rk[MAXN], rv[MAXN], rg[MAXN];

static void attention_ref(double *out, double *lse) {
    int group = hq / hkv;
    for (int b = 0; b < nb; b++) {
        for (int h = 0; h < hq; h++) {
            int kh = h / group;
            for (int i = 0; i < sq; i++) {
                const double *q = rq + ((b * hq + h) * sq + i) * dd;
                double *o = out + ((b * hq + h) * sq + i) * dd;
                double s[8];
                int n = 0;
                double m = -INFINITY;
                for (int j = 0; j < skv; j++) {
                    if (causal && j > i + (skv - sq)) {
                        break;
                    }
                    const double *k = rk + ((b * hkv + kh) * skv + j) * dd;
                    s[n] = 0;
                    for (int c = 0; c < dd; c++) {
                        s[n] += q[c] * k[c];
                    }
                    s[n] *= scale_;
                    m = fmax(m, s[n]);
                    n++;
                }
                double sum = 0;
                for (int j = 0; j < n; j++) {
                    sum += exp(s[j] - m);
                }
                lse[(b * hq + h) * sq + i] = n ? m + log(sum) : -INFINITY;
                for (int c = 0; c < dd; c++) {
                    o[c] = 0;
                    for (int j = 0; j < n; j++) {
                        o[c] += exp(s[j] - m) / sum * rv[((b * hkv + kh) * skv + j) * dd + c];
                    }
                }
            }
        }
    }
}

static double attention_loss(void) {
    double out[MAXN];
    double lse[MAXN];
    attention_ref(out, lse);
    double loss = 0;
    for (int i = 0; i < nb * hq * sq * dd; i++) {
        loss += rg[i] * out[i];
    }
    return loss;
}

/* Sets the geometry and deterministic f32-exact inputs. */
static void setup(int b, int heads_q, int heads_kv, int seq_q, int seq_kv, int d, int is_causal) {
    nb = b, hq = heads_q, hkv = heads_kv, sq = seq_q, skv = seq_kv, dd = d, causal = is_causal;
    scale_ = 1.0 / sqrt((double)d);
    for (int i = 0; i < MAXN; i++) {
        rq[i] = round_to(F32, sin(0.7 * i + 0.1));
        rk[i] = round_to(F32, cos(1.3 * i));
        rv[i] = round_to(F32, sin(0.37 * i - 1.0) * 2.0);
        rg[i] = round_to(F32, cos(0.9 * i + 0.5));
    }
}

typedef struct devices {
    void *q, *k, *v, *out, *lse, *g, *gq, *gk, *gv;
} devices;

static devices upload_all(PolychipDataType dtype) {
    devices d;
    size_t nq = (size_t)(nb * hq * sq * dd);
    size_t nk = (size_t)(nb * hkv * skv * dd);
    d.q = upload_as(dtype, rq, nq);
    d.k = upload_as(dtype, rk, nk);
    d.v = upload_as(dtype, rv, nk);
    d.g = upload_as(dtype, rg, nq);
    d.out = device_alloc(nq * 4);
    d.lse = device_alloc((size_t)(nb * hq * sq) * 4);
    d.gq = device_alloc(nq * 4);
    d.gk = device_alloc(nk * 4);
    d.gv = device_alloc(nk * 4);
    return d;
}

static void release_all(devices *d) {
    void *all[] = {d->q, d->k, d->v, d->out, d->lse, d->g, d->gq, d->gk, d->gv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        release(all[i]);
    }
}

static int64_t qshape[4], kshape[4], lshape[3];

static PolychipAttentionArgs forward_args(const devices *d, PolychipDataType dtype) {
    int64_t q[4] = {nb, hq, sq, dd};
    int64_t k[4] = {nb, hkv, skv, dd};
    memcpy(qshape, q, sizeof q);
    memcpy(kshape, k, sizeof k);
    memcpy(lshape, q, sizeof lshape);
    PolychipAttentionArgs a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = tensor(d->q, dtype, 4, qshape, NULL, 0);
    a.k = tensor(d->k, dtype, 4, kshape, NULL, 0);
    a.v = tensor(d->v, dtype, 4, kshape, NULL, 0);
    a.out = tensor(d->out, dtype, 4, qshape, NULL, 0);
    a.lse = tensor(d->lse, F32, 3, lshape, NULL, 0);
    a.scale = scale_;
    a.causal = (uint8_t)causal;
    return a;
}

/* Forward and (for f32) backward against the references. */
static void run_case(const char *what, PolychipDataType dtype, double tolerance, int backward) {
    for (int i = 0; i < MAXN; i++) { /* the reference sees what the device holds */
        rq[i] = round_to(dtype, rq[i]);
        rk[i] = round_to(dtype, rk[i]);
        rv[i] = round_to(dtype, rv[i]);
        rg[i] = round_to(dtype, rg[i]);
    }
    devices d = upload_all(dtype);
    PolychipAttentionArgs a = forward_args(&d, dtype);
    OK(OPS->attention(0, NULL, &a));
    int nq = nb * hq * sq * dd;
    int nk = nb * hkv * skv * dd;
    int nl = nb * hq * sq;
    double want[MAXN], got[MAXN], want_lse[MAXN], got_lse[MAXN];
    attention_ref(want, want_lse);
    download_as(dtype, got, d.out, (size_t)nq);
    download_as(F32, got_lse, d.lse, (size_t)nl);
    printf("checking attention: %s\n", what);
    check_all_close("attention out", got, want, (size_t)nq, tolerance);
    check_all_close("attention lse", got_lse, want_lse, (size_t)nl, 1e-6);
    if (!backward) {
        release_all(&d);
        return;
    }
    PolychipAttentionBackwardArgs b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = a.q;
    b.k = a.k;
    b.v = a.v;
    b.out = a.out;
    b.lse = a.lse;
    b.grad_out = tensor(d.g, dtype, 4, qshape, NULL, 0);
    b.grad_q = tensor(d.gq, dtype, 4, qshape, NULL, 0);
    b.grad_k = tensor(d.gk, dtype, 4, kshape, NULL, 0);
    b.grad_v = tensor(d.gv, dtype, 4, kshape, NULL, 0);
    b.scale = a.scale;
    b.causal = a.causal;
    OK(OPS->attention_backward(0, NULL, &b));
    numeric_grad(attention_loss, rq, (size_t)nq, want);
    download_as(dtype, got, d.gq, (size_t)nq);
    check_all_close("attention_backward grad_q", got, want, (size_t)nq, 1e-5);
    numeric_grad(attention_loss, rk, (size_t)nk, want);
    download_as(dtype, got, d.gk, (size_t)nk);
    check_all_close("attention_backward grad_k", got, want, (size_t)nk, 1e-5);
    numeric_grad(attention_loss, rv, (size_t)nk, want);
    download_as(dtype, got, d.gv, (size_t)nk);
    check_all_close("attention_backward grad_v", got, want, (size_t)nk, 1e-5);
    release_all(&d);
}

static void check_by_hand(void) {
    /* One head, two positions, causal, D = 2, scale 1. */
    setup(1, 1, 1, 2, 2, 2, 1);
    double q[4] = {1, 0, 0.5, 1};
    double k[4] = {1, 1, -1, 2};
    double v[4] = {1, 2, 3, -4};
    memcpy(rq, q, sizeof q);
    memcpy(rk, k, sizeof k);
    memcpy(rv, v, sizeof v);
    scale_ = 1.0;
    devices d = upload_all(F32);
    PolychipAttentionArgs a = forward_args(&d, F32);
    OK(OPS->attention(0, NULL, &a));
    double out[4], lse[2];
    download_as(F32, out, d.out, 4);
    download_as(F32, lse, d.lse, 2);
    /* Query 0 sees key 0 only (score 1); query 1 sees scores 1.5 and 1.5. */
    CHECK(out[0] == 1 && out[1] == 2 && lse[0] == 1.0, "query 0: out %g %g, lse %g", out[0], out[1], lse[0]);
    CHECK(close_to(out[2], 2.0, 1e-7) && close_to(out[3], -1.0, 1e-7) &&
              close_to(lse[1], 1.5 + log(2.0), 1e-7),
          "query 1: out %g %g, lse %g", out[2], out[3], lse[1]);
    release_all(&d);
}

static void check_errors(void) {
    setup(1, 4, 2, 3, 5, 4, 1);
    devices d = upload_all(F32);
    PolychipAttentionArgs a = forward_args(&d, F32);
    int64_t bad_heads[4] = {1, 3, 3, 4};
    a.q = tensor(d.q, F32, 4, bad_heads, NULL, 0);
    a.out = tensor(d.out, F32, 4, bad_heads, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->attention(0, NULL, &a)); /* 3 heads over 2 */
    a = forward_args(&d, F32);
    a.v = tensor(d.v, F32, 4, (int64_t[]){1, 2, 4, 4}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->attention(0, NULL, &a));
    a = forward_args(&d, F32);
    a.k = tensor(d.k, F32, 4, (int64_t[]){1, 2, 5, 2}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->attention(0, NULL, &a)); /* head_dim differs */
    a = forward_args(&d, F32);
    a.lse = tensor(d.lse, F16, 3, lshape, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->attention(0, NULL, &a));
    a = forward_args(&d, F32);
    a.v = tensor(d.v, BF16, 4, kshape, NULL, 0);
    ERR(POLYCHIP_ERROR_DTYPE_MISMATCH, OPS->attention(0, NULL, &a));
    a = forward_args(&d, F32);
    a.lse = tensor(d.lse, F32, 3, (int64_t[]){1, 4, 2}, NULL, 0);
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->attention(0, NULL, &a));
    int64_t no_kv_heads[4] = {1, 0, 5, 4};
    a = forward_args(&d, F32);
    a.k = tensor(d.k, F32, 4, no_kv_heads, NULL, 0);
    a.v = a.k;
    ERR(POLYCHIP_ERROR_SHAPE_MISMATCH, OPS->attention(0, NULL, &a)); /* heads_kv = 0 */
    a = forward_args(&d, F32);
    a.struct_size = sizeof a - 1; /* every byte of the 1.1 struct is required */
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->attention(0, NULL, &a));
    ERR(POLYCHIP_ERROR_INVALID_ARGUMENT, OPS->attention_backward(0, NULL, NULL));
    release_all(&d);
}

void check_attention_ops(void) {
    CHECK(OPS->attention && OPS->attention_backward, "attention is missing");
    check_by_hand();
    setup(1, 1, 1, 2, 2, 3, 1);
    run_case("1 head, 2 positions, causal", F32, 2e-7, 1);
    setup(2, 4, 2, 3, 5, 4, 1);
    run_case("GQA 4 over 2, causal, seq_q 3 < seq_kv 5", F32, 2e-7, 1);
    setup(2, 4, 2, 3, 3, 4, 0);
    run_case("GQA 4 over 2, not causal", F32, 2e-7, 1);
    setup(1, 2, 1, 3, 1, 2, 1);
    run_case("causal, seq_q 3 > seq_kv 1: two queries see nothing", F32, 2e-7, 1);
    setup(1, 2, 2, 4, 4, 4, 1);
    run_case("bf16", BF16, 0x1p-8, 0);
    check_errors();
}
