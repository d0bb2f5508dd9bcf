//! Hugging Face LLaMA directories in and out (`polychip_train::hf`): the
//! name mapping, exact round trips (F32, and BF16 / F16 to f32), sharded
//! models, tied embeddings, and the refusal of every config field and
//! tensor the trainer cannot represent, each naming the file and the field
//! or tensor; exports and imports are all-or-nothing. The round trip
//! through a trained checkpoint needs `cargo build --workspace` first.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use polychip_host::DType;
use polychip_train::config::{ModelConfig, TrainConfig};
use polychip_train::data::Corpus;
use polychip_train::hf::{self, HfModel};
use polychip_train::params::{StageRange, stage_params};
use polychip_train::plan::TrainPlan;
use polychip_train::safetensors::{SafeTensors, StoredTensor};
use polychip_train::trainer::{self, Options};
use serde_json::{Value, json};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hf-tests")
        .join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small LLaMA config.json as transformers 5 writes it.
fn config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 5000.0, "rope_type": "default"},
        "tie_word_embeddings": false,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": null,
        "transformers_version": "5.24.0"
    })
}

/// The model `config()` describes, as the trainer names it.
fn model_of(cfg: &Value, seq_len: usize) -> ModelConfig {
    let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
    ModelConfig {
        name: "m".into(),
        vocab: n("vocab_size"),
        dim: n("hidden_size"),
        layers: n("num_hidden_layers"),
        heads: n("num_attention_heads"),
        kv_heads: n("num_key_value_heads"),
        ffn: n("intermediate_size"),
        seq_len,
        norm_eps: 1e-6,
        rope_theta: 5000.0,
    }
}

/// Distinct, exactly representable values for every tensor (so BF16 and
/// F16 files hold the same numbers).
fn values(name: &str, n: usize) -> Vec<f32> {
    let seed = polychip_train::params::fnv1a(name.as_bytes());
    (0..n)
        .map(|i| ((seed.wrapping_add(i as u64 * 7919) % 255) as f32 - 127.0) / 64.0)
        .collect()
}

fn encode(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::F16 => v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        other => panic!("{other}"),
    }
}

/// Every tensor of the model of `cfg` under its Hugging Face name.
fn hf_tensors(cfg: &Value, dtype: DType) -> BTreeMap<String, StoredTensor> {
    let model = model_of(cfg, 16);
    stage_params(&model, &StageRange::whole(&model))
        .into_iter()
        .map(|spec| {
            let hf = hf::hf_name(&spec.name).unwrap();
            let t = StoredTensor {
                dtype,
                shape: spec.shape.clone(),
                data: encode(dtype, &values(&spec.name, spec.numel())),
            };
            (hf, t)
        })
        .collect()
}

fn write_hf(dir: &Path, cfg: &Value, tensors: &BTreeMap<String, StoredTensor>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut st = SafeTensors::new();
    st.metadata.insert("format".into(), "pt".into());
    for (k, t) in tensors {
        st.insert(k.clone(), t.clone()).unwrap();
    }
    st.save(&dir.join("model.safetensors")).unwrap();
}

/// A Hugging Face directory of `cfg` with `edit` applied to its tensors.
fn hf_dir(
    name: &str,
    cfg: &Value,
    edit: impl FnOnce(&mut BTreeMap<String, StoredTensor>),
) -> PathBuf {
    let dir = scratch(name).join("model");
    let _ = cfg;
    let mut tensors = hf_tensors(&config(), DType::F32);
    edit(&mut tensors);
    write_hf(&dir, cfg, &tensors);
    dir
}

fn refused(dir: &Path) -> String {
    let e = HfModel::open(dir, None).unwrap_err().to_string();
    println!("{e}");
    e
}

fn all_weights(m: &HfModel) -> BTreeMap<String, Vec<f32>> {
    let model = m.model().clone();
    m.weights(&stage_params(&model, &StageRange::whole(&model)))
        .unwrap()
}

