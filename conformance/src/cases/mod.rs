//! Seeded cases for every (operator, dtype), and the builders they share.
//!
//! Each operator family has a file with one generator per operator; a
//! generator returns the same cases for the same dtype every time (its random
//! values come from a seed derived from the operator's name and the dtype),
//! so a case is identified by (operator, dtype, index) and a child process
//! can rebuild exactly the case its parent asked for.

mod basic;
mod data_1_3;
mod data_1_4;
mod elementwise;
mod nn;
mod output_backward;
pub mod realistic;
mod round13;
mod round14;
mod round15;
mod round16;
mod training;
mod variants;

pub use realistic::Tier;
use training::max_repeats as training_max_repeats;

use std::sync::Arc;

use polychip_host::{DType, Exec, Op, Tensor};

use crate::case::{Case, Layout, Role, TensorSpec};
use crate::reference::{Dense, RefError};
use crate::tolerance::Tolerance;
use crate::values::round_to;

/// An operator the suite knows, the dtypes it is tested in, and its cases.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    /// The operator, as named in the op table.
    pub name: &'static str,
    /// The dtypes it is tested in.
    pub dtypes: &'static [DType],
    /// Its own cases for one dtype (before the derived ones).
    pub base: fn(DType) -> Vec<Case>,
}

impl OpInfo {
    /// Every case of the operator in `dtype` for `tier`: its own, those
    /// derived from them (layouts and in-place calls, see `variants.rs`),
    /// then mutation round 13's ([`round13`]), 14's ([`round14`]), 15's
    /// ([`round15`]) and 16's ([`round16`]), then the realistic sizes
    /// ([`realistic`]).
    pub fn cases(&self, dtype: DType, tier: Tier) -> Vec<Case> {
        let mut cases = (self.base)(dtype);
        let derived = variants::derive(&cases);
        cases.extend(derived);
        cases.extend(round13::cases(self.name, dtype));
        cases.extend(round14::cases(self.name, dtype));
        cases.extend(round15::cases(self.name, dtype));
        cases.extend(round16::cases(self.name, dtype));
        cases.extend(realistic::cases(self.name, dtype, tier));
        cases
    }

    /// How many cases [`OpInfo::cases`] returns, without building the
    /// realistic ones (whose values are millions of elements).
    pub fn count(&self, dtype: DType, tier: Tier) -> usize {
        let base = (self.base)(dtype);
        base.len()
            + variants::derive(&base).len()
            + round13::cases(self.name, dtype).len()
            + round14::cases(self.name, dtype).len()
            + round15::cases(self.name, dtype).len()
            + round16::cases(self.name, dtype).len()
            + realistic::count(self.name, tier)
    }

    /// The labels of [`OpInfo::cases`], in order, building at most one
    /// realistic case at a time.
    pub fn labels(&self, dtype: DType, tier: Tier) -> Vec<String> {
        let base = (self.base)(dtype);
        let derived = variants::derive(&base);
        let mut labels: Vec<String> = base.into_iter().chain(derived).map(|c| c.label).collect();
        for extra in [
            round13::cases,
            round14::cases,
            round15::cases,
            round16::cases,
        ] {
            labels.extend(extra(self.name, dtype).into_iter().map(|c| c.label));
        }
        labels.extend(realistic::labels(self.name, dtype, tier));
        labels
    }
}

/// Every operator of the op table that has cases, in op-table order, tested
/// in every dtype the operator spec says it accepts.
pub fn registry() -> Vec<OpInfo> {
    Op::ALL
        .into_iter()
        .filter_map(|op| {
            let cases = basic::cases(op)
                .or_else(|| elementwise::cases(op))
                .or_else(|| output_backward::cases(op))
                .or_else(|| data_1_3::cases(op))
                .or_else(|| data_1_4::cases(op))
                .or_else(|| nn::cases(op))
                .or_else(|| training::cases(op))?;
            Some(OpInfo {
                name: op.name(),
                dtypes: op.dtypes(),
                base: cases,
            })
        })
        .collect()
}

/// The cases of `op` in `dtype` (empty when the op is unknown or not tested
/// in that dtype).
pub fn cases(op: &str, dtype: DType) -> Vec<Case> {
    registry()
        .into_iter()
        .find(|o| o.name == op && o.dtypes.contains(&dtype))
        .map(|o| o.cases(dtype, Tier::Default))
        .unwrap_or_default()
}

