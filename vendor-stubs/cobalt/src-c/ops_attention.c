/*
 * The Cobalt scaled-dot-product attention of ABI 1.1 (forward), and the
 * geometry checks it shares with attention_backward.
 *
 * q is [batch, heads_q, seq_q, D]; k and v are [batch, heads_kv, seq_kv, D]
 * with heads_q a multiple of heads_kv, query head h using key/value head
 * h / (heads_q / heads_kv) (grouped-query attention). With causal, query i
 * sees keys j <= i + (seq_kv - seq_q), aligned at the end; a query that
 * sees no key gets zeros and lse = -inf. For each query row, naively
 * (O(seq_q * seq_kv) per head, in double):
 *   s_j = scale * q . k_j,  m = max s,  lse = m + log(sum exp(s_j - m)),
 *   out = sum_j exp(s_j - lse) v_j
 * out has q's shape and dtype (q, k, v and out share one floating dtype);
 * lse is f32 [batch, heads_q, seq_q]. Each output is rounded once.
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

PolychipError *cobalt_attention_dims_of(const char *op, const cobalt_view *q, const cobalt_view *k,
                                        const cobalt_view *v, cobalt_attention_dims *dims) {
    PolychipError *error = cobalt_need_ndim(op, "q", q, 4, "[batch, heads_q, seq_q, D]");
    error = error ? error : cobalt_need_ndim(op, "k", k, 4, "[batch, heads_kv, seq_kv, D]");
    if (error != NULL) {
        return error;
    }
    char sq[COBALT_SHAPE_STR_BYTES];
    char sk[COBALT_SHAPE_STR_BYTES];
    if (k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3]) {
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: q has shape %s but k has shape %s; their batch (dim 0) and "
                            "head_dim D (dim 3) must be equal",
                            op, cobalt_shape_str(sq, q->ndim, q->shape),
                            cobalt_shape_str(sk, k->ndim, k->shape));
    }
    if (k->shape[1] == 0 || q->shape[1] % k->shape[1] != 0) {
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: q has shape %s and k has shape %s; heads_q = %lld must be a "
                            "multiple of heads_kv = %lld (at least 1)",
                            op, cobalt_shape_str(sq, q->ndim, q->shape),
                            cobalt_shape_str(sk, k->ndim, k->shape), (long long)q->shape[1],
                            (long long)k->shape[1]);
    }
    error = cobalt_need_shape(op, "v", v, "k", k, 4, k->shape);
    if (error != NULL) {
        return error;
    }
    dims->batch = q->shape[0];
    dims->heads_q = q->shape[1];
    dims->seq_q = q->shape[2];
    dims->d = q->shape[3];
    dims->heads_kv = k->shape[1];
    dims->seq_kv = k->shape[2];
    dims->group = dims->heads_q / dims->heads_kv;
    return NULL;
}

int64_t cobalt_attention_visible(const cobalt_attention_dims *dims, int causal, int64_t i) {
    if (!causal) {
        return dims->seq_kv;
    }
    int64_t n = i + (dims->seq_kv - dims->seq_q) + 1; /* keys 0 ..= i + (seq_kv - seq_q) */
    return n < 0 ? 0 : n > dims->seq_kv ? dims->seq_kv : n;
}

/* One query row: out_row (D values) and its lse; `s` is scratch for seq_kv scores. */
static double attend(const cobalt_attention_dims *dims, const double *q_row, const double *k_head,
                     const double *v_head, int64_t visible, double scale, double *s,
                     double *out_row) {
    int64_t d = dims->d;
    for (int64_t c = 0; c < d; c++) {
        out_row[c] = 0.0;
    }
    if (visible == 0) {
        return -INFINITY;
    }
    double max = -INFINITY;
    for (int64_t j = 0; j < visible; j++) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; c++) {
            dot += q_row[c] * k_head[j * d + c];
        }
        s[j] = scale * dot;
        max = s[j] > max || isnan(s[j]) ? s[j] : max;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < visible; j++) {
        s[j] = exp(s[j] - max);
        sum += s[j];
    }
    for (int64_t j = 0; j < visible; j++) {
        double p = s[j] / sum;
        for (int64_t c = 0; c < d; c++) {
            out_row[c] += p * v_head[j * d + c];
        }
    }
    return max + log(sum);
}

PolychipError *cobalt_op_attention(uint32_t device, PolychipStream *stream,
                                   const PolychipAttentionArgs *args) {
    const char *op = "attention";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipAttentionArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view q, k, v, out, lse;
    const cobalt_arg list[] = {{&q, &args->q, "q"},
                               {&k, &args->k, "k"},
                               {&v, &args->v, "v"},
                               {&out, &args->out, "out"},
                               {&lse, &args->lse, "lse"}};
    cobalt_attention_dims dims;
    error = cobalt_views(op, device, list, 5);
    error = error ? error : cobalt_need_float(op, list, 4);
    error = error ? error : cobalt_need_f32(op, "lse", &lse, "log-sum-exp statistics");
    error = error ? error : cobalt_attention_dims_of(op, &q, &k, &v, &dims);
    error = error ? error : cobalt_need_shape(op, "out", &out, "q", &q, 4, q.shape);
    error = error ? error : cobalt_need_shape(op, "lse", &lse, "q", &q, 3, q.shape);
    error = error ? error : cobalt_need_writable(op, "out", &out);
    error = error ? error : cobalt_need_writable(op, "lse", &lse);
    if (error != NULL || lse.numel == 0) {
        return error;
    }
    double *qv = NULL;
    double *kv = NULL;
    double *vv = NULL;
    double *o = NULL;
    double *l = NULL;
    double *s = NULL;
    error = cobalt_load_f64(op, &q, &qv);
    error = error ? error : cobalt_load_f64(op, &k, &kv);
    error = error ? error : cobalt_load_f64(op, &v, &vv);
    o = error ? NULL : cobalt_scratch(op, out.numel, sizeof *o, &error);
    l = error ? NULL : cobalt_scratch(op, lse.numel, sizeof *l, &error);
    s = error ? NULL : cobalt_scratch(op, dims.seq_kv, sizeof *s, &error);
    int64_t d = dims.d;
    for (int64_t b = 0; error == NULL && b < dims.batch; b++) {
        for (int64_t h = 0; h < dims.heads_q; h++) {
            int64_t kv_head = (b * dims.heads_kv + h / dims.group) * dims.seq_kv * d;
            for (int64_t i = 0; i < dims.seq_q; i++) {
                int64_t row = (b * dims.heads_q + h) * dims.seq_q + i;
                l[row] = attend(&dims, qv + row * d, kv + kv_head, vv + kv_head,
                                cobalt_attention_visible(&dims, args->causal != 0, i), args->scale,
                                s, o + row * d);
            }
        }
    }
    error = error ? error : cobalt_store_f64(op, &out, o);
    error = error ? error : cobalt_store_f64(op, &lse, l);
    void *all[] = {qv, kv, vv, o, l, s};
    cobalt_free_all(all, 6);
    return error;
}