#[test]
fn names_map_both_ways() {
    let model = ModelConfig::preset("tiny").unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for spec in stage_params(&model, &StageRange::whole(&model)) {
        let hf = hf::hf_name(&spec.name).unwrap();
        assert_eq!(hf::meta_name(&hf).as_deref(), Some(spec.name.as_str()));
        assert!(seen.insert(hf));
    }
    assert_eq!(
        hf::hf_name("layers.3.feed_forward.w1.weight").unwrap(),
        "model.layers.3.mlp.gate_proj.weight"
    );
    assert_eq!(
        hf::hf_name("layers.0.attention_norm.weight").unwrap(),
        "model.layers.0.input_layernorm.weight"
    );
    assert_eq!(hf::hf_name("output.weight").unwrap(), "lm_head.weight");
    assert_eq!(hf::meta_name("model.layers.x.mlp.up_proj.weight"), None);
    assert_eq!(hf::meta_name("model.layers.0.mlp.fc.weight"), None);
    assert!(hf::is_ignored_buffer(
        "model.layers.0.self_attn.rotary_emb.inv_freq"
    ));
}

#[test]
fn a_config_maps_onto_the_trainers_model() {
    let dir = hf_dir("config", &config(), |_| {});
    let m = HfModel::open(&dir, None).unwrap();
    let want = ModelConfig {
        name: "model".into(),
        seq_len: 64,
        ..model_of(&config(), 64)
    };
    assert_eq!(m.model(), &want);
    assert_eq!(m.config.max_position_embeddings, 64);
    // --seq-len, and the default cap of 128.
    assert_eq!(HfModel::open(&dir, Some(8)).unwrap().model().seq_len, 8);
    let mut cfg = config();
    cfg["max_position_embeddings"] = json!(4096);
    cfg["rope_theta"] = json!(5000.0);
    cfg.as_object_mut().unwrap().remove("num_key_value_heads");
    cfg.as_object_mut().unwrap().remove("rms_norm_eps");
    let dir = hf_dir("defaults", &cfg, |t| {
        // Without num_key_value_heads the k/v projections are full width.
        for i in 0..2 {
            for p in ["k_proj", "v_proj"] {
                let t = t
                    .get_mut(&format!("model.layers.{i}.self_attn.{p}.weight"))
                    .unwrap();
                t.shape = vec![32, 32];
                t.data = encode(DType::F32, &vec![0.5; 32 * 32]);
            }
        }
    });
    let m = HfModel::open(&dir, None).unwrap();
    assert_eq!(m.model().seq_len, hf::DEFAULT_SEQ_LEN);
    assert_eq!(m.model().kv_heads, 4);
    assert_eq!(m.model().norm_eps, 1e-6, "LlamaConfig's default");
    // Older configs: rope_theta at the top, no rope_parameters.
    let mut cfg = config();
    cfg.as_object_mut().unwrap().remove("rope_parameters");
    cfg["rope_theta"] = json!(250000.0);
    let dir = hf_dir("old-rope", &cfg, |_| {});
    assert_eq!(
        HfModel::open(&dir, None).unwrap().model().rope_theta,
        250000.0
    );
    cfg.as_object_mut().unwrap().remove("rope_theta");
    let dir = hf_dir("no-rope", &cfg, |_| {});
    assert_eq!(
        HfModel::open(&dir, None).unwrap().model().rope_theta,
        10000.0
    );
    // Mistral is LLaMA where its sliding window never cuts in: none, or
    // one spanning every position (a shorter one is refused, see below).
    for window in [Value::Null, json!(64), json!(4096), json!(64.0)] {
        let mut cfg = config();
        cfg["model_type"] = json!("mistral");
        cfg["architectures"] = json!(["MistralForCausalLM"]);
        cfg["sliding_window"] = window.clone();
        let dir = hf_dir("mistral", &cfg, |_| {});
        let m = HfModel::open(&dir, None).unwrap_or_else(|e| panic!("{window}: {e}"));
        assert_eq!(m.model(), &want, "{window}");
    }
}

