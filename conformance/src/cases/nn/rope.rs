//! Cases of rotary position embedding, forward and backward.

use super::*;

/// `[batch, seq, heads, D]`, interleaved pairs, the first position, and the
/// layouts of (input, cos/sin tables, out). The last two have an odd number
/// of pairs in each layout (D = 2 and 10 interleaved, 6 half-split): a
/// kernel that rotates two pairs a step drops the last one there. The
/// third from last is half-split with a batch of 2 (round 7: a half-split kernel
/// that ignored the batch passed, every batch-2 plan being interleaved).
const ROPE_PLANS: [([usize; 4], bool, usize, Layout, Layout, Layout); 12] = [
    ([1, 8, 2, 16], false, 0, C, C, C),
    ([2, 5, 3, 8], true, 0, C, C, C),
    ([1, 1, 1, 2], false, 3, C, C, C),
    ([1, 6, 4, 32], false, 10, T, C, C),
    ([2, 4, 2, 12], true, 7, S, C, S),
    ([1, 7, 3, 16], true, 0, C, T, T),
    ([1, 9, 2, 10], false, 0, C, S, C),
    ([1, 16, 8, 32], false, 4000, C, C, C),
    ([1, 3, 2, 2], true, 1, C, C, C),
    ([2, 5, 3, 8], false, 0, C, C, C),
    ([2, 5, 2, 10], true, 0, C, C, C),
    ([1, 4, 3, 6], false, 2, C, C, C),
];

/// Input and output stored sequence-major (`[seq, batch, heads, D]`, as
/// Megatron keeps them) and seen as `[batch, seq, heads, D]`: the first two
/// dims swapped in memory, the last two compact. A kernel that judges a
/// view compact by its inner dims, or walks it as `[rows, D]` with one row
/// stride, rotates pairs by another position's angle. (Run after the plans
/// above, so that their values stay as they were.)
const PERMUTED_ROPE: ([usize; 4], bool, usize, Layout, Layout, Layout) =
    ([2, 5, 3, 8], false, 3, P, C, P);

/// The `cos` and `sin` tables `[seq, D/2]` of positions `first..first+seq`
/// with the usual frequencies `10000^(-2j/D)`.
pub(crate) fn rope_tables(seq: usize, d: usize, first: usize) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let angle = |i: usize| {
        let (pos, j) = (first + i / half, i % half);
        pos as f64 * 10000f64.powf(-2.0 * j as f64 / d as f64)
    };
    let n = seq * half;
    (
        (0..n).map(|i| angle(i).cos()).collect(),
        (0..n).map(|i| angle(i).sin()).collect(),
    )
}

fn rope_family(op: &'static str, backward: bool, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op, dtype);
    let mut cases = Vec::new();
    for (shape, interleaved, first, l_in, l_tab, l_out) in
        ROPE_PLANS.into_iter().chain([PERMUTED_ROPE])
    {
        let [_, seq, _, d] = shape;
        let (cos, sin) = rope_tables(seq, d, first);
        let x = rng.values(dtype, numel(&shape), -2.0, 2.0);
        let pairs = if interleaved {
            "interleaved"
        } else {
            "half-split"
        };
        let mut name = format!("{} {pairs}", shape_label(&shape, C));
        if first > 0 {
            name.push_str(&format!(" from position {first}"));
        }
        for (tensor, layout) in [("input", l_in), ("tables", l_tab), ("out", l_out)] {
            if layout != C {
                name.push_str(&format!(" {tensor} {layout}"));
            }
        }
        cases.push(case(
            op,
            dtype,
            name,
            vec![
                input("input", dtype, &shape, x, l_in),
                input("cos", DType::F32, &[seq, d / 2], cos, l_tab),
                input("sin", DType::F32, &[seq, d / 2], sin, l_tab),
                output("out", dtype, &shape, l_out),
            ],
            // Two products and a sum per element in f32 (the tables are
            // exact f32), x cos - y sin cancelling against terms of the size
            // of the tensor's scale; rounded once.
            Tolerance::accumulated(2.0, 2).with_bias(Bias::LowPrecision),
            move |exec, t| {
                if backward {
                    exec.rope_backward(&t[0], &t[1], &t[2], &t[3], interleaved)
                } else {
                    exec.rope(&t[0], &t[1], &t[2], &t[3], interleaved)
                }
            },
            move |d| {
                let r = if backward {
                    reference::rope_backward(&d[0], &d[1], &d[2], interleaved)
                } else {
                    reference::rope(&d[0], &d[1], &d[2], interleaved)
                };
                Ok(vec![r?])
            },
        ));
    }
    cases
}

pub(super) fn rope_cases(dtype: DType) -> Vec<Case> {
    rope_family("rope", false, dtype)
}

pub(super) fn rope_backward_cases(dtype: DType) -> Vec<Case> {
    rope_family("rope_backward", true, dtype)
}
