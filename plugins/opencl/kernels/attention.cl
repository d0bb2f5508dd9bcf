// Rotary position embedding (forward and backward) and scaled-dot-product
// attention (forward and backward), flash style. Every tensor is compact
// row-major at an element offset: [batch, heads, seq, D] for attention,
// [batch, seq, heads, D] for rope; lse and the backward's row dots are f32.
//
// Attention: a work-group of PC_ATT_WG = 64 work-items owns a block of
// PC_ATT_R = 64 rows (queries in the forward pass and the dQ pass, keys in
// the dK/dV pass) and streams tiles of PC_ATT_C = 32 of the other side
// through local memory. Work-item (rg = lid / 4, cg = lid % 4) owns rows
// rg + 16 a (a < 4) and, of every 32 columns, the 8 from 8 cg: its blocks
// of score tiles and of the head_dim-wide accumulators are 4 rows of
// 8-wide vectors, which CPU compilers (PoCL) turn into SIMD and GPUs into
// registers. Row-major tiles read along head_dim are broadcast; tiles read
// 8 columns at a time are stored transposed ([D][32]) or padded to
// dp = D rounded up to 8.
//
// Everything accumulates in A (f32 for f32/f16/bf16), with explicit fma
// (the programs compile with FP_CONTRACT OFF from elementwise.cl). Every
// output element is summed by one work-item of one work-group in a fixed
// order: no atomics, deterministic results.

#define PC_ATT_WG 64
#define PC_ATT_R 64
#define PC_ATT_C 32
#define PC_ATT_UNROLL _Pragma("unroll")

#if defined(PC_F64)
typedef double8 pc_att_v;
typedef long8 pc_att_i;
#else
typedef float8 pc_att_v;
typedef int8 pc_att_i;
#endif
#define PC_ATT_LD8(p) vload8(0, (p))
#define PC_ATT_ST8(v, p) vstore8((v), 0, (p))
#define PC_ATT_IOTA ((pc_att_i)(0, 1, 2, 3, 4, 5, 6, 7))

// How many keys (a prefix) query i sees: with causal, keys
// j <= i + (skv - sq), the mask aligned at the end.
inline long pc_att_visible(long i, long sq, long skv, int causal) {
    if (!causal) return skv;
    return clamp(i + 1 + skv - sq, 0L, skv);
}

// Lanes e of a vector with lo <= e < hi, as a select mask.
inline pc_att_i pc_att_lanes(long lo, long hi) {
    lo = clamp(lo, 0L, 8L);
    hi = clamp(hi, 0L, 8L);
    return (PC_ATT_IOTA >= (pc_att_i)lo) & (PC_ATT_IOTA < (pc_att_i)hi);
}

// Rows 0..rows of a [seq, d] head from element base (n of them valid,
// zeros below) into a row-major tile of row stride ld >= d (zero padded).
inline void pc_att_load_rows(__local A *dst, int rows, long ld, __global const S *src, long base,
                             long n, long d, int lid) {
    for (int r = 0; r < rows; ++r)
        for (long t = lid; t < ld; t += PC_ATT_WG)
            dst[r * ld + t] = (r < n && t < d) ? LD(src, base + r * d + t) : (A)0;
}

// The same rows transposed into a [d][rows] tile.
inline void pc_att_load_cols(__local A *dst, int rows, __global const S *src, long base, long n,
                             long d, int lid) {
    for (int r = 0; r < rows; ++r)
        for (long t = lid; t < d; t += PC_ATT_WG)
            dst[t * rows + r] = r < n ? LD(src, base + r * d + t) : (A)0;
}

// Both: a row-major tile of stride ld and a transposed one.
inline void pc_att_load_both(__local A *rowm, long ld, __local A *colm, int rows,
                             __global const S *src, long base, long n, long d, int lid) {
    for (int r = 0; r < rows; ++r)
        for (long t = lid; t < ld; t += PC_ATT_WG) {
            A x = (r < n && t < d) ? LD(src, base + r * d + t) : (A)0;
            rowm[r * ld + t] = x;
            if (t < d) colm[t * rows + r] = x;
        }
}

