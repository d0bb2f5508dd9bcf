// Copies and fills by element width (programs built with PC_BITS): the
// plugin packs strided views into compact scratch with pc_copy, and fill
// writes a value the host has already converted to the dtype's bits. ABI
// 1.3's select and masked_fill move element bits the same way (any dtype),
// and its comparisons of integers read them by width and signedness.

__kernel void pc_copy(__global const S *src, pc_layout sl, __global S *dst, pc_layout dl, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    dst[pc_at(&dl, i)] = src[pc_at(&sl, i)];
}

__kernel void pc_fill(__global S *dst, pc_layout dl, S value, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    dst[pc_at(&dl, i)] = value;
}

// out = cond ? a : b (cond bool; every operand in its own layout over
// out's shape, stride 0 broadcasting). out may be exactly a or b: each
// work-item reads its element before writing it.
__kernel void pc_select(__global const uchar *c, pc_layout cl, __global const S *a, pc_layout al,
                        __global const S *b, pc_layout bl, __global S *out, pc_layout ol, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    S v = c[pc_at(&cl, i)] ? a[pc_at(&al, i)] : b[pc_at(&bl, i)];
    out[pc_at(&ol, i)] = v;
}

// out = mask ? value : x (value already converted to the dtype's bits).
__kernel void pc_masked_fill(__global const S *x, pc_layout xl, __global const uchar *m,
                             pc_layout ml, __global S *out, pc_layout ol, S value, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    S v = m[pc_at(&ml, i)] ? value : x[pc_at(&xl, i)];
    out[pc_at(&ol, i)] = v;
}

// An element of an integer dtype of this width as a long: sign-extended
// when is_signed (i32, i64), zero-extended otherwise (u8).
inline long pc_widen(S x, int is_signed) {
    if (!is_signed) return (long)x;
    if (sizeof(S) == 1) return (long)(char)x;
    if (sizeof(S) == 2) return (long)(short)x;
    if (sizeof(S) == 4) return (long)(int)x;
    return (long)x;
}

// The comparisons of ABI 1.3 on an integer dtype: 0 eq, 1 ne, 2 lt, 3 le,
// 4 gt, 5 ge; out is bool (uchar).
__kernel void pc_compare_int(__global const S *a, pc_layout al, __global const S *b, pc_layout bl,
                             __global uchar *out, pc_layout ol, int op, int is_signed, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    long x = pc_widen(a[pc_at(&al, i)], is_signed);
    long y = pc_widen(b[pc_at(&bl, i)], is_signed);
    int r;
    switch (op) {
    case 0: r = x == y; break;
    case 1: r = x != y; break;
    case 2: r = x < y; break;
    case 3: r = x <= y; break;
    case 4: r = x > y; break;
    default: r = x >= y; break;
    }
    out[pc_at(&ol, i)] = (uchar)(r ? 1 : 0);
}

// ABI 1.4's bitwise operators on i32, i64, u8 or bool (bits of this
// width): 0 and, 1 or, 2 xor. Bools stay 0 or 1.
__kernel void pc_bitwise(__global const S *a, pc_layout al, __global const S *b, pc_layout bl,
                         __global S *out, pc_layout ol, int op, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    S x = a[pc_at(&al, i)];
    S y = b[pc_at(&bl, i)];
    out[pc_at(&ol, i)] = op == 0 ? (S)(x & y) : op == 1 ? (S)(x | y) : (S)(x ^ y);
}

// ABI 1.4's any (every 0) and all (every 1) over the lanes (o, :, i) of a
// compact [outer, n, inner] input of any dtype (bits of this width):
// nonzero is bits other than the sign bit for a floating dtype (NaN is
// nonzero, -0 zero), any bit for the others. out is bool.
__kernel void pc_reduce_bool(__global const S *x, long xoff, __global uchar *out, long ooff,
                             long outputs, long n, long inner, int every, int is_float) {
    long g = get_global_id(0);
    if (g >= outputs) return;
    long o = g / inner, i = g - o * inner;
    long base = xoff + o * n * inner + i;
    S mask = is_float ? (S)~((S)1 << (8 * sizeof(S) - 1)) : (S)~(S)0;
    int result = every;
    for (long j = 0; j < n && result == every; ++j) {
        int nonzero = (x[base + j * inner] & mask) != 0;
        if (nonzero != every) result = !every;
    }
    out[ooff + g] = (uchar)result;
}

// ABI 1.4's cumsum of i32 or i64 along the lanes of a compact [outer, n,
// inner] input, wrapping (unsigned arithmetic on the sign-extended values).
__kernel void pc_cumsum_int(__global const S *x, long xoff, __global S *out, long ooff,
                            long lanes, long n, long inner) {
    long g = get_global_id(0);
    if (g >= lanes) return;
    long o = g / inner, i = g - o * inner;
    long at = o * n * inner + i;
    ulong sum = 0;
    for (long j = 0; j < n; ++j) {
        sum += (ulong)pc_widen(x[xoff + at + j * inner], 1);
        out[ooff + at + j * inner] = (S)sum;
    }
}

// ABI 1.3's integer add (sign 1: a + alpha b), sub (-1: a - alpha b) and
// mul (0: a b) on i32 or i64, wrapping in two's complement (unsigned
// arithmetic on the sign-extended values, truncated to the width).
__kernel void pc_binary_int(__global const S *a, pc_layout al, __global const S *b, pc_layout bl,
                            __global S *out, pc_layout ol, int sign, long alpha, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    ulong x = (ulong)pc_widen(a[pc_at(&al, i)], 1);
    ulong y = (ulong)pc_widen(b[pc_at(&bl, i)], 1);
    ulong k = (ulong)alpha;
    ulong r = sign > 0 ? x + k * y : (sign < 0 ? x - k * y : x * y);
    out[pc_at(&ol, i)] = (S)r;
}
