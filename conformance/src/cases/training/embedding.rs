//! Cases of embedding lookup and its backward.

use super::*;
use crate::case::TensorSpec;

// ---------------------------------------------------------------------------
// Embedding.

/// One embedding case: table `[V, H]`, indices of `shape` and dtype, and
/// the layouts of (table, indices, rows).
pub(super) struct EmbeddingPlan {
    label: String,
    vocab: usize,
    h: usize,
    idx_shape: Vec<usize>,
    idx_dtype: DType,
    idx: Vec<f64>,
    layouts: [Layout; 3],
}

/// The plans shared by `embedding` and `embedding_backward`: repeated
/// indices, both index dtypes, a 0-d and an empty index tensor, every layout,
/// and indices out of range (which must be refused).
pub(super) fn embedding_plans(rng: &mut Rng) -> Vec<EmbeddingPlan> {
    let mut plans = Vec::new();
    let mut plan = |label: &str,
                    (vocab, h): (usize, usize),
                    shape: &[usize],
                    idx_dtype: DType,
                    idx: Vec<i64>,
                    layouts: [Layout; 3]| {
        assert_eq!(idx.len(), numel(shape));
        let label = format!(
            "{label} V {vocab} H {h} indices {} {idx_dtype}{}",
            shape_label(shape, C),
            self::layouts(&[
                ("table", layouts[0]),
                ("indices", layouts[1]),
                ("rows", layouts[2])
            ])
        );
        plans.push(EmbeddingPlan {
            label,
            vocab,
            h,
            idx_shape: shape.to_vec(),
            idx_dtype,
            idx: idx.into_iter().map(|i| i as f64).collect(),
            layouts,
        });
    };
    let mut random =
        |n: usize, vocab: usize| -> Vec<i64> { (0..n).map(|_| rng.below(vocab) as i64).collect() };
    plan(
        "repeated",
        (10, 8),
        &[2, 3],
        DType::I64,
        vec![3, 7, 3, 0, 9, 3],
        [C; 3],
    );
    plan("random", (50, 16), &[7], DType::I32, random(7, 50), [C; 3]);
    plan(
        "many repeats",
        (5, 6),
        &[4, 6],
        DType::I32,
        random(24, 5),
        [C; 3],
    );
    plan(
        "one hot row",
        (7, 4),
        &[12],
        DType::I64,
        vec![2; 12],
        [C; 3],
    );
    plan("scalar", (6, 4), &[], DType::I64, vec![5], [C; 3]);
    plan("empty", (6, 4), &[0], DType::I32, vec![], [C; 3]);
    plan(
        "long table",
        (1000, 1),
        &[20],
        DType::I64,
        random(20, 1000),
        [C; 3],
    );
    plan(
        "random",
        (12, 6),
        &[4],
        DType::I64,
        random(4, 12),
        [T, C, C],
    );
    plan(
        "random",
        (9, 5),
        &[3, 2],
        DType::I32,
        random(6, 9),
        [S, S, S],
    );
    plan(
        "random",
        (8, 7),
        &[2, 5],
        DType::I64,
        random(10, 8),
        [C, T, T],
    );
    // An odd number of elements in the rows and the table (15 and 45):
    // a kernel that stores 16-bit values in pairs writes one past the end.
    plan("odd sizes", (9, 5), &[3], DType::I64, random(3, 9), [C; 3]);
    plan(
        "index out of range",
        (10, 4),
        &[3],
        DType::I64,
        vec![1, 10, 2],
        [C; 3],
    );
    plan(
        "negative index out of range",
        (10, 4),
        &[2, 2],
        DType::I32,
        vec![0, 4, -1, 2],
        [C; 3],
    );
    // One index out of range at a time, each at an extreme of its dtype:
    // 2^32 + 1 (1 once narrowed to 32 bits), the most negative and the
    // largest i64 (0 and -1 in 32 bits), and the ends of i32.
    for (idx_dtype, bad) in EXTREME_INDICES {
        plan(
            &format!("index {bad} out of range"),
            (10, 4),
            &[3],
            idx_dtype,
            vec![2, bad, 0],
            [C; 3],
        );
    }
    // One bad index after 1,100 good ones, past the first work-group
    // or block of a device-side range check (mutation round 9: an OpenCL
    // check whose one work-group looked at its first 256 ids only let a
    // bad id at 1,100 through, and the lookup wrote zeros for it).
    for (idx_dtype, bad) in [(DType::I32, -1), (DType::I64, 10)] {
        let mut idx: Vec<i64> = (0..1100).map(|i| (i * 7) % 10).collect();
        idx.push(bad);
        plan(
            &format!("index {bad} out of range after 1100 in range"),
            (10, 4),
            &[1101],
            idx_dtype,
            idx,
            [C; 3],
        );
    }
    plans
}

