//! `--autocompare`: every operator call of a recorded training step replayed
//! on the f64 reference of the conformance suite and judged by the suite's
//! own tolerance rule (the DIPU/ditorch "autocompare" idea, built in).
//!
//! Each call is replayed on its *recorded* inputs, so an operator is judged
//! on its own and not on the error that earlier operators propagated into
//! it. The reference output is rounded to the recorded output's dtype as the
//! conformance runner rounds it, and an element passes when
//!
//! ```text
//! |got - want| <= rtol * (|want| + rms(want))     rtol = factor * (k u(out) + 2 n u(acc))
//! ```
//!
//! with `k` and the accumulation length `n` per operator as the conformance
//! cases set them (see [`tolerance`]). NaN must meet NaN and an infinity the
//! same infinity. A call that cannot be replayed (an operator without a
//! mapping, a missing argument, a reference that refuses the arguments) is
//! listed in [`Report::skipped`], never passed silently.

use std::fmt::Write as _;

use polychip_conformance::compare::compare_scaled as compare_values;
use polychip_conformance::reference::{self, Dense, Indices, RefError};
use polychip_conformance::tolerance::Tolerance;
use polychip_conformance::values::round_to;

use crate::model::ops::{HostTensor, IGNORE_INDEX, OpRecord};

/// The first output element outside its tolerance, in call order.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// Position of the call in the records.
    pub index: usize,
    /// The operator.
    pub op: &'static str,
    /// Where in the model it ran.
    pub label: String,
    /// The output's name.
    pub output: &'static str,
    /// Row-major index of the first failing element of that output.
    pub element: usize,
    /// The plugin's value there.
    pub got: f64,
    /// The reference's value there (rounded to the output dtype).
    pub want: f64,
    /// The allowed absolute error there.
    pub allowed: f64,
    /// The largest `|got - want|` over the output's finite elements.
    pub max_abs_error: f64,
    /// Elements of the output outside the tolerance.
    pub failing_elements: usize,
    /// Elements of the output.
    pub elements: usize,
}

/// The verdict on one replayed call.
#[derive(Debug, Clone, PartialEq)]
pub struct OpCheck {
    /// Position of the call in the records.
    pub index: usize,
    /// The operator.
    pub op: &'static str,
    /// Where in the model it ran.
    pub label: String,
    /// The largest `|got - want| / allowed` over its outputs' elements
    /// (infinite for an error where none is allowed or a NaN/infinity
    /// mismatch); at most 1 when it passed.
    pub worst_ratio: f64,
    /// Whether every element of every output is within tolerance.
    pub passed: bool,
}

/// The verdict on a step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// The calls replayed, in call order.
    pub checked: Vec<OpCheck>,
    /// The calls that could not be replayed: `(index, op, why)`, the
    /// reason starting with `at <label>: `.
    pub skipped: Vec<(usize, &'static str, String)>,
    /// The first output element outside its tolerance, if any.
    pub first_divergence: Option<Divergence>,
}

impl Report {
    /// Whether every call was replayed and every output is within tolerance.
    pub fn passed(&self) -> bool {
        self.first_divergence.is_none()
            && self.skipped.is_empty()
            && self.checked.iter().all(|c| c.passed)
    }

    /// The replayed call closest to (or furthest past) its tolerance.
    pub fn worst(&self) -> Option<&OpCheck> {
        self.checked
            .iter()
            .max_by(|a, b| a.worst_ratio.total_cmp(&b.worst_ratio))
    }

    /// Human-readable lines: how many calls were checked, the first
    /// divergence or the worst call, and every skipped call.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "autocompare: {} ops checked against the f64 reference; ",
            self.checked.len()
        );
        let failed = self.checked.iter().filter(|c| !c.passed).count();
        if failed == 0 {
            s.push_str("all within tolerance");
            if let Some(w) = self.worst() {
                let _ = write!(
                    s,
                    " (worst: {} at {}, {:.2} of its tolerance)",
                    w.op, w.label, w.worst_ratio
                );
            }
        } else {
            let _ = write!(s, "{failed} outside tolerance");
        }
        if let Some(d) = &self.first_divergence {
            let _ = write!(
                s,
                "\nfirst divergence: op #{} {} at {}: output {} element {}: got {}, reference {}, \
                 allowed error {:.1e} ({} of {} elements outside, max abs error {:.1e})",
                d.index,
                d.op,
                d.label,
                d.output,
                d.element,
                d.got,
                d.want,
                d.allowed,
                d.failing_elements,
                d.elements,
                d.max_abs_error
            );
        }
        if !self.skipped.is_empty() {
            let _ = write!(s, "\n{} op(s) could not be checked:", self.skipped.len());
            for (index, op, why) in &self.skipped {
                let _ = write!(s, "\n  skipped op #{index} {op}: {why}");
            }
        }
        s
    }
}

