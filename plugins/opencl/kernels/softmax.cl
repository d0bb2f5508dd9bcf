// softmax, log_softmax and their backwards, cross-entropy and its
// backward. Row kernels: one work-group of PC_WG work-items per row of C
// compact elements (get_group_id(0) = row). A row is taken in chunks of 8
// elements: work-item lid takes chunks lid, lid + PC_WG, ... (8-wide vector
// loads, stores and exp, adjacent work-items on adjacent chunks), then the
// last C % 8 elements one each; the work-group combines the per-item
// partials in a tree in local memory. Everything is computed in A (f32, or
// f64 in the f64 program); no barrier sits in a branch.
//
// A row is read once for its maximum, once for the sum of exp(x - max) and
// once more for the output, each element written by the work-item that
// read it, so an output that is its input (in place) is fine.

#if defined(PC_F64)
typedef double8 pc_softmax_a8;
#else
typedef float8 pc_softmax_a8;
#endif

#if defined(PC_BF16)
// Eight f32 to bf16, rounded to nearest even; NaN stays NaN (quiet), as
// pc_f32_to_bf16.
inline ushort8 pc_softmax_bf16x8(float8 f) {
    uint8 u = as_uint8(f);
    uint8 r = (u + (uint8)(0x7fffu) + ((u >> 16) & (uint8)(1u))) >> 16;
    uint8 q = (u >> 16) | (uint8)(0x40u);
    return convert_ushort8(select(r, q, as_uint8((u & (uint8)(0x7fffffffu)) > (uint8)(0x7f800000u))));
}
#endif

// Chunk i (elements 8i .. 8i + 7) of p, as A, and stored from A.
#if defined(PC_F32) || defined(PC_F64)
#define PC_SM_LD8(p, i) vload8((size_t)(i), (p))
#define PC_SM_ST8(p, i, v) vstore8((v), (size_t)(i), (p))
#elif defined(PC_F16)
// PoCL's vload_half8 and vstore_half8_rte assume 16-byte alignment (an
// aligned AVX move, SIGSEGV on a row at an odd offset), so the bits move
// with vload8 / vstore8 of ushort (element alignment) and are converted
// here, exactly as vload_half / vstore_half_rte (checked against them on
// every f16 and on 16M f32 bit patterns): subnormals, infinities, NaN.
inline float8 pc_softmax_ldh8(__global const half *p, long i) {
    uint8 h = convert_uint8(vload8((size_t)i, (__global const ushort *)p));
    uint8 em = h & (uint8)(0x7fffu), e = em >> 10;
    uint8 normal = (em << 13) + (uint8)(112u << 23);
    uint8 special = (em << 13) | (uint8)(0x7f800000u);
    uint8 sub = as_uint8(convert_float8(em & (uint8)(0x3ffu)) * (float8)(0x1p-24f));
    uint8 bits = select(normal, special, as_uint8(e == (uint8)(31u)));
    bits = select(bits, sub, as_uint8(e == (uint8)(0u)));
    return as_float8(bits | ((h & (uint8)(0x8000u)) << 16));
}
// Eight f32 to f16, rounded to nearest even (subnormals and overflow to
// infinity included); NaN stays NaN (quiet).
inline void pc_softmax_sth8(__global half *p, long i, float8 v) {
    uint8 u = as_uint8(v);
    uint8 a = u & (uint8)(0x7fffffffu);
    uint8 normal = ((a - (uint8)(0x38000000u)) + (uint8)(0xfffu) + ((a >> 13) & (uint8)(1u))) >> 13;
    // Below 2^-14: a count of 2^-24 units, rounded to nearest even (2^10
    // of them is the smallest normal, whose bits are that count too).
    uint8 sub = convert_uint8_sat_rte(as_float8(a) * (float8)(0x1p24f));
    uint8 h = select(sub, normal, as_uint8(a >= (uint8)(0x38800000u)));
    h = select(h, (uint8)(0x7c00u), as_uint8(a >= (uint8)(0x477ff000u)));
    h = select(h, (uint8)(0x7e00u), as_uint8(a > (uint8)(0x7f800000u)));
    h |= (u >> 16) & (uint8)(0x8000u);
    vstore8(convert_ushort8(h), (size_t)i, (__global ushort *)p);
}
#define PC_SM_LD8(p, i) pc_softmax_ldh8((p), (i))
#define PC_SM_ST8(p, i, v) pc_softmax_sth8((p), (i), (v))
#elif defined(PC_BF16)
#define PC_SM_LD8(p, i) as_float8(convert_uint8(vload8((size_t)(i), (p))) << 16)
#define PC_SM_ST8(p, i, v) vstore8(pc_softmax_bf16x8(v), (size_t)(i), (p))
#endif

