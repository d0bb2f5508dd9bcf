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
    let plans: [Plan; 9] = [
        (&[64], [C; 3], 1, 1e-3, 0.95, 0.0, true),
        (&[64], [C; 3], 1, 1e-3, 0.95, 0.1, true),
        (&[8, 16], [C; 3], 10, 1e-3, 0.999, 0.0, false),
        (&[8, 16], [C; 3], 10, 1e-3, 0.999, 0.1, false),
        (&[3, 5, 7], [C; 3], 1, 1e-2, 0.999, 0.1, false),
        (&[1], [C; 3], 10, 1e-2, 0.95, 0.1, false),
        (&[12, 10], [T, S, C], 10, 1e-3, 0.999, 0.1, false),
        (&[6, 9], [S, C, T], 1, 1e-3, 0.95, 0.0, true),
        (&[4, 4], [C; 3], 0, 1e-3, 0.999, 0.0, false),
    ];
    for (shape, [l_p, l_g, l_m], step, lr, beta2, weight_decay, zero) in plans {
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
        cases.push(case(
            "adamw",
            dtype,
            label,
            vec![
                inout("param", dtype, shape, p, l_p),
                input("grad", dtype, shape, g, l_g),
                inout("exp_avg", DType::F32, shape, m, l_m),
                inout("exp_avg_sq", DType::F32, shape, v, l_m),
            ],
            // A dozen operations per element, none accumulating.
            Tolerance::ulps(16.0),
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
        ));
    }
    cases
}

// ---------------------------------------------------------------------------
// Scale.

pub(super) fn scale_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("scale", dtype);
    let mut cases = Vec::new();
    let mut push = |label: String, shape: &[usize], x: Vec<f64>, layout: Layout, alpha: f64| {
        cases.push(case(
            "scale",
            dtype,
            label,
            vec![inout("tensor", dtype, shape, x, layout)],
            // One product, rounded once; and alpha rounded to f32 (or the
            // dtype) first by a plugin that does so.
            Tolerance::ulps(2.0),
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
        push(label, shape, x, layout, alpha);
    }
    // IEEE products: NaN stays NaN, infinities keep or flip their sign, the
    // largest value overflows by 3, the smallest subnormal halves to 0.
    let s = specials(dtype);
    for alpha in [0.5, -3.0] {
        push(
            format!("special values alpha {alpha}"),
            &[s.len()],
            s.clone(),
            C,
            alpha,
        );
    }
    cases
}
