// Indexing along one dimension: ABI 1.4's gather and scatter_add, and the
// index check and key sort they share with embedding. Built into the floating programs
// (the check, and scatter_add of f32, f16, bf16, f64) and into the
// programs by element width (the check, gather of any dtype, scatter_add
// of i32 and i64). Every kernel comes in an i32 and an i64 flavour of
// indices (the _i32 and _i64 suffixes), and takes each tensor in its own
// strides (pc_layout): nothing is packed, so an index expanded by a zero
// stride (index_select, index_add) is read in place.
//
// Nothing is written when an index is bad. pc_index_check_* (one
// work-group) writes the position (row-major) of the first index outside
// [0, limit) and its value to status[0..2] (position `count`: none), and
// every kernel that writes reads status[0] first and does nothing when an
// index is bad. The host queues the check and the kernel back to back and
// reads status once, after both (the call waits there anyway to report
// the error). That was chosen over reading status back between the check
// and the kernel, which would wait for the device twice in a good call.

// One work-group of PC_WG: the first position (row-major over il) whose
// index is outside [0, limit).
#define PC_INDEX_CHECK(NAME, IDX)                                                                \
    __kernel __attribute__((reqd_work_group_size(PC_WG, 1, 1))) void NAME(                       \
        __global const IDX *idx, pc_layout il, long count, long limit, __global long *status) {  \
        __local long first[PC_WG];                                                               \
        int t = (int)get_local_id(0);                                                            \
        long f = count;                                                                          \
        for (long j = t; j < count; j += PC_WG) {                                                \
            long v = (long)idx[pc_at(&il, j)];                                                   \
            if (v < 0 || v >= limit) {                                                           \
                f = j;                                                                           \
                break;                                                                           \
            }                                                                                    \
        }                                                                                        \
        first[t] = f;                                                                            \
        for (int s = PC_WG / 2; s > 0; s >>= 1) {                                                \
            barrier(CLK_LOCAL_MEM_FENCE);                                                        \
            if (t < s) first[t] = min(first[t], first[t + s]);                                   \
        }                                                                                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                                            \
        if (t == 0) {                                                                            \
            status[0] = first[0];                                                                \
            status[1] = first[0] < count ? (long)idx[pc_at(&il, first[0])] : 0;                  \
        }                                                                                        \
    }

PC_INDEX_CHECK(pc_index_check_i32, int)
PC_INDEX_CHECK(pc_index_check_i64, long)

// ---------------------------------------------------------- the key sort
//
// A bitonic sort of 64-bit keys, padded to a power of two P of at least
// 2 * PC_WG with ~0: pc_sort_block(0), then for each k = 4 PC_WG .. P the
// steps j = k / 2 .. 2 PC_WG of pc_sort_step and pc_sort_block(k).

// One step (k, j) over the whole array, j >= 2 * PC_WG: global (P / 2).
__kernel void pc_sort_step(__global ulong *keys, long k, long j) {
    long t = get_global_id(0);
    long i = 2 * j * (t / j) + (t % j);
    int up = (i & k) == 0;
    ulong a = keys[i], b = keys[i + j];
    if ((a > b) == up) {
        keys[i] = b;
        keys[i + j] = a;
    }
}

