// RMSNorm and LayerNorm over the last dimension H, forward and backward.
//
// Row kernels: one work-group of PC_WG work-items per row (get_group_id(0)
// is the row); work-item l handles the row's elements l, l + PC_WG, ...
// (coalesced), sums them in A, and the work-group adds the partial sums
// with a tree in local memory. Statistics (inv_rms, mean, rstd) are f32.
//
// The parameter gradients of the backwards are sums over all rows, done
// without atomics and deterministically: pc_norm_*_partials sums each
// column over a chunk of rows (one work-item per column and chunk, rows in
// order), and pc_norm_colsum adds the chunks' partial sums of a column in
// order and stores the result.

// The sum of v over the work-group (every work-item gets it). buf holds
// PC_WG values; it is free again when this returns.
inline A pc_norm_wg_sum(A v, __local A *buf) {
    int l = (int)get_local_id(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = PC_WG / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] += buf[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    A r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// Two sums at once (buf holds 2 * PC_WG values).
inline void pc_norm_wg_sum2(A *u, A *v, __local A *buf) {
    int l = (int)get_local_id(0);
    buf[l] = *u;
    buf[PC_WG + l] = *v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = PC_WG / 2; s > 0; s >>= 1) {
        if (l < s) {
            buf[l] += buf[l + s];
            buf[PC_WG + l] += buf[PC_WG + l + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    *u = buf[0];
    *v = buf[PC_WG];
    barrier(CLK_LOCAL_MEM_FENCE);
}

// out = x * inv_rms * w, inv_rms = 1 / sqrt(mean(x^2) + eps).
__kernel void pc_norm_rms(__global const S *x, long xo, __global const S *w, long wo,
                          __global S *y, long yo, __global float *inv, long io, long h, A eps) {
    __local A buf[PC_WG];
    long row = get_group_id(0);
    long l = get_local_id(0);
    __global const S *xr = x + xo + row * h;
    A ss = 0;
    for (long i = l; i < h; i += PC_WG) {
        A v = LD(xr, i);
        ss += v * v;
    }
    ss = pc_norm_wg_sum(ss, buf);
    A r = (A)1 / sqrt(ss / (A)h + eps);
    if (l == 0) inv[io + row] = (float)r;
    __global S *yr = y + yo + row * h;
    for (long i = l; i < h; i += PC_WG) ST(yr, i, LD(xr, i) * r * LD(w, wo + i));
}

// grad_input = r (g w - x r^2 sum(g w x) / H), r the saved inv_rms.
__kernel void pc_norm_rms_backward(__global const S *g, long go, __global const S *x, long xo,
                                   __global const S *w, long wo, __global const float *inv,
                                   long io, __global S *dx, long dxo, long h) {
    __local A buf[PC_WG];
    long row = get_group_id(0);
    long l = get_local_id(0);
    __global const S *gr = g + go + row * h;
    __global const S *xr = x + xo + row * h;
    A dot = 0;
    for (long i = l; i < h; i += PC_WG) dot += LD(gr, i) * LD(w, wo + i) * LD(xr, i);
    dot = pc_norm_wg_sum(dot, buf);
    A r = (A)inv[io + row];
    A c = r * r * dot / (A)h;
    __global S *dr = dx + dxo + row * h;
    for (long i = l; i < h; i += PC_WG)
        ST(dr, i, r * (LD(gr, i) * LD(w, wo + i) - LD(xr, i) * c));
}

// part[c * h + j] = sum over the rows of chunk c of g[., j] x[., j] r.
// Global size (h, chunks).
__kernel void pc_norm_rms_partials(__global const S *g, long go, __global const S *x, long xo,
                                   __global const float *inv, long io, __global A *part,
                                   long h, long rows, long chunk) {
    long j = get_global_id(0);
    long c = get_global_id(1);
    if (j >= h) return;
    long r0 = c * chunk;
    long r1 = min(rows, r0 + chunk);
    A acc = 0;
    for (long r = r0; r < r1; ++r) {
        long k = r * h + j;
        acc += LD(g, go + k) * LD(x, xo + k) * (A)inv[io + r];
    }
    part[c * h + j] = acc;
}

// out[j] = sum over c < chunks of part[c * h + j] (0 when there are none).
__kernel void pc_norm_colsum(__global const A *part, long chunks, __global S *out, long oo,
                             long h) {
    long j = get_global_id(0);
    if (j >= h) return;
    A acc = 0;
    for (long c = 0; c < chunks; ++c) acc += part[c * h + j];
    ST(out, oo + j, acc);
}

// out = (x - mean) rstd w + b with the biased variance, from two passes.
__kernel void pc_norm_layer(__global const S *x, long xo, __global const S *w, long wo,
                            __global const S *b, long bo, __global S *y, long yo,
                            __global float *mean, long mo, __global float *rstd, long ro, long h,
                            A eps) {
    __local A buf[PC_WG];
    long row = get_group_id(0);
    long l = get_local_id(0);
    __global const S *xr = x + xo + row * h;
    A s = 0;
    for (long i = l; i < h; i += PC_WG) s += LD(xr, i);
    A mu = pc_norm_wg_sum(s, buf) / (A)h;
    A q = 0;
    for (long i = l; i < h; i += PC_WG) {
        A d = LD(xr, i) - mu;
        q += d * d;
    }
    q = pc_norm_wg_sum(q, buf);
    A rs = (A)1 / sqrt(q / (A)h + eps);
    if (l == 0) {
        mean[mo + row] = (float)mu;
        rstd[ro + row] = (float)rs;
    }
    __global S *yr = y + yo + row * h;
    for (long i = l; i < h; i += PC_WG)
        ST(yr, i, (LD(xr, i) - mu) * rs * LD(w, wo + i) + LD(b, bo + i));
}

// With xhat = (x - mean) rstd and gy = g w:
// grad_input = rstd (gy - mean(gy) - xhat mean(gy xhat)).
__kernel void pc_norm_layer_backward(__global const S *g, long go, __global const S *x, long xo,
                                     __global const S *w, long wo, __global const float *mean,
                                     long mo, __global const float *rstd, long ro,
                                     __global S *dx, long dxo, long h) {
    __local A buf[2 * PC_WG];
    long row = get_group_id(0);
    long l = get_local_id(0);
    __global const S *gr = g + go + row * h;
    __global const S *xr = x + xo + row * h;
    A mu = (A)mean[mo + row];
    A rs = (A)rstd[ro + row];
    A sa = 0, sb = 0;
    for (long i = l; i < h; i += PC_WG) {
        A gy = LD(gr, i) * LD(w, wo + i);
        sa += gy;
        sb += gy * ((LD(xr, i) - mu) * rs);
    }
    pc_norm_wg_sum2(&sa, &sb, buf);
    A a = sa / (A)h;
    A bm = sb / (A)h;
    __global S *dr = dx + dxo + row * h;
    for (long i = l; i < h; i += PC_WG) {
        A gy = LD(gr, i) * LD(w, wo + i);
        A xh = (LD(xr, i) - mu) * rs;
        ST(dr, i, rs * (gy - a - xh * bm));
    }
}

// pw[c * h + j] = sum over the rows of chunk c of g xhat, pb[...] of g.
// Global size (h, chunks).
__kernel void pc_norm_layer_partials(__global const S *g, long go, __global const S *x, long xo,
                                     __global const float *mean, long mo,
                                     __global const float *rstd, long ro, __global A *pw,
                                     __global A *pb, long h, long rows, long chunk) {
    long j = get_global_id(0);
    long c = get_global_id(1);
    if (j >= h) return;
    long r0 = c * chunk;
    long r1 = min(rows, r0 + chunk);
    A aw = 0, ab = 0;
    for (long r = r0; r < r1; ++r) {
        long k = r * h + j;
        A gv = LD(g, go + k);
        aw += gv * ((LD(x, xo + k) - (A)mean[mo + r]) * (A)rstd[ro + r]);
        ab += gv;
    }
    pw[c * h + j] = aw;
    pb[c * h + j] = ab;
}