/// A small deterministic generator (xorshift64*), seeded per (op, dtype).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence depends only on `op` and `dtype`.
    pub fn for_case(op: &str, dtype: DType) -> Rng {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in op.bytes().chain(dtype.name().bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        Rng(h | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `n` values uniform in `[lo, hi)`, rounded to `dtype`.
    pub fn values(&mut self, dtype: DType, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n)
            .map(|_| round_to(dtype, self.uniform(lo, hi)))
            .collect()
    }
}

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// An input tensor.
pub fn input(
    name: &'static str,
    dtype: DType,
    shape: &[usize],
    values: Vec<f64>,
    layout: Layout,
) -> TensorSpec {
    assert_eq!(
        values.len(),
        numel(shape),
        "{name}: values do not fill {shape:?}"
    );
    TensorSpec {
        name,
        role: Role::Input,
        dtype,
        shape: shape.to_vec(),
        values: values.into_iter().map(|v| round_to(dtype, v)).collect(),
        layout,
        alias_of: None,
        exact_bits: None,
    }
}

/// An output tensor (poisoned before the call).
pub fn output(name: &'static str, dtype: DType, shape: &[usize], layout: Layout) -> TensorSpec {
    TensorSpec {
        name,
        role: Role::Output,
        dtype,
        shape: shape.to_vec(),
        values: vec![0.0; numel(shape)],
        layout,
        alias_of: None,
        exact_bits: None,
    }
}

/// A tensor read and written in place.
pub fn inout(
    name: &'static str,
    dtype: DType,
    shape: &[usize],
    values: Vec<f64>,
    layout: Layout,
) -> TensorSpec {
    TensorSpec {
        role: Role::InOut,
        ..input(name, dtype, shape, values, layout)
    }
}

/// Builds a case from its parts.
pub fn case(
    op: &'static str,
    dtype: DType,
    label: impl Into<String>,
    tensors: Vec<TensorSpec>,
    tolerance: Tolerance,
    call: impl Fn(&Exec<'_>, &[Tensor]) -> polychip_host::Result<()> + Send + Sync + 'static,
    reference: impl Fn(&[Dense]) -> Result<Vec<Dense>, RefError> + Send + Sync + 'static,
) -> Case {
    Case {
        op,
        dtype,
        label: label.into(),
        tensors,
        call: Arc::new(call),
        reference: Arc::new(reference),
        tolerance,
        resize: None,
        warm_up: false,
        on_stream: None,
        concurrent: false,
        bare: false,
        finite_poison: false,
    }
}

/// A label like `[3, 5] transposed`.
pub fn shape_label(shape: &[usize], layout: Layout) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    if layout == Layout::Contiguous {
        format!("[{}]", dims.join(", "))
    } else {
        format!("[{}] {layout}", dims.join(", "))
    }
}

/// Every ordered pair of `values`, as two operands of `n * n` elements:
/// element `i` pairs `values[i / n]` (first) with `values[i % n]` (second).
pub fn every_pair(values: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = values.len();
    (
        (0..n * n).map(|i| values[i / n]).collect(),
        (0..n * n).map(|i| values[i % n]).collect(),
    )
}

/// Special floating values of `dtype`: NaN, ±inf, ±0, the largest finite
/// value, and the smallest subnormal.
pub fn specials(dtype: DType) -> Vec<f64> {
    let (max, tiny) = match dtype {
        DType::F64 => (f64::MAX, f64::from_bits(1)),
        DType::F32 => (f64::from(f32::MAX), f64::from(f32::from_bits(1))),
        DType::F16 => (65504.0, 2f64.powi(-24)),
        DType::BF16 => (
            f64::from(half::bf16::MAX),
            f64::from(half::bf16::from_bits(1)),
        ),
        _ => (0.0, 0.0),
    };
    vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        max,
        -max,
        tiny,
        -tiny,
        1.0,
        -1.0,
        0.5,
    ]
}

/// `(significand bits, smallest normal exponent, largest finite value)` of
/// a floating dtype.
fn format_of(dtype: DType) -> (i32, i32, f64) {
    match dtype {
        DType::F64 => (53, -1022, f64::MAX),
        DType::F32 => (24, -126, f64::from(f32::MAX)),
        DType::F16 => (11, -14, 65504.0),
        DType::BF16 => (8, -126, f64::from(half::bf16::MAX)),
        _ => (0, 0, 0.0),
    }
}