// The maximum, NaN when either is NaN (a row with a NaN gives NaN).
inline A pc_softmax_max2(A a, A b) { return (a > b || isnan(a)) ? a : b; }

inline A pc_softmax_hmax(pc_softmax_a8 v) {
    return pc_softmax_max2(pc_softmax_max2(pc_softmax_max2(v.s0, v.s1), pc_softmax_max2(v.s2, v.s3)),
                           pc_softmax_max2(pc_softmax_max2(v.s4, v.s5), pc_softmax_max2(v.s6, v.s7)));
}

inline A pc_softmax_hsum(pc_softmax_a8 v) {
    return ((v.s0 + v.s1) + (v.s2 + v.s3)) + ((v.s4 + v.s5) + (v.s6 + v.s7));
}

// The maximum of `v` over the work-group, in every work-item.
inline A pc_softmax_group_max(__local A *red, A v) {
    int lid = (int)get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = PC_WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = pc_softmax_max2(red[lid], red[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    A r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// The sum of `v` over the work-group (a fixed tree), in every work-item.
inline A pc_softmax_group_sum(__local A *red, A v) {
    int lid = (int)get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = PC_WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = red[lid] + red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    A r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// The maximum of the c elements at x (a row).
inline A pc_softmax_row_max(__global const S *x, long c, __local A *red) {
    long lid = get_local_id(0), c8 = c / 8;
    pc_softmax_a8 m8 = (pc_softmax_a8)(-A_INF);
    for (long i = lid; i < c8; i += PC_WG) {
        pc_softmax_a8 v = PC_SM_LD8(x, i);
        m8 = (v > m8 || isnan(v)) ? v : m8;
    }
    A m = pc_softmax_hmax(m8);
    for (long i = 8 * c8 + lid; i < c; i += PC_WG) m = pc_softmax_max2(m, LD(x, i));
    return pc_softmax_group_max(red, m);
}

// The sum of exp(x - m) over the c elements at x.
inline A pc_softmax_row_expsum(__global const S *x, long c, A m, __local A *red) {
    long lid = get_local_id(0), c8 = c / 8;
    pc_softmax_a8 s8 = (pc_softmax_a8)(0);
    for (long i = lid; i < c8; i += PC_WG) s8 += exp(PC_SM_LD8(x, i) - m);
    A s = pc_softmax_hsum(s8);
    for (long i = 8 * c8 + lid; i < c; i += PC_WG) s += exp(LD(x, i) - m);
    return pc_softmax_group_sum(red, s);
}

// softmax (log_out = 0) or log_softmax (log_out = 1) of each row of `x`
// [rows, c] into `y` (possibly the same elements).
__kernel void pc_softmax_fwd(__global const S *x, long xoff, __global S *y, long yoff, long c,
                             int log_out) {
    __local A red[PC_WG];
    long row = get_group_id(0), lid = get_local_id(0), c8 = c / 8;
    __global const S *xr = x + xoff + row * c;
    __global S *yr = y + yoff + row * c;
    A m = pc_softmax_row_max(xr, c, red);
    A s = pc_softmax_row_expsum(xr, c, m, red);
    if (log_out) {
        A ls = log(s);
        for (long i = lid; i < c8; i += PC_WG) PC_SM_ST8(yr, i, (PC_SM_LD8(xr, i) - m) - ls);
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) ST(yr, i, (LD(xr, i) - m) - ls);
    } else {
        for (long i = lid; i < c8; i += PC_WG) PC_SM_ST8(yr, i, exp(PC_SM_LD8(xr, i) - m) / s);
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) ST(yr, i, exp(LD(xr, i) - m) / s);
    }
}

// Backward of softmax (log_out = 0): dx = y * (g - sum(g * y)); of
// log_softmax (log_out = 1): dx = g - exp(y) * sum(g). `dx` may be `g`'s
// elements.
__kernel void pc_softmax_bwd(__global const S *y, long yoff, __global const S *g, long goff,
                             __global S *dx, long dxoff, long c, int log_out) {
    __local A red[PC_WG];
    long row = get_group_id(0), lid = get_local_id(0), c8 = c / 8;
    __global const S *yr = y + yoff + row * c;
    __global const S *gr = g + goff + row * c;
    __global S *dr = dx + dxoff + row * c;
    pc_softmax_a8 acc8 = (pc_softmax_a8)(0);
    A acc;
    if (log_out) {
        for (long i = lid; i < c8; i += PC_WG) acc8 += PC_SM_LD8(gr, i);
        acc = pc_softmax_hsum(acc8);
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) acc += LD(gr, i);
    } else {
        for (long i = lid; i < c8; i += PC_WG) acc8 += PC_SM_LD8(gr, i) * PC_SM_LD8(yr, i);
        acc = pc_softmax_hsum(acc8);
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) acc += LD(gr, i) * LD(yr, i);
    }
    A t = pc_softmax_group_sum(red, acc);
    if (log_out) {
        for (long i = lid; i < c8; i += PC_WG)
            PC_SM_ST8(dr, i, PC_SM_LD8(gr, i) - exp(PC_SM_LD8(yr, i)) * t);
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) ST(dr, i, LD(gr, i) - exp(LD(yr, i)) * t);
    } else {
        for (long i = lid; i < c8; i += PC_WG)
            PC_SM_ST8(dr, i, PC_SM_LD8(yr, i) * (PC_SM_LD8(gr, i) - t));
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) ST(dr, i, LD(yr, i) * (LD(gr, i) - t));
    }
}