#[test]
fn every_field_the_trainer_cannot_represent_is_refused_by_name() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "model_type",
            Box::new(|c| c["model_type"] = json!("qwen2")),
            "`model_type` = \"qwen2\"",
        ),
        (
            "sliding_window",
            Box::new(|c| {
                c["model_type"] = json!("mistral");
                c["sliding_window"] = json!(32);
            }),
            "`sliding_window` = 32, shorter than `max_position_embeddings` = 64",
        ),
        (
            "sliding_window-str",
            Box::new(|c| {
                c["model_type"] = json!("mistral");
                c["sliding_window"] = json!("4096");
            }),
            "`sliding_window` = \"4096\", not a whole number of positions",
        ),
        (
            "sliding_window-negative",
            Box::new(|c| {
                c["model_type"] = json!("mistral");
                c["sliding_window"] = json!(-1);
            }),
            "`sliding_window` = -1, a negative number of positions",
        ),
        (
            "sliding_window-default-positions",
            Box::new(|c| {
                c["model_type"] = json!("mistral");
                c["sliding_window"] = json!(100);
                c.as_object_mut().unwrap().remove("max_position_embeddings");
            }),
            "`sliding_window` = 100, shorter than the 2048 positions `max_position_embeddings` \
             defaults to",
        ),
        (
            "no-model_type",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("model_type");
            }),
            "no `model_type`",
        ),
        (
            "hidden_act",
            Box::new(|c| c["hidden_act"] = json!("gelu")),
            "`hidden_act` = \"gelu\"",
        ),
        (
            "attention_bias",
            Box::new(|c| c["attention_bias"] = json!(true)),
            "`attention_bias` = true",
        ),
        (
            "mlp_bias",
            Box::new(|c| c["mlp_bias"] = json!(true)),
            "`mlp_bias` = true",
        ),
        (
            "rope_scaling",
            Box::new(|c| c["rope_scaling"] = json!({"type": "linear", "factor": 2.0})),
            "`rope_scaling`",
        ),
        (
            "rope_type",
            Box::new(|c| c["rope_parameters"]["rope_type"] = json!("llama3")),
            "`rope_parameters.rope_type`",
        ),
        (
            "rope_factor",
            Box::new(|c| c["rope_parameters"]["factor"] = json!(8.0)),
            "`rope_parameters.factor`",
        ),
        (
            "rope_theta",
            Box::new(|c| c["rope_theta"] = json!(10000.0)),
            "`rope_theta` = 10000 but `rope_parameters.rope_theta` = 5000",
        ),
        (
            "head_dim",
            Box::new(|c| c["head_dim"] = json!(16)),
            "`head_dim` = 16",
        ),
        (
            "vocab",
            Box::new(|c| c["vocab_size"] = json!(100)),
            "`vocab_size` = 100",
        ),
        (
            "no-hidden",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("hidden_size");
            }),
            "no `hidden_size`",
        ),
        (
            "hidden-str",
            Box::new(|c| c["hidden_size"] = json!("32")),
            "`hidden_size` = \"32\", not a positive integer",
        ),
        (
            "hidden-neg",
            Box::new(|c| c["hidden_size"] = json!(-32)),
            "`hidden_size` = -32",
        ),
        (
            "hidden-zero",
            Box::new(|c| c["num_hidden_layers"] = json!(0)),
            "`num_hidden_layers` = 0",
        ),
        (
            "hidden-huge",
            Box::new(|c| c["intermediate_size"] = json!(1u64 << 40)),
            "`intermediate_size` = 1099511627776, more than",
        ),
        (
            "heads",
            Box::new(|c| c["num_attention_heads"] = json!(5)),
            "not a multiple of `num_attention_heads` = 5",
        ),
        (
            "kv_heads",
            Box::new(|c| c["num_key_value_heads"] = json!(3)),
            "not a multiple of `num_key_value_heads` = 3",
        ),
        (
            "odd-head",
            Box::new(|c| {
                c["num_attention_heads"] = json!(32);
                c["num_key_value_heads"] = json!(32);
                c["head_dim"] = json!(1);
            }),
            "odd",
        ),
        (
            "eps",
            Box::new(|c| c["rms_norm_eps"] = json!(-1.0)),
            "`rms_norm_eps` = -1",
        ),
        (
            "tie",
            Box::new(|c| c["tie_word_embeddings"] = json!("yes")),
            "`tie_word_embeddings` = \"yes\"",
        ),
    ];
    for (tag, edit, want) in cases {
        let mut cfg = config();
        edit(&mut cfg);
        let dir = hf_dir(tag, &cfg, |_| {});
        let msg = refused(&dir);
        assert!(msg.contains("config.json"), "{tag}: {msg}");
        assert!(msg.contains(want), "{tag}: {msg}");
    }
}