/// The subnormals of `dtype` from the smallest up (odd and even multiples
/// of the smallest, whose halves are ties), the smallest normal value and
/// its neighbours, with both signs.
pub fn subnormals(dtype: DType) -> Vec<f64> {
    let (p, emin, _) = format_of(dtype);
    let tiny = 2f64.powi(emin - p + 1);
    let normal = 2f64.powi(emin);
    let mut v: Vec<f64> = (1..=9).map(|k| k as f64 * tiny).collect();
    v.extend([normal - tiny, normal, normal + tiny, normal + 3.0 * tiny]);
    let negative: Vec<f64> = v.iter().map(|x| -x).collect();
    v.extend(negative);
    v
}

/// Values of `src` at and around the rounding ties of `dst` (a narrower
/// floating dtype): exact ties whose lower neighbour is even and odd, one
/// ULP of `src` above and below each, and (from f64) values above and below
/// a tie by less than an ULP of f32, which a conversion through f32 rounds
/// onto the tie (a double rounding); in the normal range, among the
/// subnormals of `dst`, and at its overflow threshold (the tie between the
/// largest value and infinity). Both signs. Values not representable in
/// `src` are left out.
pub fn rounding_ties(src: DType, dst: DType) -> Vec<f64> {
    let (p, emin, max) = format_of(dst);
    let ulp_at = |e: i32| 2f64.powi(e - p + 1);
    let mut ties = Vec::new();
    // Normal range: significands 1.000..0, 1.000..1, 1.5 and 1.11..1, at a
    // few exponents, plus the tie at the largest value.
    for e in [0, -3, 7, emin] {
        let u = ulp_at(e);
        let base = 2f64.powi(e);
        for m in [0.0, 1.0, 2.0, 3.0, 2f64.powi(p - 2), 2f64.powi(p - 1) - 1.0] {
            ties.push(base + m * u + u / 2.0);
        }
    }
    // Among the subnormals: halves of odd and even multiples of the
    // smallest, and the tie between 0 and the smallest.
    let tiny = ulp_at(emin);
    for k in [0.0, 1.0, 2.0, 5.0, 2f64.powi(p - 1) - 1.0] {
        ties.push((k + 0.5) * tiny);
    }
    // The largest value's upper tie rounds to infinity, its lower one to
    // the even neighbour below it.
    let top = ulp_at(max.log2().floor() as i32);
    ties.push(max + top / 2.0);
    ties.push(max - top / 2.0);
    let mut values = Vec::new();
    for t in ties {
        if !t.is_finite() {
            continue;
        }
        let step = crate::values::ulp(src, t);
        let mut around = vec![t, t + step, t - step];
        if src == DType::F64 {
            let below_f32 = crate::values::ulp(DType::F32, t) / 64.0;
            around.extend([t + below_f32, t - below_f32]);
        }
        for v in around {
            if v.is_finite() && round_to(src, v) == v {
                values.push(v);
                values.push(-v);
            }
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::case::{Role, StreamSync};

    /// Cases whose reference must fail (the plugin must refuse them).
    fn refused(label: &str) -> bool {
        label.contains("out of range")
            || label.contains("step 0")
            || label.contains("must be refused")
    }

    #[test]
    fn every_case_is_well_formed_and_its_reference_runs() {
        for info in registry() {
            for &dtype in info.dtypes {
                let cases = info.cases(dtype, Tier::Default);
                assert!(!cases.is_empty(), "{} {dtype}: no cases", info.name);
                let mut labels = HashSet::new();
                for c in &cases {
                    assert_eq!((c.op, c.dtype), (info.name, dtype), "{c:?}");
                    assert!(labels.insert(c.label.clone()), "{c:?}: duplicate label");
                    if c.resize.is_some() {
                        // Realistic sizes: checked at small sizes below.
                        continue;
                    }
                    for t in &c.tensors {
                        assert_eq!(t.values.len(), numel(&t.shape), "{c:?} {}", t.name);
                        assert!(numel(&t.shape) <= 20_000, "{c:?} {} is too large", t.name);
                    }
                    let dense: Vec<Dense> = c.tensors.iter().map(TensorSpec::dense).collect();
                    match (c.reference)(&dense) {
                        Ok(out) => {
                            assert!(!refused(&c.label), "{c:?}: the reference accepts it");
                            let written: Vec<&TensorSpec> =
                                c.tensors.iter().filter(|t| t.role != Role::Input).collect();
                            assert_eq!(out.len(), written.len(), "{c:?}");
                            for (o, t) in out.iter().zip(written) {
                                assert_eq!(o.shape, t.shape, "{c:?} {}", t.name);
                            }
                        }
                        Err(e) => assert!(refused(&c.label), "{c:?}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn every_op_has_strided_tensors_and_every_multi_dimensional_op_transposed_ones() {
        for info in registry() {
            let cases = info.cases(info.dtypes[0], Tier::Default);
            let tensors = || cases.iter().flat_map(|c| &c.tensors);
            assert!(
                tensors().any(|t| t.layout == Layout::Strided),
                "{}: no strided tensor",
                info.name
            );
            if tensors().any(|t| t.shape.len() >= 2) {
                assert!(
                    tensors().any(|t| t.layout == Layout::Transposed),
                    "{}: no transposed tensor",
                    info.name
                );
            }
        }
    }

    #[test]
    fn every_op_runs_broadcast_reversed_and_gapped_tensors_every_permitted_alias_a_warm_up_and_on_a_stream()
     {
        let mut ways = Vec::new();
        for info in registry() {
            for &dtype in info.dtypes {
                let on_stream: Vec<_> = info
                    .cases(dtype, Tier::Default)
                    .iter()
                    .filter_map(|c| c.on_stream)
                    .collect();
                assert_eq!(on_stream.len(), 1, "{} {dtype}: one stream case", info.name);
                ways.extend(on_stream);
            }
            let cases = info.cases(info.dtypes[0], Tier::Default);
            let layouts: Vec<Layout> = cases
                .iter()
                .flat_map(|c| c.tensors.iter().map(|t| t.layout))
                .collect();
            let has = |f: fn(&Layout) -> bool| layouts.iter().any(f);
            let inputs = cases.iter().any(|c| {
                c.tensors
                    .iter()
                    .any(|t| t.role == Role::Input && t.shape.iter().any(|&e| e > 1))
            });
            assert!(
                !inputs || has(|l| matches!(l, Layout::Broadcast(_))),
                "{}: no zero stride",
                info.name
            );
            assert!(
                has(|l| matches!(l, Layout::Reversed(_))),
                "{}: no negative stride",
                info.name
            );
            assert!(has(|l| *l == Layout::Strided), "{}: no gaps", info.name);
            assert!(
                cases.iter().any(|c| c.warm_up),
                "{}: never run after a warm-up call",
                info.name
            );
            let op = Op::from_name(info.name).unwrap();
            for field in op.info().fields.iter().filter(|f| !f.alias.is_empty()) {
                for alias in field.alias {
                    let in_place = cases.iter().any(|c| {
                        c.tensors.iter().any(|t| {
                            t.name == field.name
                                && t.alias_of.is_some_and(|i| c.tensors[i].name == *alias)
                        })
                    });
                    assert!(
                        in_place,
                        "{}: {} is never run in place as {alias}",
                        info.name, field.name
                    );
                }
            }
        }
        for way in StreamSync::ALL {
            let n = ways.iter().filter(|&&w| w == way).count();
            assert!(
                n * 5 >= ways.len(),
                "{way:?} awaits only {n} of {} stream cases",
                ways.len()
            );
        }
    }

    #[test]
    fn counts_and_labels_match_the_cases() {
        for info in registry() {
            for tier in [Tier::Default, Tier::Full] {
                let dtype = info.dtypes[0];
                let labels: Vec<String> = info
                    .cases(dtype, tier)
                    .into_iter()
                    .map(|c| c.label)
                    .collect();
                assert_eq!(info.count(dtype, tier), labels.len(), "{}", info.name);
                assert_eq!(info.labels(dtype, tier), labels, "{}", info.name);
            }
        }
    }

    #[test]
    fn the_registry_covers_every_operator_of_the_abi_once() {
        let names: Vec<&str> = registry().iter().map(|o| o.name).collect();
        let unique: HashSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "an operator is registered twice");
        assert_eq!(names.len(), polychip_host::ffi::OP_COUNT);
    }
}
