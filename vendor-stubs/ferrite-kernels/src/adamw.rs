//! One AdamW optimizer step, in place, element by element (decoupled weight
//! decay, bias correction), through the blocked elementwise driver: the
//! parameter (any of `f32`/`f16`/`bf16`) and the `f32` moments are updated
//! in `f32`, vectorized and, for large tensors, in parallel.

use crate::error::{KernelError, bail};
use crate::map::{Access, check_f32, check_float, check_shape, map_blocks};
use crate::view::View;

/// One AdamW step:
///
/// ```text
/// p -= lr * weight_decay * p
/// m = beta1 m + (1 - beta1) g
/// v = beta2 v + (1 - beta2) g^2
/// p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
/// ```
///
/// `param` and `grad` share a float dtype, `exp_avg` (`m`) and `exp_avg_sq`
/// (`v`) are `f32`, all of one shape. `step` is 1-based; `step < 1` is an
/// error.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the four views must not overlap each other or themselves.
#[allow(clippy::too_many_arguments)]
pub unsafe fn adamw(
    param: &View,
    grad: &View,
    exp_avg: &View,
    exp_avg_sq: &View,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: i64,
) -> Result<(), KernelError> {
    let k = "adamw";
    check_float(k, "param", param)?;
    check_float(k, "grad", grad)?;
    check_f32(k, "exp_avg", exp_avg)?;
    check_f32(k, "exp_avg_sq", exp_avg_sq)?;
    if grad.dtype != param.dtype {
        bail!("{k}: grad is {:?}, param is {:?}", grad.dtype, param.dtype);
    }
    for (name, v) in [
        ("grad", grad),
        ("exp_avg", exp_avg),
        ("exp_avg_sq", exp_avg_sq),
    ] {
        check_shape(k, name, v, param.shape)?;
    }
    if step < 1 {
        bail!("{k}: step must be at least 1, got {step}");
    }
    let t = step as f64;
    let (bc1, bc2) = (1.0 - beta1.powf(t), 1.0 - beta2.powf(t));
    let c = Consts {
        decay: (1.0 - lr * weight_decay) as f32,
        step_size: (lr / bc1) as f32,
        inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
        b1: beta1 as f32,
        c1: (1.0 - beta1) as f32,
        b2: beta2 as f32,
        c2: (1.0 - beta2) as f32,
        eps: eps as f32,
    };
    let ops = [
        (param, Access::Update),
        (grad, Access::Read),
        (exp_avg, Access::Update),
        (exp_avg_sq, Access::Update),
    ];
    // SAFETY: forwarded from this function's contract.
    unsafe { map_blocks(ops, 4, |b| step_block(&c, b)) };
    Ok(())
}

/// The step's scalars, in `f32`.
struct Consts {
    decay: f32,
    step_size: f32,
    inv_sqrt_bc2: f32,
    b1: f32,
    c1: f32,
    b2: f32,
    c2: f32,
    eps: f32,
}

/// Updates one block of parameters and moments (inlined into the
/// dispatching driver, so it is compiled for AVX2 there).
#[inline(always)]
fn step_block(c: &Consts, [p, g, m, v]: [&mut [f32]; 4]) {
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for i in 0..n {
        let gi = g[i];
        let mi = c.b1 * m[i] + c.c1 * gi;
        let vi = c.b2 * v[i] + c.c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * c.decay - c.step_size * mi / (vi.sqrt() * c.inv_sqrt_bc2 + c.eps);
    }
}