#[test]
fn bad_config_files_are_refused() {
    let dir = scratch("no-config");
    let msg = refused(&dir);
    assert!(msg.contains("has no config.json"), "{msg}");
    std::fs::write(dir.join("config.json"), "{\"model_type\": ").unwrap();
    let msg = refused(&dir);
    assert!(
        msg.contains("config.json") && msg.contains("not valid JSON"),
        "{msg}"
    );
    std::fs::write(dir.join("config.json"), "[1]").unwrap();
    assert!(refused(&dir).contains("not a JSON object"));
    // A huge file is refused without reading it all.
    let f = std::fs::File::create(dir.join("config.json")).unwrap();
    f.set_len(hf::MAX_JSON_BYTES + 10).unwrap();
    assert!(refused(&dir).contains("larger than"));
    // No weights.
    std::fs::write(dir.join("config.json"), config().to_string()).unwrap();
    let msg = refused(&dir);
    assert!(msg.contains("neither model.safetensors nor"), "{msg}");
    std::fs::write(dir.join("pytorch_model.bin"), b"pickle").unwrap();
    assert!(refused(&dir).contains("only safetensors weights are read"));
    // Asking for more positions than the model has.
    let dir = hf_dir("seq", &config(), |_| {});
    let msg = HfModel::open(&dir, Some(65)).unwrap_err().to_string();
    assert!(
        msg.contains("config.json") && msg.contains("`max_position_embeddings` = 64"),
        "{msg}"
    );
}

