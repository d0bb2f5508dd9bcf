//! Cases of AdamW and scale.

use super::*;

// ---------------------------------------------------------------------------
// AdamW.

pub(super) fn adamw_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("adamw", dtype);
    let mut cases = Vec::new();
    // The hyper-parameters arrive as f64, and a plugin may round them to
    // f32 before use ("computed in at least f32"). 1 - beta2 then carries a
    // relative error of u(f32) / (1 - beta2), about 200 u(f32) for 0.999,
    // which shows in exp_avg_sq when its old value is small next to
    // (1 - beta2) g^2. So beta2 = 0.999 comes with a second moment of the
    // size of g^2 (as after a few steps), and the first step from zero
    // moments uses beta2 = 0.95 (common for large models), whose 1 - beta2
    // is within a few u(f32) in f32.
    // (shape, layouts of param, grad, moments, step, lr, beta2,
    // weight decay, zero moments)
    type Plan = (&'static [usize], [Layout; 3], i64, f64, f64, f64, bool);
    // The last two: a step past 2^15 and 2^16 (a long run: a step count
    // narrowed to 16 bits wraps), and a learning rate of 0 (the first step
    // of a warm-up schedule: the parameter keeps its value, but the
    // moments still update).
    let plans: [Plan; 11] = [
        (&[64], [C; 3], 1, 1e-3, 0.95, 0.0, true),
        (&[64], [C; 3], 1, 1e-3, 0.95, 0.1, true),
        (&[8, 16], [C; 3], 10, 1e-3, 0.999, 0.0, false),
        (&[8, 16], [C; 3], 10, 1e-3, 0.999, 0.1, false),
        (&[3, 5, 7], [C; 3], 1, 1e-2, 0.999, 0.1, false),
        (&[1], [C; 3], 10, 1e-2, 0.95, 0.1, false),
        (&[12, 10], [T, S, C], 10, 1e-3, 0.999, 0.1, false),
        (&[6, 9], [S, C, T], 1, 1e-3, 0.95, 0.0, true),
        (&[4, 4], [C; 3], 0, 1e-3, 0.999, 0.0, false),
        (&[8, 16], [C; 3], 100_000, 1e-3, 0.999, 0.1, false),
        (&[8, 16], [C; 3], 10, 0.0, 0.999, 0.1, false),
    ];
    // In bf16 and f16 a step of 1e-3 is below half an ULP of a parameter
    // of about 1, so that a plugin that skipped the update (or its weight
    // decay) would round to the same parameter: there the learning rate is
    // 64 times larger and the weight decay 0.3, so that the decay alone,
    // lr wd |p| ~ 0.02 |p|, is several ULPs of p.
    let narrow = matches!(dtype, DType::BF16 | DType::F16);
    let planned =
        |rng: &mut Rng, (shape, [l_p, l_g, l_m], step, lr, beta2, weight_decay, zero): Plan| {
            let (lr, weight_decay) = if narrow {
                (lr * 64.0, if weight_decay > 0.0 { 0.3 } else { 0.0 })
            } else {
                (lr, weight_decay)
            };
            let n = numel(shape);
            let p = rng.values(dtype, n, -1.0, 1.0);
            let mut g = rng.values(dtype, n, -1.0, 1.0);
            let (m, v) = if zero {
                // A zero gradient leaves zero moments and no update.
                g[0] = 0.0;
                (vec![0.0; n], vec![0.0; n])
            } else {
                (
                    rng.values(DType::F32, n, -0.3, 0.3),
                    rng.values(DType::F32, n, 0.25, 1.0),
                )
            };
            let h = AdamwOptions {
                lr,
                beta1: 0.9,
                beta2,
                eps: 1e-8,
                weight_decay,
                step,
            };
            let moments = if zero { "zero moments" } else { "moments" };
            let label = format!(
                "{} step {step} lr {lr} beta2 {beta2} weight decay {weight_decay} {moments}{}",
                shape_label(shape, C),
                layouts(&[("param", l_p), ("grad", l_g), ("moments", l_m)])
            );
            adamw_case(dtype, label, shape, [p, g, m, v], [l_p, l_g, l_m], h)
        };
    for plan in plans {
        cases.push(planned(&mut rng, plan));
    }
    // Gradients the size of eps, in the first steps: eps is added to
    // sqrt(v / (1 - beta2^t)), and a kernel that folds the bias correction
    // into the step size instead (Adam's paper's "epsilon hat", TF/Keras)
    // adds it to sqrt(v), eps / sqrt(1 - beta2^t) in effect: 4.5 times
    // too large here. (eps 1e-2 with gradients of about 1e-2, so that f16
    // holds them.)
    for step in [1, 3] {
        let n = 32;
        let (lr, eps) = (if narrow { 6.4e-2 } else { 1e-3 }, 1e-2);
        let p = rng.values(dtype, n, -1.0, 1.0);
        let g = rng.values(dtype, n, -3e-2, 3e-2);
        let (m, v) = if step == 1 {
            (vec![0.0; n], vec![0.0; n])
        } else {
            let m = rng.values(DType::F32, n, -3e-3, 3e-3);
            let v = rng.values(DType::F32, n, 1e-5, 1e-4);
            (m, v)
        };
        let h = AdamwOptions {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps,
            weight_decay: 0.0,
            step,
        };
        let label = format!(
            "[32] step {step} lr {lr} beta2 0.95 weight decay 0 eps {eps} , gradients about eps"
        );
        cases.push(adamw_case(dtype, label, &[n], [p, g, m, v], [C; 3], h));
    }
    // The parameter and moments permuted, four dims (rows not evenly
    // spaced, the last two dims compact), the gradient compact: a kernel
    // that handles two-dimensional views only, or judges a view compact by
    // its inner dims, updates the wrong elements. (With every tensor
    // permuted alike, one that takes each in memory order would be right
    // by accident.)
    let permuted = Layout::Permuted;
    let plan: Plan = (
        &[2, 3, 4, 5],
        [permuted, C, permuted],
        10,
        1e-3,
        0.999,
        0.1,
        false,
    );
    cases.push(planned(&mut rng, plan));
    cases
}

