//! The op-by-op comparison against the f64 reference: hand-built records
//! pass, a perturbed one is named, an unknown operator is skipped, and (with
//! the bundled Ferrite plugin) a whole forward and backward of the `mini`
//! model is within tolerance.

use std::path::PathBuf;

use polychip_conformance::reference::{self, Dense, Indices};
use polychip_host::{DType, LoadOptions, Runtime};
use polychip_train::autocompare::{compare, compare_with};
use polychip_train::config::{ModelConfig, Precision, TrainConfig};
use polychip_train::model::ops::{HostTensor, OpRecord};
use polychip_train::model::{Stage, StageInput};
use polychip_train::params::StageRange;

fn f32s(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let values = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f64::from(((s >> 33) as f64 / (1u64 << 31) as f64 * 2.0 - 1.0) as f32)
        })
        .collect();
    HostTensor {
        dtype: DType::F32,
        shape: shape.to_vec(),
        values,
    }
}

fn f32_of(d: Dense) -> HostTensor {
    HostTensor {
        dtype: DType::F32,
        shape: d.shape,
        values: d.data.iter().map(|&v| f64::from(v as f32)).collect(),
    }
}

fn dense(t: &HostTensor) -> Dense {
    Dense::new(&t.shape, t.values.clone())
}

fn record(
    op: &'static str,
    label: &str,
    inputs: Vec<(&'static str, HostTensor)>,
    outputs: Vec<(&'static str, HostTensor)>,
    scalars: Vec<(&'static str, f64)>,
) -> OpRecord {
    OpRecord {
        op,
        label: label.into(),
        inputs,
        outputs,
        scalars,
    }
}

/// Five calls with outputs from the reference (rounded to f32).
fn good_records() -> Vec<OpRecord> {
    let mut records = Vec::new();

    let (x, w) = (f32s(&[3, 8], 1), f32s(&[5, 8], 2));
    let out = reference::linear(&dense(&x), &dense(&w), None).unwrap();
    records.push(record(
        "linear",
        "layers.0.attention.wq",
        vec![("input", x), ("weight", w)],
        vec![("out", f32_of(out))],
        vec![],
    ));

    let (a, b, prev) = (f32s(&[8, 3], 3), f32s(&[8, 5], 4), f32s(&[3, 5], 5));
    let out =
        reference::matmul(&dense(&a), &dense(&b), &dense(&prev), true, false, 1.0, 1.0).unwrap();
    records.push(record(
        "matmul",
        "layers.0.attention.wq (backward)",
        vec![("a", a), ("b", b), ("out_before", prev)],
        vec![("out", f32_of(out))],
        vec![("transpose_a", 1.0), ("transpose_b", 0.0), ("beta", 1.0)],
    ));

    let (x, w) = (f32s(&[4, 16], 6), f32s(&[16], 7));
    let (out, inv) = reference::rms_norm(&dense(&x), &dense(&w), 1e-5).unwrap();
    records.push(record(
        "rms_norm",
        "layers.1.ffn_norm",
        vec![("input", x), ("weight", w)],
        vec![("out", f32_of(out)), ("inv_rms", f32_of(inv))],
        vec![("eps", 1e-5)],
    ));

    let (gate, up) = (f32s(&[2, 6], 8), f32s(&[2, 6], 9));
    let out = reference::swiglu(&dense(&gate), &dense(&up)).unwrap();
    records.push(record(
        "swiglu",
        "layers.1.feed_forward",
        vec![("gate", gate), ("up", up)],
        vec![("out", f32_of(out))],
        vec![],
    ));

    let w = f32s(&[10, 4], 10);
    let idx = HostTensor {
        dtype: DType::I32,
        shape: vec![2, 3],
        values: vec![1.0, 7.0, 1.0, 0.0, 9.0, 3.0],
    };
    let out = reference::embedding(
        &dense(&w),
        &Indices::new(&idx.shape, idx.values.iter().map(|&v| v as i64).collect()),
    )
    .unwrap();
    records.push(record(
        "embedding",
        "tok_embeddings",
        vec![("weight", w), ("indices", idx)],
        vec![("out", f32_of(out))],
        vec![],
    ));

    let (logits, targets) = (
        f32s(&[4, 6], 11),
        HostTensor {
            dtype: DType::I32,
            shape: vec![4],
            values: vec![2.0, -100.0, 5.0, 0.0],
        },
    );
    let t = Indices::new(&[4], vec![2, -100, 5, 0]);
    let g = reference::cross_entropy_backward(&dense(&logits), &t, 0.5, -100).unwrap();
    records.push(record(
        "cross_entropy_backward",
        "output (backward)",
        vec![("logits", logits), ("targets", targets)],
        vec![("grad_logits", f32_of(g))],
        vec![("grad_loss", 0.5)],
    ));
    records
}

#[test]
fn reference_outputs_pass() {
    let records = good_records();
    let report = compare(&records);
    assert!(report.passed(), "{}", report.summary());
    assert_eq!(report.checked.len(), records.len());
    assert!(report.skipped.is_empty());
    for c in &report.checked {
        assert!(c.passed && c.worst_ratio <= 1.0, "{c:?}");
    }
    let s = report.summary();
    assert!(s.contains("6 ops checked"), "{s}");
    assert!(s.contains("all within tolerance"), "{s}");
}

#[test]
fn a_perturbed_output_is_the_first_divergence() {
    let mut records = good_records();
    // The third call's first output, element 12.
    let out = &mut records[2].outputs[0].1.values[12];
    let want = *out;
    *out += 0.01 * (want.abs() + 1.0);
    let report = compare(&records);
    assert!(!report.passed());
    let d = report.first_divergence.clone().expect("a divergence");
    assert_eq!(d.index, 2);
    assert_eq!(d.op, "rms_norm");
    assert_eq!(d.label, "layers.1.ffn_norm");
    assert_eq!(d.output, "out");
    assert_eq!(d.element, 12);
    assert_eq!(d.want, want);
    assert_eq!((d.failing_elements, d.elements), (1, 64));
    assert!(d.allowed > 0.0 && d.max_abs_error > d.allowed, "{d:?}");
    let check = &report.checked[2];
    assert!(!check.passed && check.worst_ratio > 1.0, "{check:?}");
    assert!(report.checked.iter().filter(|c| !c.passed).count() == 1);
    let s = report.summary();
    assert!(
        s.contains("first divergence: op #2 rms_norm at layers.1.ffn_norm: output out element 12"),
        "{s}"
    );
    // A loose enough factor lets it pass.
    assert!(compare_with(&records, 1e9).first_divergence.is_none());
}

#[test]
fn exact_ops_demand_equal_bits() {
    let mut records = good_records();
    records[4].outputs[0].1.values[3] += 2f64.powi(-40);
    let d = compare(&records).first_divergence.expect("a divergence");
    assert_eq!(
        (d.index, d.op, d.output, d.element),
        (4, "embedding", "out", 3)
    );
    assert_eq!(d.allowed, 0.0);
}

#[test]
fn unknown_ops_and_missing_arguments_are_skipped() {
    let mut records = good_records();
    records.push(record(
        "frobnicate",
        "somewhere",
        vec![("input", f32s(&[2], 1))],
        vec![("out", f32s(&[2], 2))],
        vec![],
    ));
    records.push(record(
        "swiglu",
        "layers.0.feed_forward",
        vec![("gate", f32s(&[2], 1))],
        vec![("out", f32s(&[2], 2))],
        vec![],
    ));
    let report = compare(&records);
    assert!(report.first_divergence.is_none());
    assert!(!report.passed());
    assert_eq!(report.checked.len(), 6);
    assert_eq!(report.skipped.len(), 2);
    assert_eq!(
        (report.skipped[0].0, report.skipped[0].1),
        (6, "frobnicate")
    );
    assert!(report.skipped[0].2.contains("no reference mapping"));
    assert_eq!((report.skipped[1].0, report.skipped[1].1), (7, "swiglu"));
    assert!(
        report.skipped[1].2.contains("input up"),
        "{:?}",
        report.skipped
    );
    assert!(report.summary().contains("skipped op #6 frobnicate"));
}

#[test]
fn bf16_outputs_are_judged_against_the_rounded_reference() {
    let (gate, up) = (f32s(&[4, 8], 3), f32s(&[4, 8], 4));
    let to_bf16 = |t: &HostTensor| HostTensor {
        dtype: DType::BF16,
        shape: t.shape.clone(),
        values: t
            .values
            .iter()
            .map(|&v| f64::from(half::bf16::from_f64(v)))
            .collect(),
    };
    let (gate, up) = (to_bf16(&gate), to_bf16(&up));
    let out = reference::swiglu(&dense(&gate), &dense(&up)).unwrap();
    let out = to_bf16(&HostTensor {
        dtype: DType::F32,
        shape: out.shape,
        values: out.data,
    });
    let records = vec![record(
        "swiglu",
        "layers.0.feed_forward",
        vec![("gate", gate), ("up", up)],
        vec![("out", out)],
        vec![],
    )];
    let report = compare(&records);
    assert!(report.passed(), "{}", report.summary());
}

fn ferrite_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let file = "libpolychip_vendor_ferrite.so";
    [dir.join(file), dir.join("deps").join(file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{file} is not in {}: run `cargo build --workspace` first",
                dir.display()
            )
        })
}

/// Records a whole training step of the `mini` model on Ferrite: forward,
/// backward, gradient norm, clipping and AdamW.
fn mini_step(precision: Precision) -> Vec<OpRecord> {
    let rt = Runtime::load(&[ferrite_path()], &LoadOptions::default());
    assert!(rt.failures().is_empty(), "{:?}", rt.failures());
    let device = rt.devices()[0].clone();
    let cfg = ModelConfig::preset("mini").unwrap();
    let range = StageRange::whole(&cfg);
    let mut stage = Stage::new(&cfg, range, precision, &device, 7).unwrap();
    stage.record(true);
    let (b, s) = (2usize, cfg.seq_len);
    let tokens: Vec<i32> = (0..b * s).map(|i| (i * 37 % 256) as i32).collect();
    let targets: Vec<i32> = (0..b * s).map(|i| ((i + 1) * 37 % 256) as i32).collect();
    let tokens = device.from_slice(&tokens, &[b as i64, s as i64]).unwrap();
    let targets = device.from_slice(&targets, &[(b * s) as i64]).unwrap();
    let (saved, _, loss) = stage
        .forward(StageInput::Tokens(tokens), Some(targets))
        .unwrap();
    assert!(loss.is_some());
    stage.backward(saved, None, 1.0).unwrap();
    stage.finish_grads().unwrap();
    assert!(stage.grad_sum_squares().unwrap() > 0.0);
    stage.scale_grads(0.5).unwrap();
    stage.adamw(&TrainConfig::default(), 1, 1e-3).unwrap();
    stage.take_records()
}

#[test]
fn a_mini_step_on_ferrite_is_within_tolerance() {
    for precision in [Precision::F32, Precision::Bf16] {
        let records = mini_step(precision);
        let report = compare(&records);
        assert!(report.passed(), "{precision:?}: {}", report.summary());
        assert_eq!(report.checked.len(), records.len());
        for op in [
            "embedding",
            "rms_norm",
            "linear",
            "rope",
            "attention",
            "swiglu",
            "add",
            "cross_entropy",
            "cross_entropy_backward",
            "matmul",
            "swiglu_backward",
            "attention_backward",
            "rope_backward",
            "rms_norm_backward",
            "embedding_backward",
            "sum_squares",
            "scale",
            "adamw",
        ] {
            assert!(
                report.checked.iter().any(|c| c.op == op),
                "{precision:?}: no {op} in the step"
            );
        }
        if precision == Precision::Bf16 {
            assert!(report.checked.iter().any(|c| c.op == "cast"));
        }
    }
}

#[test]
fn a_wrong_output_in_a_real_step_is_named_by_index_op_and_place() {
    let mut records = mini_step(Precision::F32);
    // What a plugin bug in one call would leave: one element off.
    let at = records
        .iter()
        .position(|r| r.op == "rms_norm_backward")
        .expect("the step has an rms_norm_backward");
    let label = records[at].label.clone();
    records[at].outputs[0].1.values[3] += 0.5;
    let d = compare(&records).first_divergence.expect("a divergence");
    assert_eq!((d.index, d.op, d.element), (at, "rms_norm_backward", 3));
    assert_eq!(d.label, label);
    assert_eq!(d.output, "grad_input");
}