#[test]
fn missing_extra_and_misshapen_tensors_are_refused_by_name() {
    let cfg = config();
    let dir = hf_dir("missing", &cfg, |t| {
        t.remove("model.layers.1.mlp.up_proj.weight");
    });
    let msg = refused(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");
    assert!(
        msg.contains("no tensor `model.layers.1.mlp.up_proj.weight`")
            && msg.contains("layers.1.feed_forward.w3.weight")
            && msg.contains("[64, 32]"),
        "{msg}"
    );
    let dir = hf_dir("no-head", &cfg, |t| {
        t.remove("lm_head.weight");
    });
    assert!(refused(&dir).contains("no tensor `lm_head.weight`"));

    let dir = hf_dir("shape", &cfg, |t| {
        let w = t.get_mut("model.layers.0.self_attn.k_proj.weight").unwrap();
        w.shape = vec![32, 16];
    });
    let msg = refused(&dir);
    assert!(
        msg.contains("model.safetensors")
            && msg.contains("`model.layers.0.self_attn.k_proj.weight` of shape [32, 16]")
            && msg.contains("needs [16, 32]"),
        "{msg}"
    );

    let dir = hf_dir("extra", &cfg, |t| {
        let w = t["model.norm.weight"].clone();
        t.insert("model.layers.2.input_layernorm.weight".into(), w.clone());
        t.insert("model.layers.0.self_attn.q_proj.bias".into(), w);
    });
    let msg = refused(&dir);
    assert!(
        msg.contains("model.safetensors")
            && msg.contains("tensor `model.layers.0.self_attn.q_proj.bias`")
            && msg.contains("does not have"),
        "{msg}"
    );

    let dir = hf_dir("dtype", &cfg, |t| {
        let w = t.get_mut("model.norm.weight").unwrap();
        w.dtype = DType::I32;
    });
    let msg = refused(&dir);
    assert!(
        msg.contains("`model.norm.weight` in I32") && msg.contains("F32, BF16 and F16"),
        "{msg}"
    );
    let dir = hf_dir("f64", &cfg, |t| {
        let w = t.get_mut("model.norm.weight").unwrap();
        w.dtype = DType::F64;
        w.data = vec![0; 8 * 32];
    });
    assert!(refused(&dir).contains("in F64"));

    // Non-parameter buffers of older transformers are skipped.
    let dir = hf_dir("buffers", &cfg, |t| {
        for i in 0..2 {
            t.insert(
                format!("model.layers.{i}.self_attn.rotary_emb.inv_freq"),
                StoredTensor {
                    dtype: DType::F32,
                    shape: vec![4],
                    data: vec![0; 16],
                },
            );
        }
    });
    let m = HfModel::open(&dir, None).unwrap();
    assert_eq!(all_weights(&m).len(), 2 + 2 * 9 + 1);
}

#[test]
fn absurd_sizes_are_refused_before_anything_is_allocated() {
    // A config describing a model of 2^31 x 2^30 embeddings: the files do
    // not hold it, and nothing of that size is ever allocated.
    let mut cfg = config();
    cfg["vocab_size"] = json!(1u64 << 30);
    cfg["hidden_size"] = json!(1u64 << 30);
    cfg["head_dim"] = json!((1u64 << 30) / 4);
    cfg["intermediate_size"] = json!(1u64 << 31);
    // The files hold the small model's tensors.
    let dir2 = scratch("absurd2").join("model");
    write_hf(&dir2, &cfg, &hf_tensors(&config(), DType::F32));
    // Refused by the config's own bounds, before any file is read.
    let msg = refused(&dir2);
    assert!(
        msg.contains("config.json") && msg.contains("vocab is 1073741824, more than"),
        "{msg}"
    );

    // A header claiming a huge tensor in a small file.
    let dir = hf_dir("huge-header", &config(), |_| {});
    let header = r#"{"model.norm.weight":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4398046511104]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0; 64]);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let msg = refused(&dir);
    assert!(
        msg.contains("model.safetensors") && msg.contains("beyond"),
        "{msg}"
    );
    // A header length beyond the bound.
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    assert!(refused(&dir).contains("-byte header"));
}

#[test]
fn bf16_and_f16_weights_import_exactly() {
    for dtype in [DType::BF16, DType::F16] {
        let dir = scratch(&format!("half-{dtype}")).join("model");
        write_hf(&dir, &config(), &hf_tensors(&config(), dtype));
        let w = all_weights(&HfModel::open(&dir, None).unwrap());
        for (name, v) in &w {
            assert_eq!(v, &values(name, v.len()), "{dtype} {name}");
        }
    }
}

#[test]
fn tied_embeddings_copy_the_embedding_into_the_head() {
    let mut cfg = config();
    cfg["tie_word_embeddings"] = json!(true);
    let dir = hf_dir("tied", &cfg, |t| {
        t.remove("lm_head.weight");
    });
    let w = all_weights(&HfModel::open(&dir, None).unwrap());
    assert_eq!(w["output.weight"], w["tok_embeddings.weight"]);
    // A head that is there anyway must equal the embedding.
    let dir = hf_dir("tied-same", &cfg, |t| {
        let e = t["model.embed_tokens.weight"].clone();
        t.insert("lm_head.weight".into(), e);
    });
    all_weights(&HfModel::open(&dir, None).unwrap());
    let dir = hf_dir("tied-differs", &cfg, |_| {});
    let m = HfModel::open(&dir, None).unwrap();
    let model = m.model().clone();
    let msg = m
        .weights(&stage_params(&model, &StageRange::whole(&model)))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("`lm_head.weight`, which differs"),
        "{msg}"
    );
}

