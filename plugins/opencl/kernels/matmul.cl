// matmul and linear: one tiled kernel (in two work-group shapes), every
// operand in its own strides.
//
// out[b][i][j] = alpha * sum_k a[b][i][k] * bm[b][k][j] (+ bias[j])
//                (+ beta * out[b][i][j])
//
// A work-group of PC_MM_W x PC_MM_W work-items computes a PC_MM_T x PC_MM_T
// tile of out (PC_MM_T = 8 PC_MM_W), each work-item an 8 x 8 block of it
// (rows 8 ty.., columns 8 tx..), accumulated as eight 8-wide vectors so
// that the products are vector FMAs on any device. K is walked in steps of
// PC_MM_K: the work-group stages a PC_MM_T x PC_MM_K slice of a and a
// PC_MM_K x PC_MM_T slice of b in local memory (in the compute type, zero
// past the edges), then every work-item accumulates from it. The sum over k
// is in A (f32 for f16 and bf16, f64 for f64), in order of k, one fma a
// term. pc_matmul_gemm_short is the same with work-groups 2 work-items high
// (16-row tiles), for products of at most 16 rows. With splits > 1 each
// work-group sums one range of K into scratch and pc_matmul_split_sum adds
// the ranges.
//
// Matrix b of the batch starts at pc_at(&l, b) in each operand's batch
// layout (stride 0 broadcasts); rows and columns have their own strides (a
// transposed operand is just swapped strides), and a tile is staged along
// whichever of them is 1, in 8-element vector loads.
//
// The compute loop is written for CPU compilers (PoCL) as much as for
// GPUs: accumulators in named vectors, not an array, and local addresses
// taken from the local ids after each barrier, so that a compiler that
// runs the work-items of a region in a loop keeps only the accumulators
// per work-item.

#if PC_WG >= 64
#define PC_MM_W 8
#elif PC_WG >= 16
#define PC_MM_W 4
#elif PC_WG >= 4
#define PC_MM_W 2
#else
#define PC_MM_W 1
#endif
#define PC_MM_T (PC_MM_W * 8)
// The K step: 32, or 16 in f64 to stay within 32 KiB of local memory.
#if defined(PC_F64)
#define PC_MM_K 16
#else
#define PC_MM_K 32
#endif
// Row pitch of the staged a, as[i][k] (padded against bank conflicts).
#define PC_MM_AP (PC_MM_K + 1)

#if defined(PC_F64)
typedef double8 pc_mm_v;
#define PC_MM_LD8(p, i) vload8(0, (p) + (i))
#elif defined(PC_F32)
typedef float8 pc_mm_v;
#define PC_MM_LD8(p, i) vload8(0, (p) + (i))
#elif defined(PC_F16)
typedef float8 pc_mm_v;
#define PC_MM_LD8(p, i) vload_half8(0, (p) + (i))
#else
typedef float8 pc_mm_v;
#define PC_MM_LD8(p, i) as_float8(convert_uint8(vload8(0, (p) + (i))) << 16)
#endif

// Stages a P x Q tile: element (p, q) of the source, at
// base + (p0 + p) * sp + (q0 + q) * sq and zero unless p0 + p < pn and
// q0 + q < qn, goes to dst[p * dp + q * dq]. Along q in runs of 8 (one
// vector load) where sq is 1.
inline void pc_mm_stage(__local A *dst, const int dp, const int dq, __global const S *src,
                        const long base, const long sp, const long sq, const long p0,
                        const long q0, const long pn, const long qn, const int P, const int Q,
                        const int lid, const int nt) {
    if (sq == 1) {
        const int runs = Q / 8;
        for (int c = lid; c < P * runs; c += nt) {
            const int p = c / runs, q = (c % runs) * 8;
            const long gp = p0 + p, gq = q0 + q;
            __local A *d = dst + p * dp + q * dq;
            if (gp < pn && gq + 8 <= qn) {
                const pc_mm_v v = PC_MM_LD8(src, base + gp * sp + gq);
                if (dq == 1) {
                    vstore8(v, 0, d);
                } else {
                    d[0] = v.s0;
                    d[dq] = v.s1;
                    d[2 * dq] = v.s2;
                    d[3 * dq] = v.s3;
                    d[4 * dq] = v.s4;
                    d[5 * dq] = v.s5;
                    d[6 * dq] = v.s6;
                    d[7 * dq] = v.s7;
                }
            } else {
                for (int e = 0; e < 8; ++e)
                    d[e * dq] = (gp < pn && gq + e < qn) ? LD(src, base + gp * sp + gq + e) : (A)0;
            }
        }
    } else {
        for (int c = lid; c < P * Q; c += nt) {
            const int p = c / Q, q = c % Q;
            const long gp = p0 + p, gq = q0 + q;
            dst[p * dp + q * dq] = (gp < pn && gq < qn) ? LD(src, base + gp * sp + gq * sq) : (A)0;
        }
    }
}

