//! Cases of linear.

use super::*;

// ---------------------------------------------------------------------------
// Linear.

/// `(input shape, N, bias, layouts of input, weight, bias, out)`.
type LinearPlan = (&'static [usize], usize, bool, [Layout; 4]);

/// Inputs of three dimensions whose batch stride is not the rows' (a
/// reversed or broadcast batch) and an output so laid out: a kernel that
/// folds the leading dimensions into rows by the row stride alone reads or
/// writes the wrong rows (the derived layouts cover 2-D cases only: the
/// bases are the first and the largest). The next two have no input features (K = 0): the
/// output is the bias, or zeros, and must still be written. The last is a
/// short product over a long K with a bias (one output tile, K = 600: a
/// kernel that splits K adds the partial sums and the bias in an epilogue of
/// its own; mutation round 11: the split path dropped the bias).
pub(super) const LINEAR_PLANS: [LinearPlan; 17] = [
    (&[4, 16], 8, true, [C; 4]),
    (&[4, 16], 8, false, [C; 4]),
    (&[2, 3, 24], 5, true, [C; 4]),
    (&[5, 1], 7, true, [C; 4]),
    (&[4, 300], 6, false, [C; 4]),
    (&[4, 300], 6, true, [C, T, C, C]),
    (&[16], 4, true, [C; 4]),
    (&[1, 1, 8], 1, true, [C; 4]),
    (&[6, 12], 10, true, [T, C, C, C]),
    (&[6, 12], 10, true, [C, T, S, C]),
    (&[3, 20], 9, false, [S, S, C, S]),
    (&[2, 3, 24], 5, true, [Layout::Reversed(0), C, C, C]),
    (&[3, 2, 16], 4, false, [Layout::Broadcast(0), C, C, C]),
    (&[2, 3, 24], 5, true, [C, C, C, Layout::Reversed(0)]),
    (&[3, 0], 5, true, [C; 4]),
    (&[2, 2, 0], 3, false, [C; 4]),
    (&[2, 600], 3, true, [C; 4]),
];

pub(super) fn linear_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("linear", dtype);
    let mut cases = Vec::new();
    for (in_shape, n, has_bias, [l_in, l_w, l_b, l_out]) in LINEAR_PLANS {
        let k = *in_shape.last().expect("rank >= 1");
        let mut out_shape = in_shape[..in_shape.len() - 1].to_vec();
        out_shape.push(n);
        let mut x = rng.values(dtype, numel(in_shape), -2.0, 2.0);
        if let Layout::Broadcast(d) = l_in {
            // What a zero stride lets the kernel read: equal along `d`.
            x = crate::cases::variants::constant_along(&x, in_shape, d);
        }
        let w = rng.values(dtype, n * k, -1.0, 1.0);
        let mut tensors = vec![
            input("input", dtype, in_shape, x, l_in),
            input("weight", dtype, &[n, k], w, l_w),
        ];
        if has_bias {
            tensors.push(input(
                "bias",
                dtype,
                &[n],
                rng.values(dtype, n, -1.0, 1.0),
                l_b,
            ));
        }
        tensors.push(output("out", dtype, &out_shape, l_out));
        let bias_label = if has_bias { "bias" } else { "no bias" };
        let mut parts = vec![("input", l_in), ("weight", l_w), ("out", l_out)];
        if has_bias {
            parts.push(("bias", l_b));
        }
        let label = format!(
            "{} N {n} {bias_label}{}",
            shape_label(in_shape, C),
            layouts(&parts)
        );
        cases.push(case(
            "linear",
            dtype,
            label,
            tensors,
            // A dot product over K and the bias in f32, the final rounding.
            Tolerance::accumulated(0.0, k + 1),
            move |exec, t| {
                if has_bias {
                    exec.linear(&t[0], &t[1], Some(&t[2]), &t[3])
                } else {
                    exec.linear(&t[0], &t[1], None, &t[2])
                }
            },
            move |d| {
                let bias = if has_bias { Some(&d[2]) } else { None };
                Ok(vec![reference::linear(&d[0], &d[1], bias)?])
            },
        ));
    }
    cases
}