/// Writes `tensors` as shards of at most `per_shard` tensors with an index.
fn write_sharded(dir: &Path, tensors: &BTreeMap<String, StoredTensor>, per_shard: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config().to_string()).unwrap();
    let names: Vec<&String> = tensors.keys().collect();
    let shards: Vec<_> = names.chunks(per_shard).collect();
    let mut map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len());
        let mut st = SafeTensors::new();
        for n in *shard {
            st.insert((*n).clone(), tensors[*n].clone()).unwrap();
            map.insert((*n).clone(), json!(file));
        }
        st.save(&dir.join(&file)).unwrap();
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded_models_import_and_bad_indexes_are_refused() {
    let tensors = hf_tensors(&config(), DType::F32);
    let dir = scratch("sharded").join("model");
    write_sharded(&dir, &tensors, 4);
    let sharded = all_weights(&HfModel::open(&dir, None).unwrap());
    let single =
        all_weights(&HfModel::open(&hf_dir("unsharded", &config(), |_| {}), None).unwrap());
    assert_eq!(sharded, single);

    let index_path = dir.join("model.safetensors.index.json");
    let index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut i = index.clone();
        f(&mut i);
        std::fs::write(&index_path, i.to_string()).unwrap();
        refused(&dir)
    };
    let msg = edit(&|i| i["weight_map"]["model.norm.weight"] = json!("../evil.safetensors"));
    assert!(
        msg.contains("index.json") && msg.contains("`model.norm.weight`"),
        "{msg}"
    );
    let msg = edit(&|i| {
        i["weight_map"]["model.norm.weight"] = json!("model-00001-of-00006.safetensors");
    });
    assert!(
        msg.contains("`model.norm.weight`") && msg.contains("places in"),
        "{msg}"
    );
    let msg = edit(&|i| {
        i["weight_map"]["model.layers.7.mlp.up_proj.weight"] =
            json!("model-00001-of-00006.safetensors");
    });
    assert!(
        msg.contains("model-00001-of-00006.safetensors")
            && msg.contains("no tensor `model.layers.7.mlp.up_proj.weight`"),
        "{msg}"
    );
    // A tensor of a shard that the index does not list.
    let msg = edit(&|i| {
        i["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove("lm_head.weight");
    });
    assert!(
        msg.contains("model-00001-of-00006.safetensors")
            && msg.contains("`lm_head.weight`, which model.safetensors.index.json does not list"),
        "{msg}"
    );
    // A tensor the index does not list at all (its shard is then not read).
    let msg = edit(&|i| {
        i["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove("model.norm.weight");
    });
    assert!(
        msg.contains("index.json") && msg.contains("no tensor `model.norm.weight`"),
        "{msg}"
    );
    let msg = edit(&|i| i["weight_map"] = json!([]));
    assert!(msg.contains("weight_map"), "{msg}");
    let msg =
        edit(&|i| i["weight_map"]["model.norm.weight"] = json!("model-00009-of-00009.safetensors"));
    assert!(
        msg.contains("model.safetensors.index.json")
            && msg.contains("places tensor `model.norm.weight` in the shard model-00009-of-00009.safetensors, which is not in"),
        "{msg}"
    );
}

#[test]
fn a_corrupt_export_is_refused_by_its_checksum() {
    let model = model_of(&config(), 16);
    let weights: BTreeMap<String, Vec<f32>> = stage_params(&model, &StageRange::whole(&model))
        .into_iter()
        .map(|s| (s.name.clone(), values(&s.name, s.numel())))
        .collect();
    let out = scratch("corrupt").join("export");
    hf::export_weights(&model, &weights, &out).unwrap();
    let file = out.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 5;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let m = HfModel::open(&out, None).unwrap();
    let msg = m
        .weights(&stage_params(m.model(), &StageRange::whole(m.model())))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("checksum"),
        "{msg}"
    );
}