// The epilogue of element (gi, gj): alpha * acc (+ bias) (+ beta * out).
inline void pc_mm_store(A acc, __global S *o, long at, __global const S *bias, long bias_at,
                        int has_bias, A alpha, A beta) {
    A v = alpha * acc;
    if (has_bias) v += LD(bias, bias_at);
    if (beta != (A)0) v += beta * LD(o, at);
    ST(o, at, v);
}

// One tile of out, PC_MM_W work-items wide and wy high (8 wy rows by
// PC_MM_T columns), or with splits > 1 the partial sum over one range of K:
// get_group_id(2) is batch * splits + split, split covering k in
// [split * kc, split * kc + kc), and the raw sums go to
// part[((split * batches + batch) * M + i) * N + j] for pc_matmul_split_sum.
// as holds 8 wy rows of PC_MM_AP, bs PC_MM_K rows of PC_MM_T.
inline void pc_mm_gemm(__global const S *a, pc_layout la, long a_rs, long a_cs,
                       __global const S *bm, pc_layout lb, long b_rs, long b_cs,
                       __global S *o, pc_layout lo, long o_rs, long o_cs,
                       __global const S *bias, long bias_off, long bias_stride, int has_bias,
                       long M, long N, long K, A alpha, A beta, int splits, long kc,
                       __global A *part, __local A *as, __local A *bs, const int wy) {
    const int tm = 8 * wy;
    const int nt = PC_MM_W * wy;
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int lid = ty * PC_MM_W + tx;
    const long batch = get_group_id(2) / splits;
    const long split = get_group_id(2) % splits;
    const long a0 = pc_at(&la, batch);
    const long b0 = pc_at(&lb, batch);
    const long row0 = (long)get_group_id(1) * tm;
    const long col0 = (long)get_group_id(0) * PC_MM_T;
    const long kb = split * kc;
    const long ke = min(K, kb + kc);

    // Named, not an array: kept in registers on every compiler.
    pc_mm_v c0 = (pc_mm_v)(0), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;

    // alpha == 0 reads neither a nor b (BLAS): no steps at all.
    const long steps = alpha == (A)0 ? 0 : (ke - kb + PC_MM_K - 1) / PC_MM_K;
    for (long s = 0; s < steps; ++s) {
        const long k0 = kb + s * PC_MM_K;
        // Each along its unit-stride dimension when it has one.
        if (a_rs == 1 && a_cs != 1)
            pc_mm_stage(as, 1, PC_MM_AP, a, a0, a_cs, 1, k0, row0, ke, M, PC_MM_K, tm, lid, nt);
        else
            pc_mm_stage(as, PC_MM_AP, 1, a, a0, a_rs, a_cs, row0, k0, M, ke, tm, PC_MM_K, lid, nt);
        if (b_rs == 1 && b_cs != 1)
            pc_mm_stage(bs, 1, PC_MM_T, bm, b0, b_cs, 1, col0, k0, N, ke, PC_MM_T, PC_MM_K, lid,
                        nt);
        else
            pc_mm_stage(bs, PC_MM_T, 1, bm, b0, b_rs, b_cs, k0, col0, ke, N, PC_MM_K, PC_MM_T, lid,
                        nt);
        barrier(CLK_LOCAL_MEM_FENCE);
        // Addresses from the local ids here, after the barrier (see the top).
        __local const A *ar = as + get_local_id(1) * (8 * PC_MM_AP);
        __local const A *br = bs + get_local_id(0) * 8;
#pragma unroll 4
        for (int kq = 0; kq < PC_MM_K; ++kq) {
            const pc_mm_v bv = vload8(0, br + kq * PC_MM_T);
            c0 = fma((pc_mm_v)(ar[kq]), bv, c0);
            c1 = fma((pc_mm_v)(ar[kq + PC_MM_AP]), bv, c1);
            c2 = fma((pc_mm_v)(ar[kq + 2 * PC_MM_AP]), bv, c2);
            c3 = fma((pc_mm_v)(ar[kq + 3 * PC_MM_AP]), bv, c3);
            c4 = fma((pc_mm_v)(ar[kq + 4 * PC_MM_AP]), bv, c4);
            c5 = fma((pc_mm_v)(ar[kq + 5 * PC_MM_AP]), bv, c5);
            c6 = fma((pc_mm_v)(ar[kq + 6 * PC_MM_AP]), bv, c6);
            c7 = fma((pc_mm_v)(ar[kq + 7 * PC_MM_AP]), bv, c7);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    A res[64];
    vstore8(c0, 0, res);
    vstore8(c1, 1, res);
    vstore8(c2, 2, res);
    vstore8(c3, 3, res);
    vstore8(c4, 4, res);
    vstore8(c5, 5, res);
    vstore8(c6, 6, res);
    vstore8(c7, 7, res);
    const long o0 = pc_at(&lo, batch);
    const long batches = get_num_groups(2) / splits;
    for (int r = 0; r < 8; ++r) {
        const long gi = row0 + ty * 8 + r;
        if (gi >= M) break;
        for (int c = 0; c < 8; ++c) {
            const long gj = col0 + tx * 8 + c;
            if (gj >= N) break;
            if (splits > 1)
                part[((split * batches + batch) * M + gi) * N + gj] = res[8 * r + c];
            else
                pc_mm_store(res[8 * r + c], o, o0 + gi * o_rs + gj * o_cs, bias,
                            bias_off + gj * bias_stride, has_bias, alpha, beta);
        }
    }
}

#define PC_MM_PARAMS                                                                        \
    __global const S *a, pc_layout la, long a_rs, long a_cs, __global const S *bm,          \
        pc_layout lb, long b_rs, long b_cs, __global S *o, pc_layout lo, long o_rs,         \
        long o_cs, __global const S *bias, long bias_off, long bias_stride, int has_bias,   \
        long M, long N, long K, A alpha, A beta, int splits, long kc, __global A *part
#define PC_MM_ARGS                                                                          \
    a, la, a_rs, a_cs, bm, lb, b_rs, b_cs, o, lo, o_rs, o_cs, bias, bias_off, bias_stride, \
        has_bias, M, N, K, alpha, beta, splits, kc, part

// Tiles of PC_MM_T x PC_MM_T.
__kernel __attribute__((reqd_work_group_size(PC_MM_W, PC_MM_W, 1)))
void pc_matmul_gemm(PC_MM_PARAMS) {
    __local A as[PC_MM_T * PC_MM_AP];
    __local A bs[PC_MM_K * PC_MM_T];
    pc_mm_gemm(PC_MM_ARGS, as, bs, PC_MM_W);
}

// Tiles of PC_MM_TS rows (short products: less of each tile wasted).
#define PC_MM_WS (PC_MM_W >= 2 ? 2 : 1)
#define PC_MM_TS (8 * PC_MM_WS)
__kernel __attribute__((reqd_work_group_size(PC_MM_W, PC_MM_WS, 1)))
void pc_matmul_gemm_short(PC_MM_PARAMS) {
    __local A as[PC_MM_TS * PC_MM_AP];
    __local A bs[PC_MM_K * PC_MM_T];
    pc_mm_gemm(PC_MM_ARGS, as, bs, PC_MM_WS);
}

// The partial sums of pc_matmul_gemm added in order of split, then the
// epilogue: one work-item per element (j, i, batch).
__kernel void pc_matmul_split_sum(__global const A *part, int splits,
                                  __global S *o, pc_layout lo, long o_rs, long o_cs,
                                  __global const S *bias, long bias_off, long bias_stride,
                                  int has_bias, long M, long N, A alpha, A beta) {
    const long gj = get_global_id(0), gi = get_global_id(1), batch = get_global_id(2);
    if (gi >= M || gj >= N) return;
    const long plane = get_global_size(2) * M * N;
    const long at = (batch * M + gi) * N + gj;
    A acc = part[at];
    for (int s = 1; s < splits; ++s) acc += part[s * plane + at];
    pc_mm_store(acc, o, pc_at(&lo, batch) + gi * o_rs + gj * o_cs, bias,
                bias_off + gj * bias_stride, has_bias, alpha, beta);
}
