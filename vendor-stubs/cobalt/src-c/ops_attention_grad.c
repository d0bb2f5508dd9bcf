/*
 * The Cobalt attention_backward of ABI 1.1: the exact gradients of
 * attention (see ops_attention.c for the forward and its geometry) with
 * respect to q, k and v.
 *
 * For each query row i of head h (key/value head h / group), over the keys
 * it sees, in double:
 *   P_j  = exp(scale * q_i . k_j - lse_i)      (the saved f32 lse)
 *   dP_j = grad_out_i . v_j,   D = grad_out_i . out_i,   dS_j = P_j (dP_j - D)
 *   grad_q_i  = scale * sum_j dS_j k_j
 *   grad_k_j += scale * dS_j q_i,   grad_v_j += P_j grad_out_i
 * grad_k and grad_v sum over every query head that shares the key/value
 * head. Like FlashAttention (and the conformance reference), the saved out
 * and lse are used as given rather than recomputed: D = sum_j P_j dP_j
 * exactly when out and lse are the forward's. A query that sees no key
 * contributes nothing (its grad_q is zero). The gradients are written, not
 * accumulated, and each is rounded once.
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

/* The gradients of one query row; `p` and `dp` are scratch for seq_kv values. */
static void row_backward(const cobalt_attention_dims *dims, const double *q_row,
                         const double *go_row, const double *out_row, double lse,
                         const double *k_head, const double *v_head, int64_t visible,
                         double scale, double *p, double *dp, double *gq_row, double *gk_head,
                         double *gv_head) {
    int64_t d = dims->d;
    double delta = 0.0; /* D = grad_out_i . out_i */
    for (int64_t c = 0; c < d; c++) {
        gq_row[c] = 0.0;
        delta += go_row[c] * out_row[c];
    }
    for (int64_t j = 0; j < visible; j++) {
        double dot = 0.0;
        double dot_v = 0.0;
        for (int64_t c = 0; c < d; c++) {
            dot += q_row[c] * k_head[j * d + c];
            dot_v += go_row[c] * v_head[j * d + c];
        }
        p[j] = exp(scale * dot - lse);
        dp[j] = dot_v;
    }
    for (int64_t j = 0; j < visible; j++) {
        double ds = p[j] * (dp[j] - delta);
        for (int64_t c = 0; c < d; c++) {
            gq_row[c] += scale * ds * k_head[j * d + c];
            gk_head[j * d + c] += scale * ds * q_row[c];
            gv_head[j * d + c] += p[j] * go_row[c];
        }
    }
}

PolychipError *cobalt_op_attention_backward(uint32_t device, PolychipStream *stream,
                                            const PolychipAttentionBackwardArgs *args) {
    const char *op = "attention_backward";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipAttentionBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view q, k, v, out, grad_out, grad_q, grad_k, grad_v, lse;
    const cobalt_arg list[] = {{&q, &args->q, "q"},
                               {&k, &args->k, "k"},
                               {&v, &args->v, "v"},
                               {&out, &args->out, "out"},
                               {&grad_out, &args->grad_out, "grad_out"},
                               {&grad_q, &args->grad_q, "grad_q"},
                               {&grad_k, &args->grad_k, "grad_k"},
                               {&grad_v, &args->grad_v, "grad_v"},
                               {&lse, &args->lse, "lse"}};
    cobalt_attention_dims dims;
    error = cobalt_views(op, device, list, 9);
    error = error ? error : cobalt_need_float(op, list, 8);
    error = error ? error : cobalt_need_f32(op, "lse", &lse, "log-sum-exp statistics");
    error = error ? error : cobalt_attention_dims_of(op, &q, &k, &v, &dims);
    error = error ? error : cobalt_need_shape(op, "out", &out, "q", &q, 4, q.shape);
    error = error ? error : cobalt_need_shape(op, "grad_out", &grad_out, "q", &q, 4, q.shape);
    error = error ? error : cobalt_need_shape(op, "grad_q", &grad_q, "q", &q, 4, q.shape);
    error = error ? error : cobalt_need_shape(op, "grad_k", &grad_k, "k", &k, 4, k.shape);
    error = error ? error : cobalt_need_shape(op, "grad_v", &grad_v, "v", &v, 4, v.shape);
    error = error ? error : cobalt_need_shape(op, "lse", &lse, "q", &q, 3, q.shape);
    error = error ? error : cobalt_need_writable(op, "grad_q", &grad_q);
    error = error ? error : cobalt_need_writable(op, "grad_k", &grad_k);
    error = error ? error : cobalt_need_writable(op, "grad_v", &grad_v);
    if (error != NULL) {
        return error;
    }
    /* Inputs, then the three gradients, then per-row scratch. */
    enum { Q, K, V, GRAD_OUT, OUT, LSE, GQ, GK, GV, P, DP, COUNT };
    double *buf[COUNT] = {NULL};
    const cobalt_view *inputs[] = {&q, &k, &v, &grad_out, &out, &lse};
    for (int i = Q; error == NULL && i <= LSE; i++) {
        error = cobalt_load_f64(op, inputs[i], &buf[i]);
    }
    const int64_t sizes[] = {q.numel, k.numel, v.numel, dims.seq_kv, dims.seq_kv};
    for (int i = GQ; error == NULL && i < COUNT; i++) {
        buf[i] = cobalt_scratch(op, sizes[i - GQ], sizeof(double), &error);
    }
    for (int64_t i = 0; error == NULL && i < k.numel; i++) {
        buf[GK][i] = 0.0;
        buf[GV][i] = 0.0;
    }
    int64_t d = dims.d;
    for (int64_t b = 0; error == NULL && b < dims.batch; b++) {
        for (int64_t h = 0; h < dims.heads_q; h++) {
            int64_t kv_head = (b * dims.heads_kv + h / dims.group) * dims.seq_kv * d;
            for (int64_t i = 0; i < dims.seq_q; i++) {
                int64_t row = (b * dims.heads_q + h) * dims.seq_q + i;
                row_backward(&dims, buf[Q] + row * d, buf[GRAD_OUT] + row * d, buf[OUT] + row * d,
                             buf[LSE][row], buf[K] + kv_head, buf[V] + kv_head,
                             cobalt_attention_visible(&dims, args->causal != 0, i), args->scale,
                             buf[P], buf[DP], buf[GQ] + row * d, buf[GK] + kv_head,
                             buf[GV] + kv_head);
            }
        }
    }
    error = error ? error : cobalt_store_f64(op, &grad_q, buf[GQ]);
    error = error ? error : cobalt_store_f64(op, &grad_k, buf[GK]);
    error = error ? error : cobalt_store_f64(op, &grad_v, buf[GV]);
    for (int i = 0; i < COUNT; i++) {
        cobalt_scratch_free(buf[i]);
    }
    return error;
}
