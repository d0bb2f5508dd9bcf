// Copies and fills by element width (programs built with PC_BITS): the
// plugin packs strided views into compact scratch with pc_copy, and fill
// writes a value the host has already converted to the dtype's bits.

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