// The steps within blocks of 2 * PC_WG keys, in local memory: with k = 0,
// every step of every k up to the block size (sorting each block); with
// k > 0, the steps j = PC_WG .. 1 of that k. Global (P / 2), groups of PC_WG.
__kernel __attribute__((reqd_work_group_size(PC_WG, 1, 1))) void
pc_sort_block(__global ulong *keys, long k) {
    __local ulong l[2 * PC_WG];
    long t = get_local_id(0);
    long base = get_group_id(0) * (2 * PC_WG);
    l[t] = keys[base + t];
    l[t + PC_WG] = keys[base + t + PC_WG];
    long k0 = k ? k : 2, k1 = k ? k : 2 * PC_WG;
    for (long kk = k0; kk <= k1; kk <<= 1) {
        for (long j = min(kk, (long)(2 * PC_WG)) >> 1; j > 0; j >>= 1) {
            barrier(CLK_LOCAL_MEM_FENCE);
            long i = 2 * j * (t / j) + (t % j);
            int up = ((base + i) & kk) == 0;
            ulong a = l[i], b = l[i + j];
            if ((a > b) == up) {
                l[i] = b;
                l[i + j] = a;
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    keys[base + t] = l[t];
    keys[base + t + PC_WG] = l[t + PC_WG];
}


#if defined(PC_BITS)

// gather, over global (n): out[i] = x[xl(i) + index[i] * step], where xl
// is the input's layout over index's shape with dim's stride 0 (the index
// supplies that coordinate) and step is the input's stride along dim.
// Element bits are copied.
#define PC_GATHER(NAME, IDX)                                                                     \
    __kernel void NAME(__global const S *x, pc_layout xl, long step, long limit,                 \
                       __global const IDX *idx, pc_layout il, __global S *out, pc_layout ol,      \
                       long n, __global const long *status) {                                    \
        long i = get_global_id(0);                                                               \
        if (i >= n || status[0] < n) return;                                                     \
        long k = (long)idx[pc_at(&il, i)];                                                       \
        if (k < 0 || k >= limit) return;                                                         \
        out[pc_at(&ol, i)] = x[pc_at(&xl, i) + k * step];                                        \
    }

PC_GATHER(pc_gather_i32, int)
PC_GATHER(pc_gather_i64, long)

// scatter_add of i32 or i64: wrapping, in unsigned arithmetic on the
// sign-extended values, truncated to the width.
typedef ulong pc_scatter_acc;
#define PC_SCATTER_LD(p, i) ((ulong)pc_widen((p)[i], 1))
#define PC_SCATTER_ST(p, i, v) ((p)[i] = (S)(v))

#else

// scatter_add of a floating dtype, one rounding to the dtype at the store:
// f32 in double where the device has it (one add per update, so a GPU's
// low f64 rate hardly matters, and the result is the f64 sum's one
// rounding, as Ferrite's), else in A (f32; f64 for f64). f16 and bf16 in f32: a double would round twice on the way
// down through float.
#if defined(PC_F32) && defined(PC_HAS_FP64)
typedef double pc_scatter_acc;
#else
typedef A pc_scatter_acc;
#endif
#define PC_SCATTER_LD(p, i) LD(p, i)
#define PC_SCATTER_ST(p, i, v) ST(p, i, v)

#endif

// scatter_add without atomics, deterministic, in two formulations that
// add the same updates in the same order (index order along dim) from the
// element's old value, so they give the same bits. A line: the positions of index, src and dst that
// differ only along dim; dl, il and sl are their layouts over index's
// shape with dim's extent 1, dstep, istep and sstep their strides along
// dim; K = k_len updates a line, D = places along dim.

// The walk, for at most PC_WALK_PLACES places: over global (lines),
// work-item l walks its line's K updates once, in order, and keeps the sum
// of each place it meets in private memory (started from the element's
// old value at its first update; `hit` marks the places met), then stores
// those places once each: an element no update names keeps its bits.
// Neighbouring work-items are neighbouring lines, which read neighbouring
// indices where the index is compact. Cost: one read per update, and D
// accumulators a work-item.
#define PC_WALK_PLACES 64
#define PC_SCATTER_ADD(NAME, IDX)                                                                \
    __kernel void NAME(__global S *dst, pc_layout dl, long dstep, long places,                   \
                       __global const IDX *idx, pc_layout il, long istep, __global const S *src, \
                       pc_layout sl, long sstep, long k_len, long count,                         \
                       __global const long *status) {                                            \
        if (status[0] < count || places > PC_WALK_PLACES) return;                                \
        long l = get_global_id(0);                                                               \
        long ib = pc_at(&il, l), sb = pc_at(&sl, l), db = pc_at(&dl, l);                         \
        pc_scatter_acc acc[PC_WALK_PLACES];                                                      \
        ulong hit = 0;                                                                           \
        for (long k = 0; k < k_len; ++k) {                                                       \
            long c = (long)idx[ib + k * istep];                                                  \
            if (c < 0 || c >= places) continue;                                                  \
            ulong bit = (ulong)1 << c;                                                           \
            if (!(hit & bit)) {                                                                  \
                acc[c] = PC_SCATTER_LD(dst, db + c * dstep);                                     \
                hit |= bit;                                                                      \
            }                                                                                    \
            acc[c] += PC_SCATTER_LD(src, sb + k * sstep);                                        \
        }                                                                                        \
        for (long c = 0; c < places; ++c)                                                        \
            if (hit & ((ulong)1 << c)) PC_SCATTER_ST(dst, db + c * dstep, acc[c]);               \
    }

PC_SCATTER_ADD(pc_scatter_add_i32, int)
PC_SCATTER_ADD(pc_scatter_add_i64, long)

// The sorted runs: keys (row << 32 | k), row = l' * D + index, for the
// index lines l' < L' (L' = 1 when index is one line expanded over the
// others by zero strides, index_add's case; else every line), sorted
// (pc_sort_*), so each (line, place) is a run of its updates in k order.
// Cost: the sort of L' * K keys, then one read per update.

// keys[j] over global (P): j = l' * K + k below n = L' * K, ~0 past it.
#define PC_SCATTER_KEYS(NAME, IDX)                                                               \
    __kernel void NAME(__global const IDX *idx, pc_layout il, long istep, long k_len,            \
                       long places, long n, __global ulong *keys) {                              \
        long j = get_global_id(0);                                                               \
        if (j >= n) {                                                                            \
            keys[j] = ~(ulong)0;                                                                 \
            return;                                                                              \
        }                                                                                        \
        long lp = j / k_len, k = j - lp * k_len;                                                 \
        long v = (long)idx[pc_at(&il, lp) + k * istep];                                          \
        keys[j] = ((ulong)(lp * places + v) << 32) | (ulong)k;                                   \
    }

PC_SCATTER_KEYS(pc_scatter_keys_i32, int)
PC_SCATTER_KEYS(pc_scatter_keys_i64, long)

// Over global (cols, n) of sorted slots, cols = lines / L': the first slot
// of each run adds the run's updates of line l = l' * cols + j (one of l'
// and j is always 0) to its dst element and stores once.
__kernel void pc_scatter_add_runs(__global S *dst, pc_layout dl, long dstep,
                                  __global const S *src, pc_layout sl, long sstep,
                                  __global const ulong *keys, long n, long places, long cols,
                                  long count, __global const long *status) {
    if (status[0] < count) return;
    long j = get_global_id(0), s = get_global_id(1);
    ulong row = keys[s] >> 32;
    if (s > 0 && (keys[s - 1] >> 32) == row) return;
    long lp = (long)row / places, c = (long)row - lp * places;
    long l = lp * cols + j;
    long at = pc_at(&dl, l) + c * dstep, sb = pc_at(&sl, l);
    pc_scatter_acc acc = PC_SCATTER_LD(dst, at);
    for (long t = s; t < n; ++t) {
        ulong key = keys[t];
        if ((key >> 32) != row) break;
        acc += PC_SCATTER_LD(src, sb + (long)(key & 0xffffffffUL) * sstep);
    }
    PC_SCATTER_ST(dst, at, acc);
}