/// Replays `records` on the reference under the conformance tolerance.
pub fn compare(records: &[OpRecord]) -> Report {
    compare_with(records, 1.0)
}

/// [`compare`] with every tolerance multiplied by `factor` (1 for none).
pub fn compare_with(records: &[OpRecord], factor: f64) -> Report {
    let mut report = Report::default();
    for (index, record) in records.iter().enumerate() {
        let (tol, want) = match replay(record) {
            Ok(r) => r,
            Err(why) => {
                let why = format!("at {}: {why}", record.label);
                report.skipped.push((index, record.op, why));
                continue;
            }
        };
        match judge(index, record, tol, &want, factor) {
            Ok((check, divergence)) => {
                if report.first_divergence.is_none() {
                    report.first_divergence = divergence;
                }
                report.checked.push(check);
            }
            Err(why) => {
                let why = format!("at {}: {why}", record.label);
                report.skipped.push((index, record.op, why));
            }
        }
    }
    report
}

/// Compares each recorded output with the reference's.
fn judge(
    index: usize,
    record: &OpRecord,
    tol: Tolerance,
    want: &[(&'static str, Dense)],
    factor: f64,
) -> Result<(OpCheck, Option<Divergence>), String> {
    if want.len() != record.outputs.len() {
        return Err(format!(
            "recorded {} output(s), the reference returns {}",
            record.outputs.len(),
            want.len()
        ));
    }
    let mut worst = 0.0f64;
    let mut divergence = None;
    for ((name, got), (want_name, want)) in record.outputs.iter().zip(want) {
        if name != want_name {
            return Err(format!(
                "recorded output {name} where {want_name} was expected"
            ));
        }
        if got.shape != want.shape || got.values.len() != want.data.len() {
            return Err(format!(
                "output {name} has shape {:?}, the reference's {:?}",
                got.shape, want.shape
            ));
        }
        // The reference is exact; the plugin's answer is at best its value
        // rounded to the output dtype, as the conformance runner judges it.
        let want: Vec<f64> = want.data.iter().map(|&w| round_to(got.dtype, w)).collect();
        let rtol = tol.rtol(got.dtype, factor);
        let (stats, first) = compare_values(got.dtype, &got.values, &want, rtol);
        worst = worst.max(worst_ratio(&got.values, &want, rtol));
        if let (None, Some(f)) = (&divergence, first) {
            divergence = Some(Divergence {
                index,
                op: record.op,
                label: record.label.clone(),
                output: name,
                element: f.index,
                got: f.got,
                want: f.want,
                allowed: f.allowed,
                max_abs_error: stats.max_abs,
                failing_elements: stats.failures,
                elements: stats.elements,
            });
        }
    }
    let check = OpCheck {
        index,
        op: record.op,
        label: record.label.clone(),
        worst_ratio: worst,
        passed: divergence.is_none(),
    };
    Ok((check, divergence))
}

/// Root-mean-square of the finite values (as the conformance comparison
/// scales its tolerance).
fn rms(values: &[f64]) -> f64 {
    let finite = values.iter().copied().filter(|w| w.is_finite());
    let max = finite.clone().fold(0.0f64, |m, w| m.max(w.abs()));
    let count = finite.clone().count();
    if max == 0.0 || count == 0 {
        return 0.0;
    }
    max * (finite.map(|w| (w / max) * (w / max)).sum::<f64>() / count as f64).sqrt()
}

/// The largest `|got - want| / allowed` under the conformance rule.
fn worst_ratio(got: &[f64], want: &[f64], rtol: f64) -> f64 {
    let scale = rms(want);
    let mut worst = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        let ratio = if g.is_nan() || w.is_nan() || g.is_infinite() || w.is_infinite() {
            let same = (g.is_nan() && w.is_nan()) || g == w;
            if same { 0.0 } else { f64::INFINITY }
        } else {
            let err = (g - w).abs();
            let allowed = rtol * (w.abs() + scale);
            if err == 0.0 {
                0.0
            } else if allowed == 0.0 {
                f64::INFINITY
            } else {
                err / allowed
            }
        };
        worst = worst.max(ratio);
    }
    worst
}

/// The per-operator error model, as the conformance cases set it. `k`
/// counts the operator's own roundings in units of the output dtype; `n`
/// is its accumulation length, derived from the recorded shapes.
pub fn tolerance(record: &OpRecord) -> Result<Tolerance, String> {
    let r = Args(record);
    let last = |name| r.input(name).map(|t| t.shape.last().copied().unwrap_or(1));
    Ok(match record.op {
        // A dot product over K, the final rounding.
        "linear" => Tolerance::sum(4.0, last("input")?),
        // A dot product over K, alpha, beta * out, the final rounding.
        "matmul" => {
            let a = r.input("a")?;
            let ta = r.scalar("transpose_a")? != 0.0;
            let nd = a.shape.len();
            if nd < 2 {
                return Err(format!("a has shape {:?}", a.shape));
            }
            let k = if ta { a.shape[nd - 2] } else { a.shape[nd - 1] };
            Tolerance::sum(4.0, k + 2)
        }
        // A mean of squares over the row.
        "rms_norm" => Tolerance::sum(8.0, last("input")?),
        // grad_input sums over the row, grad_weight over the rows.
        "rms_norm_backward" => {
            let x = r.input("input")?;
            let h = x.shape.last().copied().unwrap_or(1);
            Tolerance::sum(8.0, h + x.values.len() / h.max(1))
        }
        // Two products and a sum per element.
        "rope" | "rope_backward" => Tolerance::ulps(4.0),
        // Dot products over head_dim, a softmax over seq_kv and the weighted
        // sum of seq_kv values.
        "attention" => {
            let [_, _, skv, d] = dims4(r.input("k")?)?;
            Tolerance::sum(16.0, skv + d)
        }
        // grad_q sums over seq_kv; grad_k and grad_v over the seq_q queries
        // of every query head of a group; each term a dot product over d.
        "attention_backward" => {
            let [_, hq, sq, _] = dims4(r.input("q")?)?;
            let [_, hkv, skv, d] = dims4(r.input("k")?)?;
            Tolerance::sum(32.0, skv + sq * (hq / hkv.max(1)) + d)
        }
        "swiglu" => Tolerance::ulps(8.0),
        "swiglu_backward" => Tolerance::ulps(16.0),
        // One rounding of the result, one of alpha * b.
        "add" => Tolerance::ulps(2.0),
        // Copies: the bits must match.
        "embedding" | "cast" => Tolerance::EXACT,
        // A row receives up to r updates, each possibly stored in the dtype.
        "embedding_backward" => {
            let r = max_repeats(&r.input("indices")?.values);
            Tolerance::sum((r + 1) as f64, r)
        }
        // A log-sum-exp over C per row, a mean over N rows, and the rounding
        // of logits far from 0 (|offset| / 2 more terms).
        "cross_entropy" => {
            let l = r.input("logits")?;
            let (n, c) = rows_cols(l)?;
            Tolerance::sum(8.0, c + n + extra_terms(&l.values))
        }
        // A softmax over C per row (the count of rows is exact).
        "cross_entropy_backward" => {
            let l = r.input("logits")?;
            let (_, c) = rows_cols(l)?;
            Tolerance::sum(8.0, c + extra_terms(&l.values))
        }
        "sum_squares" => Tolerance::sum(2.0, r.input("input")?.values.len()),
        // One product; alpha perhaps rounded to f32 first.
        "scale" => Tolerance::ulps(2.0),
        // A dozen operations per element, none accumulating.
        "adamw" => Tolerance::ulps(16.0),
        other => return Err(format!("no reference mapping for operator {other:?}")),
    })
}

/// Reference outputs by the names the record gives them.
type Outputs = Vec<(&'static str, Dense)>;

/// The recorded call's reference outputs, named as the record names them,
/// and its tolerance.
fn replay(record: &OpRecord) -> Result<(Tolerance, Outputs), String> {
    let tol = tolerance(record)?;
    let r = Args(record);
    let refused = |e: RefError| format!("the reference refuses the recorded arguments: {e}");
    let outputs = match record.op {
        "linear" => vec![(
            "out",
            reference::linear(&r.dense("input")?, &r.dense("weight")?, None).map_err(refused)?,
        )],
        "matmul" => {
            let (ta, tb) = (r.flag("transpose_a")?, r.flag("transpose_b")?);
            let beta = r.scalar("beta")?;
            let (a, b) = (r.dense("a")?, r.dense("b")?);
            let prev = if beta != 0.0 {
                r.dense("out_before")?
            } else {
                Dense::zeros(&r.output("out")?.shape)
            };
            vec![(
                "out",
                reference::matmul(&a, &b, &prev, ta, tb, 1.0, beta).map_err(refused)?,
            )]
        }
        "rms_norm" => {
            let (out, inv) =
                reference::rms_norm(&r.dense("input")?, &r.dense("weight")?, r.scalar("eps")?)
                    .map_err(refused)?;
            vec![("out", out), ("inv_rms", inv)]
        }
        "rms_norm_backward" => {
            let (gi, gw) = reference::rms_norm_backward(
                &r.dense("grad_out")?,
                &r.dense("input")?,
                &r.dense("weight")?,
                &r.dense("inv_rms")?,
            )
            .map_err(refused)?;
            vec![("grad_input", gi), ("grad_weight", gw)]
        }
        "rope" | "rope_backward" => {
            let (x, cos, sin) = (r.dense("input")?, r.dense("cos")?, r.dense("sin")?);
            let out = if record.op == "rope" {
                reference::rope(&x, &cos, &sin, false)
            } else {
                reference::rope_backward(&x, &cos, &sin, false)
            };
            vec![("out", out.map_err(refused)?)]
        }
        "attention" => {
            let (out, lse) = reference::attention(
                &r.dense("q")?,
                &r.dense("k")?,
                &r.dense("v")?,
                r.scalar("scale")?,
                true,
            )
            .map_err(refused)?;
            vec![("out", out), ("lse", lse)]
        }
        "attention_backward" => {
            let (gq, gk, gv) = reference::attention_backward(
                &r.dense("q")?,
                &r.dense("k")?,
                &r.dense("v")?,
                &r.dense("out")?,
                &r.dense("lse")?,
                &r.dense("grad_out")?,
                r.scalar("scale")?,
                true,
            )
            .map_err(refused)?;
            vec![("grad_q", gq), ("grad_k", gk), ("grad_v", gv)]
        }
        "swiglu" => vec![(
            "out",
            reference::swiglu(&r.dense("gate")?, &r.dense("up")?).map_err(refused)?,
        )],
        "swiglu_backward" => {
            let (gg, gu) = reference::swiglu_backward(
                &r.dense("gate")?,
                &r.dense("up")?,
                &r.dense("grad_out")?,
            )
            .map_err(refused)?;
            vec![("grad_gate", gg), ("grad_up", gu)]
        }
        "add" => vec![(
            "out",
            reference::add(&r.dense("a")?, &r.dense("b")?, 1.0).map_err(refused)?,
        )],
        "embedding" => vec![(
            "out",
            reference::embedding(&r.dense("weight")?, &r.indices("indices")?).map_err(refused)?,
        )],
        "embedding_backward" => vec![(
            "grad_weight",
            reference::embedding_backward(
                &r.dense("grad_out")?,
                &r.indices("indices")?,
                &r.dense("grad_weight_before")?,
            )
            .map_err(refused)?,
        )],
        "cross_entropy" => vec![(
            "loss",
            reference::cross_entropy(&r.dense("logits")?, &r.indices("targets")?, IGNORE_INDEX)
                .map_err(refused)?,
        )],
        "cross_entropy_backward" => vec![(
            "grad_logits",
            reference::cross_entropy_backward(
                &r.dense("logits")?,
                &r.indices("targets")?,
                r.scalar("grad_loss")?,
                IGNORE_INDEX,
            )
            .map_err(refused)?,
        )],
        "cast" => vec![("dst", reference::cast(&r.dense("src")?).map_err(refused)?)],
        "sum_squares" => vec![(
            "out",
            reference::sum_squares(&r.dense("input")?).map_err(refused)?,
        )],
        "scale" => vec![(
            "tensor",
            reference::scale(&r.dense("tensor_before")?, r.scalar("alpha")?).map_err(refused)?,
        )],
        "adamw" => {
            let step = r.scalar("step")?;
            if step.fract() != 0.0 {
                return Err(format!("step {step} is not an integer"));
            }
            let (p, m, v) = reference::adamw(
                &r.dense("param_before")?,
                &r.dense("grad")?,
                &r.dense("exp_avg_before")?,
                &r.dense("exp_avg_sq_before")?,
                r.scalar("lr")?,
                r.scalar("beta1")?,
                r.scalar("beta2")?,
                r.scalar("eps")?,
                r.scalar("weight_decay")?,
                step as i64,
            )
            .map_err(refused)?;
            vec![("param", p), ("exp_avg", m), ("exp_avg_sq", v)]
        }
        other => return Err(format!("no reference mapping for operator {other:?}")),
    };
    Ok((tol, outputs))
}

/// A record's arguments by name.
struct Args<'r>(&'r OpRecord);

impl Args<'_> {
    fn input(&self, name: &str) -> Result<&HostTensor, String> {
        find(&self.0.inputs, name).ok_or_else(|| format!("input {name} was not recorded"))
    }

    fn output(&self, name: &str) -> Result<&HostTensor, String> {
        find(&self.0.outputs, name).ok_or_else(|| format!("output {name} was not recorded"))
    }

    fn dense(&self, name: &str) -> Result<Dense, String> {
        let t = self.input(name)?;
        if t.values.len() != t.shape.iter().product::<usize>() {
            return Err(format!(
                "input {name} has {} values for shape {:?}",
                t.values.len(),
                t.shape
            ));
        }
        Ok(Dense {
            shape: t.shape.clone(),
            data: t.values.clone(),
        })
    }

    fn indices(&self, name: &str) -> Result<Indices, String> {
        let d = self.dense(name)?;
        if let Some(bad) = d.data.iter().find(|v| v.fract() != 0.0 || !v.is_finite()) {
            return Err(format!("input {name} holds {bad}, not an index"));
        }
        Ok(Indices {
            shape: d.shape,
            data: d.data.iter().map(|&v| v as i64).collect(),
        })
    }

    fn scalar(&self, name: &str) -> Result<f64, String> {
        self.0
            .scalars
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
            .ok_or_else(|| format!("scalar {name} was not recorded"))
    }

    fn flag(&self, name: &str) -> Result<bool, String> {
        Ok(self.scalar(name)? != 0.0)
    }
}