/// One AdamW step on tensors of `shape`: the starting `[param, grad,
/// exp_avg, exp_avg_sq]` values in layouts `[param, grad, moments]`.
pub(crate) fn adamw_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    [p, g, m, v]: [Vec<f64>; 4],
    [l_p, l_g, l_m]: [Layout; 3],
    h: AdamwOptions,
) -> Case {
    case(
        "adamw",
        dtype,
        label,
        vec![
            inout("param", dtype, shape, p, l_p),
            input("grad", dtype, shape, g, l_g),
            inout("exp_avg", DType::F32, shape, m, l_m),
            inout("exp_avg_sq", DType::F32, shape, v, l_m),
        ],
        // See `adamw_tolerance`.
        adamw_tolerance(h.step, h.beta1, h.beta2),
        move |exec, t| exec.adamw(&t[0], &t[1], &t[2], &t[3], h),
        move |d| {
            let (p, m, v) = reference::adamw(
                &d[0],
                &d[1],
                &d[2],
                &d[3],
                h.lr,
                h.beta1,
                h.beta2,
                h.eps,
                h.weight_decay,
                h.step,
            )?;
            Ok(vec![p, m, v])
        },
    )
}

/// The error model of one AdamW step. The new parameter is judged relative
/// to the update `lr (m_hat / (sqrt(v_hat) + eps) + wd p)`, not to the
/// parameter: an ULP of the stored parameter (a kernel may store the
/// decayed parameter `p (1 - lr wd)` before subtracting the Adam step, as
/// PyTorch's `mul_` then `addcdiv_` do: two roundings at the parameter's
/// magnitude), plus the update's own
/// relative error. That error is a dozen f32 roundings, and the f32
/// rounding of the hyper-parameters as it propagates: `1 - beta` carries
/// `u(f32) / (1 - beta)` relative (the moments' new terms), and the bias
/// correction `1 - beta^t` carries `t beta^t / (1 - beta^t)` u(f32)
/// relative. The moments are judged relative to themselves, with the
/// cancellation of `beta1 m + (1 - beta1) g` against terms of the tensor's
/// scale (n = 2).
fn adamw_tolerance(step: i64, beta1: f64, beta2: f64) -> Tolerance {
    let correction = |beta: f64| {
        let bt = beta.powi(step.clamp(1, 1000) as i32);
        step.max(1) as f64 * bt / (1.0 - bt)
    };
    let hyper = correction(beta1) + correction(beta2) + 1.0 / (1.0 - beta1) + 1.0 / (1.0 - beta2);
    // 1.5 ULPs: the decayed parameter and the new one are each rounded
    // (half an ULP each), and the factor `1 - lr wd` is itself rounded to
    // f32 before it multiplies the parameter (another half ULP of it), as
    // PyTorch's `mul_` by a Python float does.
    Tolerance {
        round: 1.5,
        ..Tolerance::accumulated(16.0 + hyper, 2)
    }
    .change_relative(&["param"])
}

// ---------------------------------------------------------------------------
// Scale.

