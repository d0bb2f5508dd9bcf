// Reductions over one dimension of a compact tensor seen as
// [outer, n, inner] (sum, mean, max, argmax), and the global sum of
// squares. Output element g = o * inner + i reduces
// x[(o * n + j) * inner + i] over j. Accumulated in A.
//
// Two shapes of kernel:
//   *_lane   one work-item per output element, a sequential scan (sums in
//            blocks of PC_RED_BLOCK, so the rounding error grows with
//            PC_RED_BLOCK + n / PC_RED_BLOCK rather than n); for many
//            outputs or short lanes.
//   *_group  one work-group of PC_WG work-items per output element: each
//            work-item takes every PC_WG-th element, then a tree in local
//            memory; for few, long lanes.
// Every order is fixed by the shape alone, so results are reproducible.

#define PC_RED_BLOCK 64

// --------------------------------------------------------------- cumsum

// ABI 1.4's cumsum of a floating dtype along the lanes of a compact
// [outer, n, inner] input: a running sum in A (f32, f64 for f64) from +0,
// each output rounded once. out may be x (each element read before it is
// written).
__kernel void pc_cumsum(__global const S *x, long xoff, __global S *out, long ooff, long lanes,
                        long n, long inner) {
    long g = get_global_id(0);
    if (g >= lanes) return;
    long o = g / inner, i = g - o * inner;
    long at = o * n * inner + i;
    A sum = (A)0;
    for (long j = 0; j < n; ++j) {
        sum += LD(x, xoff + at + j * inner);
        ST(out, ooff + at + j * inner, sum);
    }
}

// --------------------------------------------------------------- sum, mean

__kernel void pc_reduce_sum_lane(__global const S *x, long xoff, __global S *out, long ooff,
                                 long outputs, long n, long inner, int mean) {
    long g = get_global_id(0);
    if (g >= outputs) return;
    long o = g / inner, i = g - o * inner;
    long base = xoff + o * n * inner + i;
    A total = (A)0;
    for (long j0 = 0; j0 < n; j0 += PC_RED_BLOCK) {
        long end = min(j0 + PC_RED_BLOCK, n);
        A block = (A)0;
        for (long j = j0; j < end; ++j) block += LD(x, base + j * inner);
        total += block;
    }
    if (mean) total = total / (A)n;
    ST(out, ooff + g, total);
}

// Sums buf[0 .. PC_WG) into buf[0] (a fixed tree); every work-item calls it.
inline void pc_reduce_tree_sum(__local A *buf, int t) {
    for (int s = PC_WG / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t < s) buf[t] += buf[t + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

__kernel __attribute__((reqd_work_group_size(PC_WG, 1, 1))) void
pc_reduce_sum_group(__global const S *x, long xoff, __global S *out, long ooff, long n,
                    long inner, int mean) {
    __local A buf[PC_WG];
    long g = get_group_id(0);
    int t = (int)get_local_id(0);
    long o = g / inner, i = g - o * inner;
    long base = xoff + o * n * inner + i;
    A s = (A)0;
    for (long j = t; j < n; j += PC_WG) s += LD(x, base + j * inner);
    buf[t] = s;
    pc_reduce_tree_sum(buf, t);
    if (t == 0) {
        A total = buf[0];
        if (mean) total = total / (A)n;
        ST(out, ooff + g, total);
    }
}

// ------------------------------------------------------------- max, argmax

// Whether (av, ai) beats (bv, bi): a NaN beats any number and the first
// NaN wins among NaNs; otherwise the larger value, and among equal values
// (-0 == +0 included) the smaller index. The reference scans in order,
// keeps the first NaN, and replaces its best only on a strictly larger
// value, which is the same choice.
inline int pc_reduce_better(A av, long ai, A bv, long bi) {
    int an = isnan(av), bn = isnan(bv);
    if (an || bn) return an && (!bn || ai < bi);
    if (av != bv) return av > bv;
    return ai < bi;
}

// The result of lane `base` whose best element is `k` (n: none): its index
// or its value (-inf for an empty lane), copied from the input.
inline void pc_reduce_store_best(__global const S *x, long base, long inner, long n, long k,
                                 __global S *vout, __global long *iout, long at, int index) {
    if (index) {
        iout[at] = k;
    } else {
        A v = (k < n) ? LD(x, base + k * inner) : -A_INF;
        ST(vout, at, v);
    }
}

// max (index 0: vout) and argmax (index 1: iout); the host passes `out`
// for both pointers.
__kernel void pc_reduce_max_lane(__global const S *x, long xoff, __global S *vout,
                                 __global long *iout, long ooff, long outputs, long n, long inner,
                                 int index) {
    long g = get_global_id(0);
    if (g >= outputs) return;
    long o = g / inner, i = g - o * inner;
    long base = xoff + o * n * inner + i;
    A best = -A_INF;
    long k = n;
    for (long j = 0; j < n; ++j) {
        A y = LD(x, base + j * inner);
        if (pc_reduce_better(y, j, best, k)) {
            best = y;
            k = j;
        }
    }
    pc_reduce_store_best(x, base, inner, n, k, vout, iout, ooff + g, index);
}

__kernel __attribute__((reqd_work_group_size(PC_WG, 1, 1))) void
pc_reduce_max_group(__global const S *x, long xoff, __global S *vout, __global long *iout,
                    long ooff, long n, long inner, int index) {
    __local A bv[PC_WG];
    __local long bi[PC_WG];
    long g = get_group_id(0);
    int t = (int)get_local_id(0);
    long o = g / inner, i = g - o * inner;
    long base = xoff + o * n * inner + i;
    A best = -A_INF;
    long k = n;
    for (long j = t; j < n; j += PC_WG) {
        A y = LD(x, base + j * inner);
        if (pc_reduce_better(y, j, best, k)) {
            best = y;
            k = j;
        }
    }
    bv[t] = best;
    bi[t] = k;
    for (int s = PC_WG / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t < s && pc_reduce_better(bv[t + s], bi[t + s], bv[t], bi[t])) {
            bv[t] = bv[t + s];
            bi[t] = bi[t + s];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t == 0) pc_reduce_store_best(x, base, inner, n, bi[0], vout, iout, ooff + g, index);
}

// -------------------------------------------------------------- sum_squares

// Stage 1: work-item `gid` of G * PC_WG sums the squares of every
// (G * PC_WG)-th element from gid; each group's tree sum goes to part[group].
__kernel __attribute__((reqd_work_group_size(PC_WG, 1, 1))) void
pc_sumsq_partial(__global const S *x, long xoff, long n, __global A *part) {
    __local A buf[PC_WG];
    int t = (int)get_local_id(0);
    long stride = (long)get_global_size(0);
    A s = (A)0;
    for (long j = (long)get_global_id(0); j < n; j += stride) {
        A y = LD(x, xoff + j);
        s += y * y;
    }
    buf[t] = s;
    pc_reduce_tree_sum(buf, t);
    if (t == 0) part[get_group_id(0)] = buf[0];
}

// Stage 2: one work-group sums the `parts` partial sums into out[ooff] (an
// f32 scalar; 0 when there are none).
__kernel __attribute__((reqd_work_group_size(PC_WG, 1, 1))) void
pc_sumsq_final(__global const A *part, long parts, __global float *out, long ooff) {
    __local A buf[PC_WG];
    int t = (int)get_local_id(0);
    A s = (A)0;
    for (long j = t; j < parts; j += PC_WG) s += part[j];
    buf[t] = s;
    pc_reduce_tree_sum(buf, t);
    if (t == 0) out[ooff] = (float)buf[0];
}
