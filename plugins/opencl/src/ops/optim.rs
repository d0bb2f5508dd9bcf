//! adamw (`kernels/optim.cl`): one work-item per element of compact
//! tensors (strided ones are packed and copied back by [`Ctx::finish`]).
//! The step's scalars are folded on the host in f64 and passed in the
//! compute type (f32 for the training dtypes).

use polychip_plugin_sdk::{AdamwArgs, Result};

use crate::call::Ctx;
use crate::ops::scalar;

/// `adamw`.
pub fn adamw(mut ctx: Ctx<'_>, args: &AdamwArgs<'_>) -> Result<()> {
    let p = ctx.inout("param", &args.param)?;
    let g = ctx.input("grad", &args.grad)?;
    let m = ctx.inout("exp_avg", &args.exp_avg)?;
    let v = ctx.inout("exp_avg_sq", &args.exp_avg_sq)?;
    let flavor = ctx.float(p.dtype)?;
    let n = p.numel();
    // `step` is at least 1 (checked by the SDK).
    let t = args.step as f64;
    let bc1 = 1.0 - args.beta1.powf(t);
    let bc2 = 1.0 - args.beta2.powf(t);
    let scalars = [
        1.0 - args.lr * args.weight_decay,
        args.lr / bc1,
        1.0 / bc2.sqrt(),
        args.beta1,
        1.0 - args.beta1,
        args.beta2,
        1.0 - args.beta2,
        args.eps,
    ];
    ctx.launch(flavor, "pc_adamw", &[n], None, |a| {
        a.tensor(&p)?
            .tensor(&g)?
            .tensor(&m)?
            .tensor(&v)?
            .value(n as i64)?;
        for s in scalars {
            scalar(a, flavor, s)?;
        }
        Ok(())
    })?;
    ctx.finish()
}