/// Indices out of range at the extremes of their dtype, one per case.
pub(super) const EXTREME_INDICES: [(DType, i64); 5] = [
    (DType::I64, (1 << 32) + 1),
    (DType::I64, i64::MIN),
    (DType::I64, i64::MAX),
    (DType::I32, i32::MIN as i64),
    (DType::I32, i32::MAX as i64),
];

/// An `embedding` case of `[weight, indices, out]`: a copy, so the bits
/// must match.
pub(crate) fn embedding_call(dtype: DType, label: String, tensors: [TensorSpec; 3]) -> Case {
    case(
        "embedding",
        dtype,
        label,
        tensors.into(),
        Tolerance::EXACT,
        |exec, t| exec.embedding(&t[0], &t[1], &t[2]),
        |d| Ok(vec![reference::embedding(&d[0], &indices(&d[1]))?]),
    )
}

pub(super) fn embedding_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("embedding", dtype);
    let mut cases = Vec::new();
    let mut push = |p: EmbeddingPlan, table: Vec<f64>| {
        let mut out_shape = p.idx_shape.clone();
        out_shape.push(p.h);
        cases.push(embedding_call(
            dtype,
            p.label,
            [
                input("weight", dtype, &[p.vocab, p.h], table, p.layouts[0]),
                input("indices", p.idx_dtype, &p.idx_shape, p.idx, p.layouts[1]),
                output("out", dtype, &out_shape, p.layouts[2]),
            ],
        ));
    };
    for p in embedding_plans(&mut rng) {
        let table = rng.values(dtype, p.vocab * p.h, -2.0, 2.0);
        push(p, table);
    }
    // Rows of NaN, infinities, signed zeros and subnormals are copied bit for bit.
    let s = specials(dtype);
    let (vocab, h) = (3, s.len());
    let table: Vec<f64> = (0..vocab * h).map(|i| s[(i + i / h) % h]).collect();
    let idx = vec![2.0, 0.0, 1.0, 2.0];
    push(
        EmbeddingPlan {
            label: "special values".into(),
            vocab,
            h,
            idx_shape: vec![4],
            idx_dtype: DType::I64,
            idx,
            layouts: [C; 3],
        },
        table,
    );
    cases
}

pub(super) fn embedding_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("embedding_backward", dtype);
    let mut cases = Vec::new();
    for p in embedding_plans(&mut rng) {
        let mut rows_shape = p.idx_shape.clone();
        rows_shape.push(p.h);
        let g = rng.values(dtype, numel(&rows_shape), -1.0, 1.0);
        // Accumulates into a gradient that is not zero.
        let prev = rng.values(dtype, p.vocab * p.h, -1.0, 1.0);
        let r = max_repeats(&p.idx);
        cases.push(case(
            "embedding_backward",
            dtype,
            p.label,
            vec![
                input("grad_out", dtype, &rows_shape, g, p.layouts[2]),
                input("indices", p.idx_dtype, &p.idx_shape, p.idx, p.layouts[1]),
                inout("grad_weight", dtype, &[p.vocab, p.h], prev, p.layouts[0]),
            ],
            // A row receives up to `r` updates. The operator accumulates in
            // at least f32 *per update*: a plugin may store the row in the
            // dtype after each one (atomic adds on f16/bf16, for example),
            // which is one rounding of the dtype per update before the last,
            // hence `low = r - 1`; the n = r term covers the f32 additions
            // of a plugin that sums in f32 and stores once.
            Tolerance::accumulated(0.0, r).with_low(r.saturating_sub(1) as f64),
            |exec, t| exec.embedding_backward(&t[0], &t[1], &t[2]),
            |d| {
                Ok(vec![reference::embedding_backward(
                    &d[0],
                    &indices(&d[1]),
                    &d[2],
                )?])
            },
        ));
    }
    cases
}