fn find<'r>(list: &'r [(&'static str, HostTensor)], name: &str) -> Option<&'r HostTensor> {
    list.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
}

/// The four extents of an attention tensor.
fn dims4(t: &HostTensor) -> Result<[usize; 4], String> {
    <[usize; 4]>::try_from(t.shape.as_slice()).map_err(|_| {
        format!(
            "attention tensor of shape {:?}, expected 4 dimensions",
            t.shape
        )
    })
}

/// `(N, C)` of logits.
fn rows_cols(t: &HostTensor) -> Result<(usize, usize), String> {
    match t.shape.as_slice() {
        &[n, c] => Ok((n, c)),
        s => Err(format!("logits of shape {s:?}, expected [N, C]")),
    }
}

/// The largest number of times one index occurs.
fn max_repeats(indices: &[f64]) -> usize {
    let mut sorted: Vec<i64> = indices.iter().map(|&v| v as i64).collect();
    sorted.sort_unstable();
    sorted
        .chunk_by(|a, b| a == b)
        .map(<[i64]>::len)
        .max()
        .unwrap_or(0)
}

/// Accumulation terms for logits far from 0: a log-sum-exp of logits of
/// magnitude `m` is rounded at that magnitude, about `m / 2` more terms
/// against a loss of a few units (the conformance cases' `|offset| / 2`).
fn extra_terms(logits: &[f64]) -> usize {
    let m = logits
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    (m / 2.0) as usize
}
