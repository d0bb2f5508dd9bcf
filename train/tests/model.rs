//! The model on one device: its gradients against finite differences of
//! its loss, and a short training run whose loss falls. Needs `cargo build
//! --workspace` first (for Ferrite's library).

mod common;

use polychip_train::config::{ModelConfig, Precision, TrainConfig};
use polychip_train::data::Corpus;
use polychip_train::model::{Stage, StageInput};
use polychip_train::params::StageRange;
use polychip_train::plan::TrainPlan;
use polychip_train::trainer::{self, Options};

fn loss_of(stage: &Stage, tokens: &[i32], targets: &[i32], b: usize, s: usize) -> f64 {
    let d = stage.device();
    let x = d.from_slice(tokens, &[b as i64, s as i64]).unwrap();
    let t = d.from_slice(targets, &[(b * s) as i64]).unwrap();
    let (_, _, loss) = stage.forward(StageInput::Tokens(x), Some(t)).unwrap();
    f64::from(loss.unwrap())
}

#[test]
fn gradients_match_finite_differences() {
    for vendor in ["ferrite", "cobalt"] {
        let cfg = ModelConfig::preset("mini").unwrap();
        let dev = common::device(vendor, 0);
        let stage = Stage::new(&cfg, StageRange::whole(&cfg), Precision::F32, &dev, 3).unwrap();
        let corpus = Corpus::bundled();
        let (b, s) = (2, cfg.seq_len);
        let (tokens, targets) = corpus.batch(polychip_train::data::Split::Train, 1, 0, 0, b, s);
        stage.zero_grads().unwrap();
        let x = dev.from_slice(&tokens, &[b as i64, s as i64]).unwrap();
        let t = dev.from_slice(&targets, &[(b * s) as i64]).unwrap();
        let (saved, _, _) = stage.forward(StageInput::Tokens(x), Some(t)).unwrap();
        stage.backward(saved, None, 1.0).unwrap();
        // The largest gradient element of a few parameters of every kind.
        for name in [
            "tok_embeddings.weight",
            "layers.0.attention.wq.weight",
            "layers.0.attention.wk.weight",
            "layers.1.attention.wv.weight",
            "layers.1.attention.wo.weight",
            "layers.0.attention_norm.weight",
            "layers.1.feed_forward.w1.weight",
            "layers.1.feed_forward.w2.weight",
            "layers.0.ffn_norm.weight",
            "norm.weight",
            "output.weight",
        ] {
            let p = stage.params().iter().find(|p| p.spec.name == name).unwrap();
            let g = p.grad.to_vec::<f32>().unwrap();
            let (at, &want) = g
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .unwrap();
            let mut w = p.value.to_vec::<f32>().unwrap();
            let orig = w[at];
            let eps = 1e-2_f32.max(orig.abs() * 1e-2);
            w[at] = orig + eps;
            p.value.write_bytes(&f32s(&w)).unwrap();
            let up = loss_of(&stage, &tokens, &targets, b, s);
            w[at] = orig - eps;
            p.value.write_bytes(&f32s(&w)).unwrap();
            let down = loss_of(&stage, &tokens, &targets, b, s);
            w[at] = orig;
            p.value.write_bytes(&f32s(&w)).unwrap();
            let fd = (up - down) / (2.0 * f64::from(eps));
            let err = (fd - f64::from(want)).abs();
            assert!(
                err <= 0.05 * f64::from(want).abs() + 2e-4,
                "{vendor} {name}[{at}]: backward {want}, finite difference {fd}"
            );
        }
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn options(steps: u64, plan: TrainPlan, global_batch: usize) -> Options {
    Options {
        model: ModelConfig::preset("mini").unwrap(),
        train: TrainConfig {
            steps,
            global_batch,
            warmup: 5,
            eval_every: 0,
            eval_sequences: 8,
            ..TrainConfig::default()
        },
        plan,
        corpus: Corpus::bundled(),
        checkpoint_dir: None,
        save_every: 0,
        resume: None,
        allow_changed_settings: false,
        init_from: None,
        export_hf: None,
        trace: None,
        stop_after: None,
        log_every: 0,
        record_first_step: false,
        rebalance_every: None,
        overlap_reduction: true,
        async_sends: true,
        schedule: Default::default(),
        run_ahead: 1,
    }
}

#[test]
fn the_loss_falls_on_one_device() {
    let opts = options(40, TrainPlan::single("ferrite:0", 2, 4, 2), 8);
    let s = trainer::run(&opts, common::runtime(), None).unwrap();
    let first = s.steps[0].loss;
    let last = s.steps.last().unwrap();
    assert!(
        (first - 256f64.ln()).abs() < 0.3,
        "starts near ln 256: {first}"
    );
    assert!(last.loss < first - 1.5, "{first} -> {}", last.loss);
    assert!(last.val_loss.unwrap() < first - 1.0, "{:?}", last.val_loss);
}

#[test]
fn logits_are_the_head_output_the_loss_is_taken_of() {
    // `Stage::logits` (what `polychip checkpoint logits` prints) must be the
    // logits training's forward pass takes the cross-entropy of.
    let cfg = ModelConfig::preset("mini").unwrap();
    let dev = common::device("ferrite", 0);
    let stage = Stage::new(&cfg, StageRange::whole(&cfg), Precision::F32, &dev, 5).unwrap();
    let (b, s) = (2, cfg.seq_len);
    let corpus = Corpus::bundled();
    let (tokens, targets) = corpus.batch(polychip_train::data::Split::Train, 1, 0, 0, b, s);
    let loss = loss_of(&stage, &tokens, &targets, b, s);
    let x = dev.from_slice(&tokens, &[b as i64, s as i64]).unwrap();
    let logits = stage.logits(x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(logits.len(), b * s * cfg.vocab);
    let mut ce = 0.0;
    for (row, &t) in logits.chunks_exact(cfg.vocab).zip(&targets) {
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        ce += lse - row[t as usize] as f64;
    }
    ce /= (b * s) as f64;
    assert!((ce - loss).abs() < 1e-5, "{ce} vs {loss}");
    // A stage holding part of the model has no logits.
    let part = Stage::new(&cfg, StageRange::new(0, 1, 2), Precision::F32, &dev, 5).unwrap();
    let x = dev.from_slice(&tokens, &[b as i64, s as i64]).unwrap();
    assert!(part.logits(x).is_err());
}

/// `--plan auto`'s profiles: every device timed at once (two Ferrite
/// devices and a Cobalt one here), one profile per kind and micro-batch
/// size, each half block's share of a block measured.
#[test]
fn every_device_is_profiled_at_once_one_profile_per_kind_and_size() {
    let cfg = ModelConfig::preset("mini").unwrap();
    let t = TrainConfig::default();
    let devices = [
        common::device("ferrite", 0),
        common::device("ferrite", 1),
        common::device("cobalt", 0),
    ];
    let ps = polychip_train::auto::profile_side_by_side(&cfg, &t, &devices, &[2, 1], None).unwrap();
    let got: Vec<(String, usize)> = ps
        .iter()
        .map(|p| {
            (
                p.device.split(':').next().unwrap().to_string(),
                p.micro_batch,
            )
        })
        .collect();
    assert_eq!(
        got,
        [("ferrite", 2), ("ferrite", 1), ("cobalt", 2), ("cobalt", 1)]
            .map(|(k, b)| (k.to_string(), b))
            .to_vec()
    );
    for p in &ps {
        let c = &p.costs;
        assert!(
            c.block_forward > 0.0 && c.block_backward > 0.0 && c.head_forward > 0.0,
            "{p:?}"
        );
        assert!(
            c.attention_forward > 0.0 && c.attention_forward < c.block_forward,
            "{p:?}"
        );
        assert!(
            c.attention_backward > 0.0 && c.attention_backward < c.block_backward,
            "{p:?}"
        );
    }
}
