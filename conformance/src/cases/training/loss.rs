//! Cases of cross-entropy and its backward.

use super::*;
use crate::case::TensorSpec;

// ---------------------------------------------------------------------------
// Cross-entropy.

/// One cross-entropy case: logits `[N, C]` and targets `[N]`.
pub(super) struct CrossEntropyPlan {
    label: String,
    logits: Vec<f64>,
    n: usize,
    c: usize,
    targets: Vec<f64>,
    idx_dtype: DType,
    ignore_index: i64,
    /// Layouts of logits (and grad_logits) and targets.
    layouts: [Layout; 2],
    /// Extra accumulation terms for logits far from 0 (see where it is set).
    extra: usize,
    /// The backward's gradient of the loss, where a plan needs its own.
    grad_loss: Option<f64>,
}

/// The plans shared by the forward and backward operators.
pub(super) fn cross_entropy_plans(rng: &mut Rng, dtype: DType) -> Vec<CrossEntropyPlan> {
    let mut plans = Vec::new();
    let mut plan = |rng: &mut Rng,
                    label: &str,
                    (n, c): (usize, usize),
                    idx_dtype: DType,
                    ignore_index: i64,
                    targets: Option<Vec<i64>>,
                    lay: [Layout; 2],
                    offset: f64| {
        let targets = targets.unwrap_or_else(|| (0..n).map(|_| rng.below(c) as i64).collect());
        let logits = rng.values(dtype, n * c, offset - 4.0, offset + 4.0);
        let mut name = format!("{label} [{n}, {c}] {idx_dtype}");
        if ignore_index != -100 {
            name.push_str(&format!(" ignore_index {ignore_index}"));
        }
        name.push_str(&layouts(&[("logits", lay[0]), ("targets", lay[1])]));
        plans.push(CrossEntropyPlan {
            label: name,
            logits,
            n,
            c,
            targets: targets.into_iter().map(|t| t as f64).collect(),
            idx_dtype,
            ignore_index,
            layouts: lay,
            // A log-sum-exp of logits near `offset` is rounded at that
            // magnitude in f32: |offset| u(f32) more per row, i.e. about
            // |offset| / 2 more terms of accumulation against a loss of a
            // few units.
            extra: (offset.abs() / 2.0) as usize,
            grad_loss: None,
        });
    };
    plan(rng, "random", (8, 10), DType::I64, -100, None, [C; 2], 0.0);
    plan(rng, "random", (8, 10), DType::I32, -100, None, [C; 2], 0.0);
    plan(
        rng,
        "single class",
        (3, 1),
        DType::I64,
        -100,
        Some(vec![0; 3]),
        [C; 2],
        0.0,
    );
    plan(
        rng,
        "single row",
        (1, 17),
        DType::I32,
        -100,
        Some(vec![16]),
        [C; 2],
        0.0,
    );
    plan(
        rng,
        "long rows",
        (16, 1000),
        DType::I32,
        -100,
        None,
        [C; 2],
        0.0,
    );
    let t = vec![4, -100, 0, 49, -100, 7];
    plan(
        rng,
        "ignored rows",
        (6, 50),
        DType::I64,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    // PyTorch's default ignore_index, -100, with 32-bit targets (an index
    // read as unsigned 32 bits is 4294967196, refused as out of range).
    let t = vec![4, -100, 0, 49, -100, 7];
    plan(
        rng,
        "ignored rows",
        (6, 50),
        DType::I32,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    let t = vec![3, 1, 3, 0, 6, 3, 2];
    plan(
        rng,
        "ignored rows",
        (7, 7),
        DType::I32,
        3,
        Some(t),
        [C; 2],
        0.0,
    );
    let t = vec![-1, 2, -1, 0];
    plan(
        rng,
        "ignored rows",
        (4, 5),
        DType::I64,
        -1,
        Some(t),
        [C; 2],
        0.0,
    );
    plan(
        rng,
        "all rows ignored",
        (4, 6),
        DType::I64,
        -100,
        Some(vec![-100; 4]),
        [C; 2],
        0.0,
    );
    // An odd number of rows whose last is ignored, and one ignored before
    // it: a kernel that takes rows in pairs (or vectors) and finishes the
    // odd one on a scalar path without the ignore test counts or reads it
    // (mutation round 11: every ignored row before was inside a block).
    plan(
        rng,
        "odd rows, the last ignored",
        (7, 9),
        DType::I32,
        -100,
        Some(vec![3, 8, -100, 0, 5, 1, -100]),
        [C; 2],
        0.0,
    );
    // No rows: the mean over none is NaN, as PyTorch's (round 7: a kernel
    // skipped when an operand is empty left the loss unwritten).
    plan(rng, "no rows", (0, 5), DType::I64, -100, None, [C; 2], 0.0);
    plan(rng, "random", (12, 9), DType::I64, -100, None, [T, C], 0.0);
    plan(rng, "random", (10, 6), DType::I32, -100, None, [S, S], 0.0);
    plan(
        rng,
        "logits near 100",
        (4, 16),
        DType::I64,
        -100,
        None,
        [C; 2],
        100.0,
    );
    // Near ±1000 the exponentials overflow or underflow even in f64 unless
    // the row maximum is subtracted (logits near 100 only catch an f32
    // kernel that does not).
    for (label, offset) in [("logits near 1000", 1000.0), ("logits near -1000", -1000.0)] {
        plan(rng, label, (3, 8), DType::I64, -100, None, [C; 2], offset);
    }
    let t = vec![1, 5, 0];
    plan(
        rng,
        "target out of range",
        (3, 5),
        DType::I64,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    let t = vec![1, -1, 0];
    plan(
        rng,
        "negative target out of range",
        (3, 5),
        DType::I32,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    // Targets at the extremes of their dtype (see `EXTREME_INDICES`), and
    // 2^32 - 100, which is ignore_index once narrowed to 32 bits.
    let extremes = super::embedding::EXTREME_INDICES
        .into_iter()
        .chain([(DType::I64, (1 << 32) - 100)]);
    for (idx_dtype, bad) in extremes {
        plan(
            rng,
            &format!("target {bad} out of range"),
            (3, 5),
            idx_dtype,
            -100,
            Some(vec![1, bad, 0]),
            [C; 2],
            0.0,
        );
    }
    // A row holding NaN and one holding +inf: their loss and gradients are
    // NaN, even where the gradient of the loss is 0 (a kernel that writes
    // zeros for a zero gradient hides the overflow from a loss scaler's
    // check for non-finite gradients).
    plan(
        rng,
        "non-finite logits",
        (4, 6),
        DType::I64,
        -100,
        Some(vec![1, 2, 3, 4]),
        [C; 2],
        0.0,
    );
    let last = plans.last_mut().expect("just pushed");
    (last.logits[6 + 3], last.logits[12 + 5]) = (f64::NAN, f64::INFINITY);
    last.grad_loss = Some(0.0);
    // Masked rows (`padded_rows`), each target inside its row's window:
    // the masked logits' -10,000 enters no result but the row maximum.
    let [n, c] = crate::cases::basic::padded_rows::SHAPE;
    plans.push(CrossEntropyPlan {
        label: format!("{} [{n}, {c}] i64", crate::cases::basic::padded_rows::LABEL),
        logits: crate::cases::basic::padded_rows::values(rng, dtype),
        n,
        c,
        targets: (0..n).map(|r| (256 * r + 17 * r % 128) as f64).collect(),
        idx_dtype: DType::I64,
        ignore_index: -100,
        layouts: [C; 2],
        extra: 0,
        grad_loss: None,
    });
    // Rows of 37 masked but for their last 3, the largest last (round 7:
    // a row maximum that skipped a vector loop's remainder passed every
    // width here, each a multiple of the vector), with targets inside the
    // tail and outside it (a loss near 10,000, known to an ULP of it).
    plans.push(CrossEntropyPlan {
        label: "rows of 37 masked (-10000) but for the last 3 [4, 37] i64".into(),
        logits: crate::cases::basic::tail_rows(rng, dtype, 4, 37),
        n: 4,
        c: 37,
        targets: vec![36.0, 34.0, 0.0, 20.0],
        idx_dtype: DType::I64,
        ignore_index: -100,
        layouts: [C; 2],
        extra: 5000,
        grad_loss: None,
    });
    // And of 61 (see softmax's rows of 61).
    plans.push(CrossEntropyPlan {
        label: "rows of 61 masked (-10000) but for the last 3 [4, 61] i64".into(),
        logits: crate::cases::basic::tail_rows(rng, dtype, 4, 61),
        n: 4,
        c: 61,
        targets: vec![60.0, 59.0, 0.0, 30.0],
        idx_dtype: DType::I64,
        ignore_index: -100,
        layouts: [C; 2],
        extra: 5000,
        grad_loss: None,
    });
    // One bad target after 1,100 good ones (and one ignored), past the
    // first work-group or block of a device-side range check (mutation
    // round 9, see the embedding cases of the same name).
    for (idx_dtype, bad) in [(DType::I32, -2i64), (DType::I64, 3)] {
        let (n, c) = (1101, 3);
        let mut targets: Vec<f64> = (0..n - 1).map(|i| (i % c) as f64).collect();
        targets[500] = -100.0;
        targets.push(bad as f64);
        plans.push(CrossEntropyPlan {
            label: format!("target {bad} out of range after 1100 rows [{n}, {c}] {idx_dtype}"),
            logits: rng.values(dtype, n * c, -4.0, 4.0),
            n,
            c,
            targets,
            idx_dtype,
            ignore_index: -100,
            layouts: [C; 2],
            extra: 0,
            grad_loss: None,
        });
    }
    // Rows led by -inf logits (`left_padded`), each target among the
    // finite ones: an online log-sum-exp that does not guard a running
    // maximum still at -inf is NaN (mutation round 11). Strided logits, so
    // that the derived layouts keep their smaller bases.
    let [n, c] = crate::cases::basic::left_padded::SHAPE;
    plans.push(CrossEntropyPlan {
        label: format!("{} [{n}, {c}] i64", crate::cases::basic::left_padded::LABEL),
        logits: crate::cases::basic::left_padded::values(rng, dtype),
        n,
        c,
        targets: vec![7.0, 1099.0, 1050.0],
        idx_dtype: DType::I64,
        ignore_index: -100,
        layouts: [S, C],
        extra: 0,
        grad_loss: None,
    });
    // Rows of one class holding NaN, +inf and -inf besides finite logits:
    // a row of one class has loss 0 and gradient 0 only where its logit is
    // finite (`inf - inf` is NaN), so the mean loss is NaN (mutation round
    // 10: kernels that wrote a loss of 0, or gradients of 0, for one class
    // without reading the logits passed, the only single-class case being
    // of finite logits).
    plans.push(CrossEntropyPlan {
        label: "rows of one class: NaN, +inf, -inf, 0, -5, 1000 [6, 1] i64".into(),
        logits: crate::cases::basic::rows_of_one(dtype),
        n: 6,
        c: 1,
        targets: vec![0.0; 6],
        idx_dtype: DType::I64,
        ignore_index: -100,
        layouts: [C; 2],
        extra: 0,
        grad_loss: None,
    });
    plans
}

/// A `cross_entropy` case of `[logits [N, C], targets [N], loss]`, judged
/// as a log-sum-exp over C per row and a mean over N rows (`extra` more
/// terms of accumulation for logits far from 0).
pub(crate) fn cross_entropy_call(
    dtype: DType,
    label: String,
    tensors: [TensorSpec; 3],
    ignore: i64,
    extra: usize,
) -> Case {
    let (n, c) = (tensors[0].shape[0], tensors[0].shape[1]);
    case(
        "cross_entropy",
        dtype,
        label,
        tensors.into(),
        Tolerance::accumulated(8.0, c + n + extra),
        move |exec, t| exec.cross_entropy(&t[0], &t[1], &t[2], ignore),
        move |d| {
            Ok(vec![reference::cross_entropy(
                &d[0],
                &indices(&d[1]),
                ignore,
            )?])
        },
    )
}

pub(super) fn cross_entropy_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("cross_entropy", dtype);
    cross_entropy_plans(&mut rng, dtype)
        .into_iter()
        .map(|p| {
            cross_entropy_call(
                dtype,
                p.label,
                [
                    input("logits", dtype, &[p.n, p.c], p.logits, p.layouts[0]),
                    input("targets", p.idx_dtype, &[p.n], p.targets, p.layouts[1]),
                    output("loss", DType::F32, &[], C),
                ],
                p.ignore_index,
                p.extra,
            )
        })
        .collect()
}

pub(super) fn cross_entropy_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("cross_entropy_backward", dtype);
    let plans = cross_entropy_plans(&mut rng, dtype);
    let mut cases = Vec::new();
    for (i, p) in plans.into_iter().enumerate() {
        // The usual 1, and another gradient of the loss now and then.
        let grad_loss = p.grad_loss.unwrap_or(if i % 3 == 2 { -0.375 } else { 1.0 });
        let ignore = p.ignore_index;
        let label = if grad_loss == 1.0 {
            p.label
        } else {
            format!("{} grad_loss {grad_loss}", p.label)
        };
        cases.push(case(
            "cross_entropy_backward",
            dtype,
            label,
            vec![
                input("logits", dtype, &[p.n, p.c], p.logits, p.layouts[0]),
                input("targets", p.idx_dtype, &[p.n], p.targets, p.layouts[1]),
                output("grad_logits", dtype, &[p.n, p.c], p.layouts[0]),
            ],
            // A softmax over C per row (the count of rows is exact).
            Tolerance::accumulated(8.0, p.c + p.extra),
            move |exec, t| exec.cross_entropy_backward(&t[0], &t[1], &t[2], grad_loss, ignore),
            move |d| {
                Ok(vec![reference::cross_entropy_backward(
                    &d[0],
                    &indices(&d[1]),
                    grad_loss,
                    ignore,
                )?])
            },
        ));
    }
    cases
}