// Target of row `row`: from `int` (wide = 0) or `long` (wide = 1) elements
// (both pointers name the same buffer).
inline long pc_softmax_target(__global const int *t32, __global const long *t64, long toff,
                              int wide, long row) {
    return wide ? t64[toff + row] : (long)t32[toff + row];
}

// Per-row cross-entropy: part[row] = logsumexp(row) - row[target], 0 for an
// ignored row (the targets were checked on the host), which runs the same
// barriers over no elements.
__kernel void pc_softmax_ce_rows(__global const S *x, long xoff, __global const int *t32,
                                 __global const long *t64, long toff, int wide, long ignore,
                                 __global A *part, long c) {
    __local A red[PC_WG];
    long row = get_group_id(0);
    long t = pc_softmax_target(t32, t64, toff, wide, row);
    int skip = t == ignore;
    __global const S *xr = x + xoff + row * c;
    long len = skip ? 0 : c;
    A m = pc_softmax_row_max(xr, len, red);
    A s = pc_softmax_row_expsum(xr, len, m, red);
    // max - x[t] first: exact for logits far from 0, where max + log(s)
    // would round at their magnitude.
    if (get_local_id(0) == 0) part[row] = skip ? (A)0 : (m - LD(xr, t)) + log(s);
}

// The mean loss: the sum of the `n` row parts (a fixed tree, so the result
// is deterministic) over `count`; NaN when count is 0. One work-group.
__kernel void pc_softmax_ce_mean(__global const A *part, long n, long count,
                                 __global float *loss, long loff) {
    __local A red[PC_WG];
    A acc = (A)0;
    for (long i = get_local_id(0); i < n; i += PC_WG) acc += part[i];
    A total = pc_softmax_group_sum(red, acc);
    if (get_local_id(0) == 0) loss[loff] = (float)(total / (A)count);
}

// The gradient of one counted row: factor * (exp(x - m) / s - onehot(t)).
inline void pc_softmax_ce_bwd_row(__global const S *xr, __global S *dr, long c, long t, A m, A s,
                                  A factor) {
    long lid = get_local_id(0), c8 = c / 8;
    A f = factor / s;
    for (long i = lid; i < c8; i += PC_WG) {
        if (t >= 8 * i && t < 8 * i + 8) {
            // The target's chunk, one by one.
            for (long j = 8 * i; j < 8 * i + 8; ++j) {
                A p = exp(LD(xr, j) - m) / s;
                ST(dr, j, factor * (j == t ? p - (A)1 : p));
            }
        } else {
            PC_SM_ST8(dr, i, exp(PC_SM_LD8(xr, i) - m) * f);
        }
    }
    for (long i = 8 * c8 + lid; i < c; i += PC_WG) {
        A p = exp(LD(xr, i) - m) / s;
        ST(dr, i, factor * (i == t ? p - (A)1 : p));
    }
}

// Backward of the mean cross-entropy: dx = factor * (softmax(row) -
// onehot(target)) with factor = grad_loss / count, 0 for ignored rows.
__kernel void pc_softmax_ce_bwd(__global const S *x, long xoff, __global const int *t32,
                                __global const long *t64, long toff, int wide, long ignore,
                                __global S *dx, long dxoff, long c, A factor) {
    __local A red[PC_WG];
    long row = get_group_id(0), lid = get_local_id(0), c8 = c / 8;
    long t = pc_softmax_target(t32, t64, toff, wide, row);
    int skip = t == ignore;
    __global const S *xr = x + xoff + row * c;
    __global S *dr = dx + dxoff + row * c;
    long len = skip ? 0 : c;
    A m = pc_softmax_row_max(xr, len, red);
    A s = pc_softmax_row_expsum(xr, len, m, red);
    if (skip) {
        for (long i = lid; i < c8; i += PC_WG) PC_SM_ST8(dr, i, (pc_softmax_a8)(0));
        for (long i = 8 * c8 + lid; i < c; i += PC_WG) ST(dr, i, (A)0);
    } else {
        pc_softmax_ce_bwd_row(xr, dr, c, t, m, s, factor);
    }
}

