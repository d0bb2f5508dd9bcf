// Embedding lookup and its accumulating backward.
//
// The table (weight, grad_weight) is addressed in its own strides (rs per
// row, cs per column, from element offset woff), so it is never packed;
// ids and rows ([N, H]) are compact. Each kernel comes in an i32 and an
// i64 flavour of ids (PC_EMB_IDS below).
//
// Ids are checked on the device: pc_index_check_* (indexing.cl) finds the
// first id outside [0, V) and writes its position (N: none) and value to
// status[0..2]. The lookup writes zeros for such ids (never a stray read);
// the backward does nothing at all when status says an id is bad, so a
// refused call leaves grad_weight as it was.
//
// The backward is deterministic without float atomics: the keys
// (id << 32 | position) are sorted (pc_sort_* in indexing.cl: bitonic,
// padded to a power of two of at least 2 * PC_WG with ~0), so equal ids
// form runs in position order;
// the first slot of each run then adds the run's rows to its table row,
// one work-item per column, in position order, and rounds once.

// The element bits of the program's dtype: lookups copy them untouched.
#if defined(PC_F32)
typedef uint pc_emb_bits;
#elif defined(PC_F64)
typedef ulong pc_emb_bits;
#else
typedef ushort pc_emb_bits;
#endif

#define PC_EMB_NONE (~(ulong)0)

// out[r, c] = weight[ids[r], c] over global (H, N).
#define PC_EMB_GATHER(NAME, IDX)                                                                 \
    __kernel void NAME(__global const pc_emb_bits *w, long woff, long rs, long cs, long vocab,     \
                       __global const IDX *ids, long ioff, __global pc_emb_bits *out, long ooff,  \
                       long h) {                                                                 \
        long c = get_global_id(0), r = get_global_id(1);                                         \
        long id = (long)ids[ioff + r];                                                           \
        pc_emb_bits v = 0;                                                                       \
        if (id >= 0 && id < vocab) v = w[woff + id * rs + c * cs];                               \
        out[ooff + r * h + c] = v;                                                               \
    }

PC_EMB_GATHER(pc_emb_gather_i32, int)
PC_EMB_GATHER(pc_emb_gather_i64, long)

// keys[j] = id << 32 | j for j < n, ~0 past it (global: the padded length).
#define PC_EMB_KEYS(NAME, IDX)                                                                   \
    __kernel void NAME(__global const IDX *ids, long ioff, long n, __global ulong *keys) {       \
        long j = get_global_id(0);                                                               \
        keys[j] = j < n ? (((ulong)(long)ids[ioff + j]) << 32) | (ulong)j : PC_EMB_NONE;         \
    }

PC_EMB_KEYS(pc_emb_keys_i32, int)
PC_EMB_KEYS(pc_emb_keys_i64, long)

// grad_weight[row, c] += the rows of grad_out whose id is row, over global
// (H, N) of sorted slots: the first slot of each run does the run.
__kernel void pc_emb_accumulate(__global const S *g, long goff, __global const ulong *keys,
                                long n, __global S *w, long woff, long rs, long cs, long h,
                                __global const long *status) {
    if (status[0] < n) return;
    long c = get_global_id(0), s = get_global_id(1);
    ulong row = keys[s] >> 32;
    if (s > 0 && (keys[s - 1] >> 32) == row) return;
    long at = woff + (long)row * rs + c * cs;
    A acc = LD(w, at);
    for (long j = s; j < n; ++j) {
        ulong key = keys[j];
        if ((key >> 32) != row) break;
        acc += LD(g, goff + (long)(key & 0xffffffffUL) * h + c);
    }
    ST(w, at, acc);
}