// Forward. Work-group (query block of 64, batch * heads_q + head); each
// work-item also keeps one query's running maximum m and sum l (in local
// memory), and the unnormalised output o of its blocks.
//   qs [64][d], kt [d][32], vs [32][dp], os [64][dp]
__kernel __attribute__((reqd_work_group_size(PC_ATT_WG, 1, 1))) void
pc_attention_fwd(__global const S *q, long q_off, __global const S *k, long k_off,
                 __global const S *v, long v_off, __global S *out, long out_off,
                 __global float *lse, long lse_off, long hq, long hkv, long sq, long skv, long d,
                 A scale, int causal, __local A *qs, __local A *kt, __local A *vs,
                 __local A *os) {
    __local A ps[PC_ATT_R * PC_ATT_C];
    __local A m_s[PC_ATT_R];
    __local A l_s[PC_ATT_R];
    __local A al_s[PC_ATT_R];
    const int lid = get_local_id(0);
    const int cg = lid % 4;
    const int rg = lid / 4;
    const long i0 = (long)get_group_id(0) * PC_ATT_R;
    const long bh = get_group_id(1);
    const long b = bh / hq;
    const long kvh = (bh - b * hq) / (hq / hkv);
    const long qbase = (bh * sq + i0) * d;
    const long kbase = (b * hkv + kvh) * skv * d;
    const long nq = min((long)PC_ATT_R, sq - i0);
    const long dp = (d + 7) & ~7L;

    pc_att_load_rows(qs, PC_ATT_R, d, q, q_off + qbase, nq, d, lid);
    for (long x = lid; x < PC_ATT_R * dp; x += PC_ATT_WG) os[x] = (A)0;
    m_s[lid] = -A_INF;
    l_s[lid] = (A)0;
    long vis[4];
    PC_ATT_UNROLL for (int a = 0; a < 4; ++a)
        vis[a] = pc_att_visible(i0 + rg + 16 * a, sq, skv, causal);
    const long kend = pc_att_visible(i0 + nq - 1, sq, skv, causal);

    for (long j0 = 0; j0 < kend; j0 += PC_ATT_C) {
        const long nk = min((long)PC_ATT_C, kend - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
        pc_att_load_cols(kt, PC_ATT_C, k, k_off + kbase + j0 * d, nk, d, lid);
        pc_att_load_rows(vs, PC_ATT_C, dp, v, v_off + kbase + j0 * d, nk, d, lid);
        barrier(CLK_LOCAL_MEM_FENCE);

        // Scores, masked to -inf.
        pc_att_v acc[4];
        PC_ATT_UNROLL for (int a = 0; a < 4; ++a) acc[a] = (pc_att_v)0;
        for (long t = 0; t < d; ++t) {
            pc_att_v kv = PC_ATT_LD8(kt + t * PC_ATT_C + 8 * cg);
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a)
                acc[a] = fma((pc_att_v)qs[(rg + 16 * a) * d + t], kv, acc[a]);
        }
        PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
            pc_att_i ok = pc_att_lanes(0, vis[a] - j0 - 8 * cg);
            pc_att_v s = select((pc_att_v)(-A_INF), scale * acc[a], ok);
            PC_ATT_ST8(s, ps + (rg + 16 * a) * PC_ATT_C + 8 * cg);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // Online softmax, one work-item per query.
        {
            __local A *row = ps + lid * PC_ATT_C;
            A m_old = m_s[lid];
            A m_new = m_old;
            // NaN wins from either side (fmax would drop it and leave a
            // row of NaN scores at -inf, taken for one that saw no key).
            for (int j = 0; j < PC_ATT_C; ++j) {
                A x = row[j];
                m_new = (x > m_new || isnan(x)) ? x : m_new;
            }
            if (m_new == -A_INF) {
                for (int j = 0; j < PC_ATT_C; ++j) row[j] = (A)0;
                al_s[lid] = (A)1;
            } else {
                A sum = (A)0;
                for (int j = 0; j < PC_ATT_C; ++j) {
                    A p = exp(row[j] - m_new);
                    row[j] = p;
                    sum += p;
                }
                A alpha = exp(m_old - m_new);
                al_s[lid] = alpha;
                l_s[lid] = fma(l_s[lid], alpha, sum);
                m_s[lid] = m_new;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // o = alpha o + P v.
        A al[4];
        PC_ATT_UNROLL for (int a = 0; a < 4; ++a) al[a] = al_s[rg + 16 * a];
        for (long c0 = 8 * cg; c0 < dp; c0 += 32) {
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) acc[a] = (pc_att_v)0;
            for (int j = 0; j < nk; ++j) {
                pc_att_v vv = PC_ATT_LD8(vs + j * dp + c0);
                PC_ATT_UNROLL for (int a = 0; a < 4; ++a)
                    acc[a] = fma((pc_att_v)ps[(rg + 16 * a) * PC_ATT_C + j], vv, acc[a]);
            }
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                __local A *o = os + (rg + 16 * a) * dp + c0;
                PC_ATT_ST8(fma(PC_ATT_LD8(o), (pc_att_v)al[a], acc[a]), o);
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    // l is 0 only for a query that saw no key (zeros, lse = -inf); it is
    // NaN, never 0, once a NaN or +inf score reached the row's maximum.
    for (int r = 0; r < nq; ++r) {
        A l = l_s[r];
        for (long t = lid; t < d; t += PC_ATT_WG)
            ST(out, out_off + qbase + r * d + t, l != (A)0 ? os[r * dp + t] / l : (A)0);
    }
    if (lid < nq) {
        A l = l_s[lid];
        lse[lse_off + bh * sq + i0 + lid] = l != (A)0 ? (float)(m_s[lid] + log(l)) : -INFINITY;
    }
}

// Backward, first pass: dvec[row] = dO[row] . out[row] over the
// batch * heads_q * seq_q rows.
__kernel void pc_attention_bwd_rowdot(__global const S *go, long go_off, __global const S *o,
                                      long o_off, __global float *dvec, long d, long rows) {
    long r = get_global_id(0);
    if (r >= rows) return;
    A s = (A)0;
    for (long t = 0; t < d; ++t) s = fma(LD(go, go_off + r * d + t), LD(o, o_off + r * d + t), s);
    dvec[r] = (float)s;
}

// Backward, dQ: work-group (query block of 64, batch * heads_q + head).
// With P = exp(scale q k^T - lse) on visible keys (0 elsewhere, and on
// rows with lse = -inf), dS = P (dO v^T - dvec) and dQ = scale dS k, over
// the visible key tiles.
//   qs, gos [64][d], kt, vt [d][32], ks [32][dp], dqs [64][dp]
__kernel __attribute__((reqd_work_group_size(PC_ATT_WG, 1, 1))) void
pc_attention_bwd_dq(__global const S *q, long q_off, __global const S *k, long k_off,
                    __global const S *v, long v_off, __global const S *go, long go_off,
                    __global const float *lse, long lse_off, __global const float *dvec,
                    __global S *gq, long gq_off, long hq, long hkv, long sq, long skv, long d,
                    A scale, int causal, __local A *qs, __local A *gos, __local A *kt,
                    __local A *vt, __local A *ks, __local A *dqs) {
    __local A ds[PC_ATT_R * PC_ATT_C];
    __local A lse_s[PC_ATT_R];
    __local A dv_s[PC_ATT_R];
    const int lid = get_local_id(0);
    const int cg = lid % 4;
    const int rg = lid / 4;
    const long i0 = (long)get_group_id(0) * PC_ATT_R;
    const long bh = get_group_id(1);
    const long b = bh / hq;
    const long kvh = (bh - b * hq) / (hq / hkv);
    const long qbase = (bh * sq + i0) * d;
    const long kbase = (b * hkv + kvh) * skv * d;
    const long nq = min((long)PC_ATT_R, sq - i0);
    const long dp = (d + 7) & ~7L;

    pc_att_load_rows(qs, PC_ATT_R, d, q, q_off + qbase, nq, d, lid);
    pc_att_load_rows(gos, PC_ATT_R, d, go, go_off + qbase, nq, d, lid);
    for (long x = lid; x < PC_ATT_R * dp; x += PC_ATT_WG) dqs[x] = (A)0;
    lse_s[lid] = lid < nq ? (A)lse[lse_off + bh * sq + i0 + lid] : -A_INF;
    dv_s[lid] = lid < nq ? (A)dvec[bh * sq + i0 + lid] : (A)0;
    long vis[4];
    PC_ATT_UNROLL for (int a = 0; a < 4; ++a)
        vis[a] = pc_att_visible(i0 + rg + 16 * a, sq, skv, causal);
    const long kend = pc_att_visible(i0 + nq - 1, sq, skv, causal);

    for (long j0 = 0; j0 < kend; j0 += PC_ATT_C) {
        const long nk = min((long)PC_ATT_C, kend - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
        pc_att_load_both(ks, dp, kt, PC_ATT_C, k, k_off + kbase + j0 * d, nk, d, lid);
        pc_att_load_cols(vt, PC_ATT_C, v, v_off + kbase + j0 * d, nk, d, lid);
        barrier(CLK_LOCAL_MEM_FENCE);

        pc_att_v sc[4], dpv[4];
        PC_ATT_UNROLL for (int a = 0; a < 4; ++a) sc[a] = dpv[a] = (pc_att_v)0;
        for (long t = 0; t < d; ++t) {
            pc_att_v kv = PC_ATT_LD8(kt + t * PC_ATT_C + 8 * cg);
            pc_att_v vv = PC_ATT_LD8(vt + t * PC_ATT_C + 8 * cg);
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                int r = rg + 16 * a;
                sc[a] = fma((pc_att_v)qs[r * d + t], kv, sc[a]);
                dpv[a] = fma((pc_att_v)gos[r * d + t], vv, dpv[a]);
            }
        }
        PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
            int r = rg + 16 * a;
            A l = lse_s[r];
            pc_att_i ok = pc_att_lanes(0, l == -A_INF ? 0 : vis[a] - j0 - 8 * cg);
            pc_att_v p = select((pc_att_v)0, exp(scale * sc[a] - l), ok);
            PC_ATT_ST8(p * (dpv[a] - dv_s[r]), ds + r * PC_ATT_C + 8 * cg);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // dQ += dS k.
        for (long c0 = 8 * cg; c0 < dp; c0 += 32) {
            pc_att_v acc[4];
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) acc[a] = (pc_att_v)0;
            for (int j = 0; j < nk; ++j) {
                pc_att_v kv = PC_ATT_LD8(ks + j * dp + c0);
                PC_ATT_UNROLL for (int a = 0; a < 4; ++a)
                    acc[a] = fma((pc_att_v)ds[(rg + 16 * a) * PC_ATT_C + j], kv, acc[a]);
            }
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                __local A *o = dqs + (rg + 16 * a) * dp + c0;
                PC_ATT_ST8(PC_ATT_LD8(o) + acc[a], o);
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int r = 0; r < nq; ++r)
        for (long t = lid; t < d; t += PC_ATT_WG)
            ST(gq, gq_off + qbase + r * d + t, scale * dqs[r * dp + t]);
}

// Backward, dK and dV: work-group (key block of 64, batch * heads_kv + kv
// head), over every query head of its group and every query tile that sees
// the block: with the transposed tiles P^T = exp(scale k q^T - lse) and
// dS^T = P^T (v dO^T - dvec), dV = P^T dO and dK = scale dS^T q.
//   ks, vs [64][d], qt, got [d][32], qr, gor [32][dp], dks, dvs [64][dp]
__kernel __attribute__((reqd_work_group_size(PC_ATT_WG, 1, 1))) void
pc_attention_bwd_dkv(__global const S *q, long q_off, __global const S *k, long k_off,
                     __global const S *v, long v_off, __global const S *go, long go_off,
                     __global const float *lse, long lse_off, __global const float *dvec,
                     __global S *gk, long gk_off, __global S *gv, long gv_off, long hq, long hkv,
                     long sq, long skv, long d, A scale, int causal, __local A *ks,
                     __local A *vs, __local A *qt, __local A *got, __local A *qr,
                     __local A *gor, __local A *dks, __local A *dvs) {
    __local A ps[PC_ATT_R * PC_ATT_C];
    __local A dss[PC_ATT_R * PC_ATT_C];
    __local A lse_s[PC_ATT_C];
    __local A dv_s[PC_ATT_C];
    const int lid = get_local_id(0);
    const int cg = lid % 4;
    const int rg = lid / 4;
    const long j0 = (long)get_group_id(0) * PC_ATT_R;
    const long bk = get_group_id(1);
    const long b = bk / hkv;
    const long kvh = bk - b * hkv;
    const long group = hq / hkv;
    const long kbase = (bk * skv + j0) * d;
    const long nk = min((long)PC_ATT_R, skv - j0);
    const long dp = (d + 7) & ~7L;
    // Query i sees key j when i >= j - (skv - sq): the first query that
    // sees key j0, and for each owned key the first that sees it.
    const long first = causal ? clamp(j0 - (skv - sq), 0L, sq) : 0L;
    long from[4];
    PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
        long j = j0 + rg + 16 * a;
        // Keys past the end are seen by no query.
        from[a] = j >= skv ? sq : (causal ? j - (skv - sq) : 0L);
    }

    pc_att_load_rows(ks, PC_ATT_R, d, k, k_off + kbase, nk, d, lid);
    pc_att_load_rows(vs, PC_ATT_R, d, v, v_off + kbase, nk, d, lid);
    for (long x = lid; x < PC_ATT_R * dp; x += PC_ATT_WG) dks[x] = dvs[x] = (A)0;

    for (long gi = 0; gi < group; ++gi) {
        const long bh = b * hq + kvh * group + gi;
        for (long i0 = first; i0 < sq; i0 += PC_ATT_C) {
            const long nq = min((long)PC_ATT_C, sq - i0);
            const long qbase = (bh * sq + i0) * d;
            barrier(CLK_LOCAL_MEM_FENCE);
            pc_att_load_both(qr, dp, qt, PC_ATT_C, q, q_off + qbase, nq, d, lid);
            pc_att_load_both(gor, dp, got, PC_ATT_C, go, go_off + qbase, nq, d, lid);
            if (lid < PC_ATT_C) {
                lse_s[lid] = lid < nq ? (A)lse[lse_off + bh * sq + i0 + lid] : -A_INF;
                dv_s[lid] = lid < nq ? (A)dvec[bh * sq + i0 + lid] : (A)0;
            }
            barrier(CLK_LOCAL_MEM_FENCE);

            // Rows: keys rg + 16 a; columns: queries 8 cg + lane.
            pc_att_v sc[4], dpv[4];
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) sc[a] = dpv[a] = (pc_att_v)0;
            for (long t = 0; t < d; ++t) {
                pc_att_v qv = PC_ATT_LD8(qt + t * PC_ATT_C + 8 * cg);
                pc_att_v gv8 = PC_ATT_LD8(got + t * PC_ATT_C + 8 * cg);
                PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                    int r = rg + 16 * a;
                    sc[a] = fma((pc_att_v)ks[r * d + t], qv, sc[a]);
                    dpv[a] = fma((pc_att_v)vs[r * d + t], gv8, dpv[a]);
                }
            }
            pc_att_v l8 = PC_ATT_LD8(lse_s + 8 * cg);
            pc_att_v dv8 = PC_ATT_LD8(dv_s + 8 * cg);
            pc_att_i seen = l8 != (pc_att_v)(-A_INF);
            PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                int r = rg + 16 * a;
                pc_att_i ok = seen & pc_att_lanes(from[a] - i0 - 8 * cg, 8);
                pc_att_v p = select((pc_att_v)0, exp(scale * sc[a] - l8), ok);
                PC_ATT_ST8(p, ps + r * PC_ATT_C + 8 * cg);
                PC_ATT_ST8(p * (dpv[a] - dv8), dss + r * PC_ATT_C + 8 * cg);
            }
            barrier(CLK_LOCAL_MEM_FENCE);

            // dV += P^T dO, dK += dS^T q.
            for (long c0 = 8 * cg; c0 < dp; c0 += 32) {
                pc_att_v av[4], ak[4];
                PC_ATT_UNROLL for (int a = 0; a < 4; ++a) av[a] = ak[a] = (pc_att_v)0;
                for (int i = 0; i < nq; ++i) {
                    pc_att_v gv8 = PC_ATT_LD8(gor + i * dp + c0);
                    pc_att_v qv = PC_ATT_LD8(qr + i * dp + c0);
                    PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                        int r = rg + 16 * a;
                        av[a] = fma((pc_att_v)ps[r * PC_ATT_C + i], gv8, av[a]);
                        ak[a] = fma((pc_att_v)dss[r * PC_ATT_C + i], qv, ak[a]);
                    }
                }
                PC_ATT_UNROLL for (int a = 0; a < 4; ++a) {
                    long at = (rg + 16 * a) * dp + c0;
                    PC_ATT_ST8(PC_ATT_LD8(dvs + at) + av[a], dvs + at);
                    PC_ATT_ST8(PC_ATT_LD8(dks + at) + ak[a], dks + at);
                }
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int r = 0; r < nk; ++r)
        for (long t = lid; t < d; t += PC_ATT_WG) {
            ST(gk, gk_off + kbase + r * d + t, scale * dks[r * dp + t]);
            ST(gv, gv_off + kbase + r * d + t, dvs[r * dp + t]);
        }
}

// Rope: one work-item per rotated pair of a [rows = batch * seq * heads, d]
// tensor; the angle tables are [seq, d / 2]. sign = -1 rotates by -theta
// (the backward).
__kernel void pc_rope(__global const S *x, long x_off, __global const float *cs, long cs_off,
                      __global const float *sn, long sn_off, __global S *out, long out_off,
                      long seq, long heads, long d, int interleaved, float sign, long n) {
    long g = get_global_id(0);
    if (g >= n) return;
    long hd = d / 2;
    long row = g / hd;
    long j = g - row * hd;
    long s = (row / heads) % seq;
    long ia = interleaved ? 2 * j : j;
    long ib = interleaved ? 2 * j + 1 : j + hd;
    A c = (A)cs[cs_off + s * hd + j];
    A sv = (A)(sign * sn[sn_off + s * hd + j]);
    A a = LD(x, x_off + row * d + ia);
    A bb = LD(x, x_off + row * d + ib);
    ST(out, out_off + row * d + ia, a * c - bb * sv);
    ST(out, out_off + row * d + ib, a * sv + bb * c);
}