#[test]
fn export_then_import_is_bit_identical() {
    let model = ModelConfig {
        name: "m".into(),
        ..ModelConfig::preset("mini").unwrap()
    };
    let weights: BTreeMap<String, Vec<f32>> = stage_params(&model, &StageRange::whole(&model))
        .into_iter()
        .map(|s| {
            // Values that are not representable in bf16, and odd bit patterns.
            let v: Vec<f32> = s
                .initial_values(99)
                .into_iter()
                .enumerate()
                .map(|(i, x)| if i == 3 { -0.0 } else { x * 1.0001 })
                .collect();
            (s.name.clone(), v)
        })
        .collect();
    let out = scratch("round-trip").join("export");
    hf::export_weights(&model, &weights, &out).unwrap();
    let config: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"], json!(["LlamaForCausalLM"]));
    assert_eq!(config["max_position_embeddings"], json!(model.seq_len));
    assert_eq!(config["head_dim"], json!(8));
    assert_eq!(config["tie_word_embeddings"], json!(false));
    let st = SafeTensors::load(&out.join("model.safetensors")).unwrap();
    assert_eq!(st.metadata.get("format").map(String::as_str), Some("pt"));
    assert!(st.tensors.values().all(|t| t.dtype == DType::F32));
    let m = HfModel::open(&out, None).unwrap();
    assert_eq!(m.model().seq_len, model.seq_len);
    let back = all_weights(&m);
    assert_eq!(back.len(), weights.len());
    for (name, v) in &weights {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back[name]), bits(v), "{name}");
    }
}

#[test]
fn exports_are_all_or_nothing_and_never_overwrite() {
    let root = scratch("atomic");
    let leftovers = || {
        let mut v: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    // A failure while writing leaves nothing, not even the temporary directory.
    let out = root.join("out");
    let err = hf::write_new_dir(&out, |tmp| {
        std::fs::write(tmp.join("config.json"), b"{}").unwrap();
        Err(polychip_train::TrainError::Config("disk full".into()))
    })
    .unwrap_err();
    assert!(err.to_string().contains("disk full"));
    assert!(leftovers().is_empty(), "{:?}", leftovers());
    // Weights missing for a parameter: refused before anything is written.
    let model = ModelConfig::preset("mini").unwrap();
    let mut weights: BTreeMap<String, Vec<f32>> = stage_params(&model, &StageRange::whole(&model))
        .into_iter()
        .map(|s| (s.name.clone(), s.initial_values(1)))
        .collect();
    let head = weights.remove("output.weight").unwrap();
    let msg = hf::export_weights(&model, &weights, &out)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("output.weight"), "{msg}");
    assert!(leftovers().is_empty(), "{:?}", leftovers());
    weights.insert("output.weight".into(), head);
    // An existing, non-empty directory is refused and left as it was.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("mine.txt"), b"keep").unwrap();
    let msg = hf::export_weights(&model, &weights, &out)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("not empty") && msg.contains("out"), "{msg}");
    assert_eq!(std::fs::read(out.join("mine.txt")).unwrap(), b"keep");
    assert_eq!(leftovers(), ["out"]);
    // A file in the way.
    let file = root.join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(
        hf::export_weights(&model, &weights, &file)
            .unwrap_err()
            .to_string()
            .contains("not a directory")
    );
    // An empty directory is filled.
    let empty = root.join("empty");
    std::fs::create_dir(&empty).unwrap();
    hf::export_weights(&model, &weights, &empty).unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&empty)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert_eq!(files, ["config.json", "model.safetensors"]);
    assert_eq!(leftovers(), ["empty", "file", "out"]);
    // Importing is as careful.
    let msg = hf::import(&empty, None, &out).unwrap_err().to_string();
    assert!(msg.contains("not empty"), "{msg}");
    let bad = hf_dir("atomic-bad", &config(), |t| {
        t.remove("model.norm.weight");
    });
    let target = root.join("ckpt");
    assert!(hf::import(&bad, None, &target).is_err());
    assert_eq!(leftovers(), ["empty", "file", "out"]);
}