pub(super) fn scale_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("scale", dtype);
    let mut cases = Vec::new();
    // One product in f32, rounded once; alpha itself may be rounded to f32
    // first, a relative error of u(f32) common to every element (so f32
    // outputs are not tested for bias).
    let product = Tolerance::computed(2.0);
    let mut push = |label: String,
                    shape: &[usize],
                    x: Vec<f64>,
                    layout: Layout,
                    alpha: f64,
                    tolerance: Tolerance| {
        cases.push(case(
            "scale",
            dtype,
            label,
            vec![inout("tensor", dtype, shape, x, layout)],
            tolerance,
            move |exec, t| exec.scale(&t[0], alpha),
            move |d| Ok(vec![reference::scale(&d[0], alpha)?]),
        ));
    };
    let plans: [(&[usize], Layout, f64); 8] = [
        (&[5], C, 0.5),
        (&[4, 6], T, -3.0),
        (&[3, 8], S, 0.5),
        (&[2, 3, 4], C, -3.0),
        (&[], C, -3.0),
        (&[0, 3], C, 0.5),
        (&[100, 100], C, 0.3),
        (&[7, 5], S, 1.0 / 7.0),
    ];
    for (shape, layout, alpha) in plans {
        let x = rng.values(dtype, numel(shape), -4.0, 4.0);
        let label = format!("{} alpha {alpha}", shape_label(shape, layout));
        push(label, shape, x, layout, alpha, product);
    }
    // IEEE products: NaN stays NaN, infinities keep or flip their sign, the
    // largest value overflows by 3, the smallest subnormal halves to 0.
    // Halving is exact in any wider format, so the result is a pure
    // rounding: the subnormals of the dtype halve to ties, which must go
    // to even; multiplying by 1 must change nothing.
    let sub = subnormals(dtype);
    for alpha in [0.5, 1.0] {
        push(
            format!("subnormals and ties alpha {alpha}"),
            &[sub.len()],
            sub.clone(),
            C,
            alpha,
            Tolerance::EXACT,
        );
    }
    // alpha 0 is a product too (NaN and infinities give NaN, negative
    // values -0), not a memset to zero.
    let s = specials(dtype);
    for alpha in [0.5, -3.0, 0.0] {
        push(
            format!("special values alpha {alpha}"),
            &[s.len()],
            s.clone(),
            C,
            alpha,
            product,
        );
    }
    // A permuted tensor of three dims, whose rows are not evenly spaced: a
    // kernel that walks [..., last] as [rows, last] with one row stride
    // scales outside the view and leaves rows as they were. (Three dims,
    // not four: with the last two compact it would scale every element in
    // another order, which scaling in place cannot tell.)
    let shape = [3, 4, 5];
    let x = rng.values(dtype, numel(&shape), -4.0, 4.0);
    let label = format!("{} alpha -3", shape_label(&shape, Layout::Permuted));
    push(label, &shape, x, Layout::Permuted, -3.0, product);
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::TensorSpec;
    use crate::compare::compare;
    use crate::values::round_to;

    /// AdamW as a buggy plugin would compute it, rounded as stored.
    fn buggy(case: &Case, bug: &str) -> Vec<f64> {
        let d: Vec<Dense> = case.tensors.iter().map(TensorSpec::dense).collect();
        let label = &case.label;
        let number = |key: &str| -> f64 {
            let rest = &label[label.find(key).unwrap() + key.len()..];
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        let (lr, beta2, wd, step) = (
            number(" lr "),
            number(" beta2 "),
            number(" weight decay "),
            number(" step ") as i64,
        );
        let eps = if label.contains(" eps ") {
            number(" eps ")
        } else {
            1e-8
        };
        let (wd, step, eps) = match bug {
            "no weight decay" => (0.0, step, eps),
            // beta^step vanishes: no bias correction.
            "no bias correction" => (wd, 1_000_000, eps),
            // eps added to sqrt(v) with the correction folded into the
            // step size: eps / sqrt(1 - beta2^t) in effect.
            "epsilon hat" => (wd, step, eps / (1.0 - beta2.powi(step as i32)).sqrt()),
            _ => (wd, step, eps),
        };
        let (p, _, _) =
            reference::adamw(&d[0], &d[1], &d[2], &d[3], lr, 0.9, beta2, eps, wd, step).unwrap();
        let p = if bug == "no update" {
            d[0].data.clone()
        } else {
            p.data
        };
        p.iter().map(|&v| round_to(case.dtype, v)).collect()
    }

    #[test]
    fn a_wrong_adamw_update_fails_and_the_right_one_passes() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for case in adamw_cases(dtype) {
                let d: Vec<Dense> = case.tensors.iter().map(TensorSpec::dense).collect();
                let Ok(out) = (case.reference)(&d) else {
                    continue;
                };
                let judge = |got: &[f64]| {
                    compare(
                        dtype,
                        got,
                        &out[0].data,
                        Some(&d[0].data),
                        &case.tolerance,
                        1.0,
                    )
                    .0
                    .failures
                };
                assert_eq!(judge(&buggy(&case, "none")), 0, "{dtype} {}", case.label);
                // Only the parameter is judged here: with lr 0 it keeps its
                // value whatever the bug (the moments' update is checked by
                // the suite); at step 100000 the bias correction is 1 to
                // within rounding.
                if case.label.contains(" lr 0 ") {
                    continue;
                }
                let mut bugs = vec!["no update"];
                if !case.label.contains("step 100000") {
                    bugs.push("no bias correction");
                }
                if !case.label.contains("weight decay 0 ") {
                    bugs.push("no weight decay");
                }
                if case.label.contains("gradients about eps") {
                    bugs.push("epsilon hat");
                }
                // A single element may round the same either way in bf16.
                if d[0].data.len() < 16 {
                    continue;
                }
                for bug in bugs {
                    assert!(
                        judge(&buggy(&case, bug)) > 0,
                        "{dtype} {}: {bug} passes",
                        case.label
                    );
                }
            }
        }
    }
}
