// One AdamW step, in place, one work-item per element of compact tensors:
// param and grad in the program's dtype, the moments m and v in f32, all
// computed in A. The host folds the step's scalars (in f64, then rounded
// to A):
//   decay        1 - lr * weight_decay
//   step_size    lr / (1 - beta1^step)
//   inv_sqrt_bc2 1 / sqrt(1 - beta2^step)
//   c1, c2       1 - beta1, 1 - beta2
// so that
//   m = b1 m + c1 g,  v = b2 v + c2 g^2,
//   p = p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps)
// which is p -= lr wd p; p -= lr m_hat / (sqrt(v_hat) + eps).

__kernel void pc_adamw(__global S *p, long poff, __global const S *g, long goff,
                       __global float *m, long moff, __global float *v, long voff, long n,
                       A decay, A step_size, A inv_sqrt_bc2, A b1, A c1, A b2, A c2, A eps) {
    long i = get_global_id(0);
    if (i >= n) return;
    A gi = LD(g, goff + i);
    A mi = b1 * (A)m[moff + i] + c1 * gi;
    A vi = b2 * (A)v[voff + i] + c2 * (gi * gi);
    m[moff + i] = (float)mi;
    v[voff + i] = (float)vi;
    A pi = LD(p, poff + i);
    ST(p, poff + i, pi * decay - step_size * mi / (sqrt(vi) * inv_sqrt_bc2 + eps));
}