#[test]
fn a_trained_checkpoint_of_any_split_exports_and_imports_exactly() {
    let root = scratch("trained");
    let model = ModelConfig::preset("mini").unwrap();
    let opts = Options {
        model: model.clone(),
        train: TrainConfig {
            steps: 2,
            global_batch: 4,
            eval_every: 0,
            eval_sequences: 0,
            ..TrainConfig::default()
        },
        plan: TrainPlan::single("ferrite:0", model.layers, 2, 2),
        corpus: Corpus::bundled(),
        checkpoint_dir: Some(root.join("ckpt")),
        save_every: 0,
        resume: None,
        allow_changed_settings: false,
        init_from: None,
        export_hf: Some(root.join("hf")),
        trace: None,
        stop_after: None,
        log_every: 0,
        record_first_step: false,
        rebalance_every: None,
        overlap_reduction: true,
        async_sends: true,
        schedule: Default::default(),
        run_ahead: 1,
    };
    let summary = trainer::run(&opts, common::runtime(), None).unwrap();
    assert_eq!(summary.exported.as_deref(), Some(root.join("hf").as_path()));
    let (manifest, trained) = hf::checkpoint_weights(&root.join("ckpt")).unwrap();
    assert_eq!(manifest.step, 2);
    // The export made during the run, and one made afterwards, are the same file.
    hf::export(&root.join("ckpt"), &root.join("hf2")).unwrap();
    assert_eq!(
        std::fs::read(root.join("hf/model.safetensors")).unwrap(),
        std::fs::read(root.join("hf2/model.safetensors")).unwrap()
    );
    // Export -> import -> the imported checkpoint's weights are the trained ones.
    hf::import(&root.join("hf"), None, &root.join("imported")).unwrap();
    let (m2, imported) = hf::checkpoint_weights(&root.join("imported")).unwrap();
    assert_eq!(m2.step, 0);
    assert_eq!(m2.model.seq_len, model.seq_len);
    assert_eq!(imported, trained);
    let bits = |w: &BTreeMap<String, Vec<f32>>| -> Vec<u32> {
        w.values().flatten().map(|x| x.to_bits()).collect()
    };
    assert_eq!(bits(&imported), bits(&trained));
    // Its moments are zero and it resumes (the manifest's model is the same shape).
    let loaded = polychip_train::checkpoint::load(&root.join("imported"), &model).unwrap();
    let (_, st) = &loaded.tensors[0];
    let m = &st.tensors["layers.1.attention.wq.weight.exp_avg_sq"];
    assert!(m.data.iter().all(|&b| b == 0));
    // Starting from the export trains from exactly those weights.
    let again = Options {
        init_from: Some(root.join("hf")),
        checkpoint_dir: None,
        export_hf: Some(root.join("hf-steps0")),
        train: TrainConfig {
            steps: 0,
            ..opts.train.clone()
        },
        model: hf::HfModel::open(&root.join("hf"), None)
            .unwrap()
            .model()
            .clone(),
        ..opts.clone()
    };
    let s = trainer::run(&again, common::runtime(), None).unwrap();
    assert!(s.steps.is_empty() && s.checkpoint.is_none());
    assert_eq!(
        std::fs::read(root.join("hf/model.safetensors")).unwrap(),
        std::fs::read(root.join("hf-steps0/model.safetensors")).unwrap()
    );
    let staged: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        staged.is_empty(),
        "the staging checkpoint is removed: {staged:?}"
    );
}

#[test]
fn non_finite_weights_are_refused_naming_the_tensor_and_index() {
    let cfg = config();
    for (name, bad) in [("nan", f32::NAN), ("inf", f32::INFINITY)] {
        let dir = hf_dir(name, &cfg, |t| {
            let w = t.get_mut("model.layers.1.mlp.down_proj.weight").unwrap();
            w.data[4 * 7..4 * 8].copy_from_slice(&bad.to_le_bytes());
        });
        let out = dir.parent().unwrap().join("imported");
        let e = hf::import(&dir, None, &out).unwrap_err().to_string();
        assert!(
            e.contains("model.safetensors")
                && e.contains("`model.layers.1.mlp.down_proj.weight` element 7")
                && e.contains("not finite"),
            "{e}"
        );
        assert!(!out.exists(), "nothing is written for a refused import");
    }
}
