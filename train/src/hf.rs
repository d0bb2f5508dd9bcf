//! Hugging Face LLaMA checkpoints in and out.
//!
//! A Hugging Face directory holds `config.json` and the weights, either one
//! `model.safetensors` or shards `model-0000N-of-0000M.safetensors` listed
//! by `model.safetensors.index.json`. [`HfModel::open`] reads the config and
//! every file's header (not the data), maps the shape onto a
//! [`ModelConfig`] and checks every tensor's name, dtype and shape against
//! it, so that whatever the trainer cannot represent is refused, naming the
//! file and the field or tensor, before anything is read or allocated
//! (every size is checked against the tensors the files really hold).
//! [`HfModel::weights`] then reads the tensors a stage needs, by name.
//!
//! [`export`] writes any polychip checkpoint (of any stage split) as such a
//! directory, all-or-nothing, with a `config.json` that
//! `transformers.LlamaForCausalLM.from_pretrained` loads and one F32
//! `model.safetensors`; [`import`] writes a Hugging Face directory as a
//! step-0 polychip checkpoint that `--resume` accepts.
//!
//! Names map one to one ([`hf_name`], [`meta_name`]): the trainer uses
//! Meta's LLaMA names, Hugging Face its own, and the weights are the same
//! matrices. The trainer's rotary embedding rotates the two halves of each
//! head (`rope` with `interleaved = false`, GPT-NeoX's layout, which is
//! what Hugging Face's `rotate_half` does), so the query and key
//! projections need no permutation either way (Meta's original checkpoints
//! rotate interleaved pairs; Hugging Face's conversion script permutes
//! them, and the result is what this module reads).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use polychip_host::DType;
use serde_json::{Map, Value, json};

use crate::checkpoint::{self, Manifest};
use crate::config::{ModelConfig, TrainConfig};
use crate::error::{Result, TrainError};
use crate::params::{InitialWeights, ParamSpec, StageRange, stage_params};
use crate::safetensors::{Header, SafeTensors, StoredTensor, show_shape};

/// The config file of a Hugging Face model directory.
pub const CONFIG_FILE: &str = "config.json";
/// The weights of an unsharded model.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded model's weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The sequence length an import takes when none is given:
/// `min(max_position_embeddings, DEFAULT_SEQ_LEN)`.
pub const DEFAULT_SEQ_LEN: usize = 128;
/// The smallest vocabulary the trainer can use: its data are byte tokens
/// (the rule is [`crate::config::vocab_too_small`]).
pub const MIN_VOCAB: usize = crate::config::MIN_VOCAB;
/// The largest `config.json` or index file read: real ones are kilobytes.
pub const MAX_JSON_BYTES: u64 = 16 << 20;
/// The largest value accepted for a size field of `config.json`.
pub const MAX_DIM: u64 = 1 << 31;

/// Block parameters: the trainer's name after `layers.{i}.` and Hugging
/// Face's after `model.layers.{i}.`.
const BLOCK_NAMES: [(&str, &str); 9] = [
    ("attention_norm.weight", "input_layernorm.weight"),
    ("attention.wq.weight", "self_attn.q_proj.weight"),
    ("attention.wk.weight", "self_attn.k_proj.weight"),
    ("attention.wv.weight", "self_attn.v_proj.weight"),
    ("attention.wo.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("feed_forward.w1.weight", "mlp.gate_proj.weight"),
    ("feed_forward.w3.weight", "mlp.up_proj.weight"),
    ("feed_forward.w2.weight", "mlp.down_proj.weight"),
];

/// Parameters outside the blocks: (trainer, Hugging Face).
const TOP_NAMES: [(&str, &str); 3] = [
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The Hugging Face name of a trainer parameter (`layers.3.attention.wq.weight`
/// -> `model.layers.3.self_attn.q_proj.weight`).
pub fn hf_name(name: &str) -> Option<String> {
    if let Some((_, hf)) = TOP_NAMES.iter().find(|(m, _)| *m == name) {
        return Some((*hf).to_string());
    }
    let rest = name.strip_prefix("layers.")?;
    let (i, what) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let (_, hf) = BLOCK_NAMES.iter().find(|(m, _)| *m == what)?;
    Some(format!("model.layers.{i}.{hf}"))
}

/// The trainer's name of a Hugging Face tensor, the inverse of [`hf_name`].
pub fn meta_name(hf: &str) -> Option<String> {
    if let Some((m, _)) = TOP_NAMES.iter().find(|(_, h)| *h == hf) {
        return Some((*m).to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (i, what) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let (m, _) = BLOCK_NAMES.iter().find(|(_, h)| *h == what)?;
    Some(format!("layers.{i}.{m}"))
}

/// Tensors that are not parameters and are skipped on import: the rotary
/// embedding's `inv_freq` buffers that older transformers saved (the
/// trainer computes them from `rope_theta`).
pub fn is_ignored_buffer(hf: &str) -> bool {
    hf.ends_with(".rotary_emb.inv_freq")
}

/// What `config.json` says, mapped onto the trainer's model.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The model's shape; `seq_len` as asked or the default.
    pub model: ModelConfig,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`: the output head is the embedding.
    pub tie_word_embeddings: bool,
}

/// Reads at most [`MAX_JSON_BYTES`] of a JSON file and parses it as an object.
fn read_json_object(path: &Path) -> Result<Map<String, Value>> {
    let fail = |message: String| TrainError::Checkpoint {
        path: path.to_path_buf(),
        message,
    };
    // A regular file (a FIFO or device is refused unread), links followed.
    let (file, _) = crate::files::open_regular(path, crate::files::Links::Follow, u64::MAX)?;
    let mut text = Vec::new();
    file.take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| TrainError::io(path, e))?;
    if text.len() as u64 > MAX_JSON_BYTES {
        return Err(fail(format!(
            "is larger than {MAX_JSON_BYTES} bytes; a real one is a few kilobytes"
        )));
    }
    let text = std::str::from_utf8(&text)
        .map_err(|e| fail(format!("is not valid JSON: it is not UTF-8 text ({e})")))?;
    match polychip_files::parse_json_value(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(fail("is not a JSON object".into())),
        Err(e) => Err(fail(format!("is not valid JSON: {e}"))),
    }
}

/// Typed access to `config.json`'s fields, each error naming the field.
struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn fail(&self, message: String) -> TrainError {
        TrainError::Checkpoint {
            path: self.path.to_path_buf(),
            message,
        }
    }

    /// The field, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn size(&self, key: &str, default: Option<u64>) -> Result<usize> {
        let v = match (self.get(key), default) {
            (Some(v), _) => v,
            (None, Some(d)) => return Ok(d as usize),
            (None, None) => {
                return Err(self.fail(format!(
                    "has no `{key}`; polychip needs it for the model's shape"
                )));
            }
        };
        match v.as_u64() {
            Some(0) | None => Err(self.fail(format!("has `{key}` = {v}, not a positive integer"))),
            Some(n) if n > MAX_DIM => Err(self.fail(format!(
                "has `{key}` = {n}, more than the {MAX_DIM} polychip accepts"
            ))),
            Some(n) => Ok(n as usize),
        }
    }

    fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.fail(format!("has `{key}` = {v}, not a number"))),
        }
    }

    fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.fail(format!("has `{key}` = {v}, not true or false"))),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.fail(format!("has `{key}` = {v}, not a string"))),
        }
    }
}

/// The model name of an imported directory: its own name.
fn name_of(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(dir)
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("llama")
        .to_string()
}

/// Reads and checks `dir/config.json`. `seq_len` is the training sequence
/// length (default `min(max_position_embeddings, DEFAULT_SEQ_LEN)`; at
/// most `max_position_embeddings`). Refuses, naming the file and the
/// field, every setting the trainer cannot represent.
pub fn read_config(dir: &Path, seq_len: Option<usize>) -> Result<HfConfig> {
    let path = dir.join(CONFIG_FILE);
    if path.exists() {
        // A FIFO or device there is refused by name, unread.
        crate::files::open_regular(&path, crate::files::Links::Follow, u64::MAX)?;
    }
    if !path.is_file() {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            message: format!("has no {CONFIG_FILE}; it is not a Hugging Face model directory"),
        });
    }
    let map = read_json_object(&path)?;
    let f = Fields {
        path: &path,
        map: &map,
    };
    let mistral = match f.string("model_type")? {
        Some("llama") => false,
        // Mistral is LLaMA with a sliding attention window: the same
        // tensors and computation wherever the window does not cut in.
        Some("mistral") => true,
        Some(other) => {
            return Err(f.fail(format!(
                "has `model_type` = {}; polychip trains the LLaMA architecture \
                 (model_type \"llama\", or \"mistral\" without a sliding window) only",
                polychip_comm::text::quoted(other)
            )));
        }
        None => {
            return Err(f.fail(
                "has no `model_type`; polychip imports LLaMA models (model_type \"llama\", or \
                 \"mistral\" without a sliding window)"
                    .into(),
            ));
        }
    };
    if let Some(act) = f.string("hidden_act")?
        && act != "silu"
    {
        return Err(f.fail(format!(
            "has `hidden_act` = {}; the trainer's feed-forward block is SwiGLU, so only \
             \"silu\" can be represented",
            polychip_comm::text::quoted(act)
        )));
    }
    for key in ["attention_bias", "mlp_bias"] {
        if f.flag(key)? {
            return Err(f.fail(format!(
                "has `{key}` = true; the trainer's projections have no biases"
            )));
        }
    }
    if let Some(v) = f.get("rope_scaling") {
        return Err(f.fail(format!(
            "has `rope_scaling` = {v}; the trainer's rotary embedding is unscaled (the \
             default rope type) only"
        )));
    }
    let mut theta_nested = None;
    if let Some(params) = f.get("rope_parameters") {
        let Value::Object(params) = params else {
            return Err(f.fail(format!("has `rope_parameters` = {params}, not an object")));
        };
        for (k, v) in params {
            match k.as_str() {
                "rope_type" | "type" if v.as_str() == Some("default") => {}
                "rope_type" | "type" => {
                    return Err(f.fail(format!(
                        "has `rope_parameters.{k}` = {v}; the trainer's rotary embedding is \
                         the \"default\" type only"
                    )));
                }
                "rope_theta" => {
                    theta_nested = Some(v.as_f64().ok_or_else(|| {
                        f.fail(format!(
                            "has `rope_parameters.rope_theta` = {v}, not a number"
                        ))
                    })?);
                }
                _ => {
                    return Err(f.fail(format!(
                        "has `rope_parameters.{k}` = {v}, a rotary-embedding setting the trainer \
                         cannot represent (it knows rope_type \"default\" and rope_theta only)"
                    )));
                }
            }
        }
    }
    let theta_top = f.float("rope_theta")?;
    let rope_theta = match (theta_top, theta_nested) {
        (Some(a), Some(b)) if a != b => {
            return Err(f.fail(format!(
                "has `rope_theta` = {a} but `rope_parameters.rope_theta` = {b}"
            )));
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => 10000.0,
    };
    let dim = f.size("hidden_size", None)?;
    let layers = f.size("num_hidden_layers", None)?;
    let heads = f.size("num_attention_heads", None)?;
    let kv_heads = f.size("num_key_value_heads", Some(heads as u64))?;
    let ffn = f.size("intermediate_size", None)?;
    let vocab = f.size("vocab_size", None)?;
    let max_pos = f.size("max_position_embeddings", Some(2048))?;
    if let Some(why) = crate::config::vocab_too_small(vocab) {
        return Err(f.fail(format!("has `vocab_size` = {vocab}; {why}")));
    }
    if dim % heads != 0 {
        return Err(f.fail(format!(
            "has `hidden_size` = {dim}, not a multiple of `num_attention_heads` = {heads}"
        )));
    }
    if heads % kv_heads != 0 {
        return Err(f.fail(format!(
            "has `num_attention_heads` = {heads}, not a multiple of `num_key_value_heads` = \
             {kv_heads}"
        )));
    }
    if (dim / heads) % 2 != 0 {
        return Err(f.fail(format!(
            "has a head dimension hidden_size / num_attention_heads = {}, which is odd; the \
             rotary embedding needs an even one",
            dim / heads
        )));
    }
    if let Some(v) = f.get("head_dim")
        && v.as_u64() != Some((dim / heads) as u64)
    {
        return Err(f.fail(format!(
            "has `head_dim` = {v}, but the trainer's head dimension is hidden_size / \
             num_attention_heads = {}",
            dim / heads
        )));
    }
    let norm_eps = f.float("rms_norm_eps")?.unwrap_or(1e-6);
    if let Some(why) = crate::config::eps_problem(norm_eps, crate::config::MAX_NORM_EPS) {
        return Err(f.fail(format!("has `rms_norm_eps` = {why}")));
    }
    if !(rope_theta > 1.0 && rope_theta.is_finite()) {
        return Err(f.fail(format!(
            "has a rotary base `rope_theta` = {rope_theta}; it must exceed 1"
        )));
    }
    if mistral && let Some(v) = f.get("sliding_window") {
        // The window must never cut in at any length the model takes, so
        // that training here and the LLaMA config it exports compute what
        // the checkpoint's own does.
        // A whole number written as a float (128.0) is that number.
        let whole = v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|w| w.fract() == 0.0 && (0.0..1e18).contains(w))
                .map(|w| w as u64)
        });
        let positions = if f.get("max_position_embeddings").is_some() {
            format!("`max_position_embeddings` = {max_pos}")
        } else {
            format!("the {max_pos} positions `max_position_embeddings` defaults to")
        };
        match whole {
            Some(w) if w >= max_pos as u64 => {}
            Some(_) => {
                return Err(f.fail(format!(
                    "has `sliding_window` = {v}, shorter than {positions}; the trainer's \
                     attention is full causal attention (a Mistral model is taken when its \
                     window is null or spans every position)"
                )));
            }
            None if v.as_f64().is_some_and(|w| w < 0.0) => {
                return Err(f.fail(format!(
                    "has `sliding_window` = {v}, a negative number of positions"
                )));
            }
            None => {
                return Err(f.fail(format!(
                    "has `sliding_window` = {v}, not a whole number of positions (or null)"
                )));
            }
        }
    }
    let tie = f.flag("tie_word_embeddings")?;
    let seq_len = match seq_len {
        None => max_pos.min(DEFAULT_SEQ_LEN),
        Some(0) => return Err(TrainError::Config("--seq-len must be positive".into())),
        Some(s) if s > max_pos => {
            return Err(f.fail(format!(
                "has `max_position_embeddings` = {max_pos}, fewer than the {s} positions \
                 asked for (--seq-len or the number of tokens)"
            )));
        }
        Some(s) => s,
    };
    let model = ModelConfig {
        name: name_of(dir),
        vocab,
        dim,
        layers,
        heads,
        kv_heads,
        ffn,
        seq_len,
        norm_eps,
        rope_theta,
    };
    model
        .validate()
        .map_err(|m| f.fail(format!("describes a model the trainer cannot build: {m}")))?;
    Ok(HfConfig {
        model,
        max_position_embeddings: max_pos,
        tie_word_embeddings: tie,
    })
}

/// Where one tensor of a Hugging Face model is.
#[derive(Debug, Clone)]
struct Located {
    /// Index into [`HfModel::files`].
    file: usize,
    /// Its Hugging Face name.
    hf: String,
}

/// A Hugging Face LLaMA directory whose config and headers have been checked.
#[derive(Debug)]
pub struct HfModel {
    /// The directory.
    pub dir: PathBuf,
    /// Its config, mapped.
    pub config: HfConfig,
    files: Vec<Header>,
    /// By the trainer's parameter name.
    tensors: BTreeMap<String, Located>,
    /// Where `lm_head.weight` is when the embeddings are tied but the file
    /// has it anyway (it must then equal the embedding).
    tied_head: Option<Located>,
}

/// Is `name` a plain file name (no directories, not `.` or `..`)?
fn plain_file_name(name: &str) -> bool {
    Path::new(name).file_name() == Some(std::ffi::OsStr::new(name)) && name != ".."
}

impl HfModel {
    /// Reads `dir`'s config and its weight files' headers and checks them:
    /// every parameter of the model the config describes must be there once
    /// with its shape, in F32, BF16 or F16, and nothing else (but the
    /// [`is_ignored_buffer`] buffers). `seq_len` as for [`read_config`].
    pub fn open(dir: &Path, seq_len: Option<usize>) -> Result<HfModel> {
        let config = read_config(dir, seq_len)?;
        let fail = |path: &Path, message: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        let single = dir.join(WEIGHTS_FILE);
        let index_path = dir.join(INDEX_FILE);
        // As transformers does: the single file when there is one, else the index.
        // Either name there but not as a regular file (a FIFO, a
        // directory) is said as what it is.
        for p in [&single, &index_path] {
            if let Ok(m) = std::fs::metadata(p)
                && !m.is_file()
            {
                return Err(fail(
                    p,
                    format!(
                        "is {}, not a regular file; it was not read",
                        polychip_files::kind(m.file_type())
                    ),
                ));
            }
        }
        let (files, index): (Vec<String>, Option<BTreeMap<String, String>>) = if single.is_file() {
            (vec![WEIGHTS_FILE.to_string()], None)
        } else if index_path.is_file() {
            let map = read_json_object(&index_path)?;
            let Some(Value::Object(weight_map)) = map.get("weight_map") else {
                return Err(fail(
                    &index_path,
                    "has no `weight_map` object (tensor name -> shard file)".into(),
                ));
            };
            let mut index = BTreeMap::new();
            for (name, file) in weight_map {
                // Before any message quotes it whole.
                if name.chars().count() > crate::safetensors::MAX_NAME {
                    return Err(fail(
                        &index_path,
                        format!(
                            "maps a tensor of a {}-character name, {}, more than the {} a \
                             tensor name may have",
                            name.chars().count(),
                            polychip_comm::text::quoted(name),
                            crate::safetensors::MAX_NAME
                        ),
                    ));
                }
                let Some(file) = file.as_str().filter(|f| plain_file_name(f)) else {
                    return Err(fail(
                        &index_path,
                        format!(
                            "maps tensor `{name}` to {}, not the name of a file in {}",
                            polychip_comm::text::shown(&file.to_string()),
                            polychip_files::shown_path(dir)
                        ),
                    ));
                };
                index.insert(name.clone(), file.to_string());
            }
            let mut files: Vec<String> = index.values().cloned().collect();
            files.sort();
            files.dedup();
            // A shard the index names but the directory lacks: said so,
            // naming the index (the read's own error named the file alone).
            if let Some((name, file)) = index.iter().find(|(_, f)| !dir.join(f).exists()) {
                return Err(fail(
                    &index_path,
                    format!(
                        "places tensor `{name}` in the shard {file}, which is not in {}",
                        polychip_files::shown_path(dir)
                    ),
                ));
            }
            (files, Some(index))
        } else {
            let bin = dir.join("pytorch_model.bin").is_file();
            return Err(fail(
                dir,
                format!(
                    "has neither {WEIGHTS_FILE} nor {INDEX_FILE}{}",
                    if bin {
                        "; only safetensors weights are read (save the model with \
                         transformers' save_pretrained, which writes safetensors)"
                    } else {
                        ""
                    }
                ),
            ));
        };
        let headers = files
            .iter()
            .map(|f| Header::read(&dir.join(f)))
            .collect::<Result<Vec<_>>>()?;

        // Every tensor of every file, by Hugging Face name.
        let mut found: BTreeMap<String, Located> = BTreeMap::new();
        for (i, h) in headers.iter().enumerate() {
            for name in h.tensors.keys() {
                if let Some(index) = &index
                    && index.get(name) != Some(&files[i])
                {
                    return Err(fail(
                        &h.path,
                        format!(
                            "has tensor `{name}`, which {INDEX_FILE} {}",
                            match index.get(name) {
                                Some(other) => format!("places in {other}"),
                                None => "does not list".into(),
                            }
                        ),
                    ));
                }
                found.insert(
                    name.clone(),
                    Located {
                        file: i,
                        hf: name.clone(),
                    },
                );
            }
        }
        if let Some(index) = &index
            && let Some((name, file)) = index.iter().find(|(n, _)| !found.contains_key(*n))
        {
            return Err(fail(
                &dir.join(file),
                format!("has no tensor `{name}`, which {INDEX_FILE} places in it"),
            ));
        }
        // Where a missing tensor would have been.
        let where_missing = || match &index {
            Some(_) => index_path.clone(),
            None => single.clone(),
        };

        let model = &config.model;
        let specs = stage_params(model, &StageRange::whole(model));
        let mut tensors = BTreeMap::new();
        for spec in &specs {
            let hf = hf_name(&spec.name).expect("every parameter has a Hugging Face name");
            let tied = spec.name == "output.weight" && config.tie_word_embeddings;
            let source = if tied {
                "model.embed_tokens.weight"
            } else {
                hf.as_str()
            };
            let Some(loc) = found.get(source) else {
                return Err(fail(
                    &where_missing(),
                    format!(
                        "has no tensor `{source}` (the trainer's `{}`, {} from {CONFIG_FILE})",
                        spec.name,
                        show_shape(&spec.shape)
                    ),
                ));
            };
            check_entry(&headers[loc.file], source, spec)?;
            tensors.insert(spec.name.clone(), loc.clone());
        }
        let mut tied_head = None;
        for (name, loc) in &found {
            let path = &headers[loc.file].path;
            if is_ignored_buffer(name) {
                continue;
            }
            if name == "lm_head.weight" && config.tie_word_embeddings {
                let spec = specs
                    .iter()
                    .find(|s| s.name == "output.weight")
                    .expect("the head is a parameter");
                check_entry(&headers[loc.file], name, spec)?;
                tied_head = Some(loc.clone());
                continue;
            }
            let expected = meta_name(name).is_some_and(|m| tensors.contains_key(&m));
            if !expected {
                return Err(fail(
                    path,
                    format!(
                        "has tensor `{name}`, which the LLaMA model of {CONFIG_FILE} ({} layers) \
                         does not have; polychip imports exactly the model's parameters (and \
                         skips only rotary_emb.inv_freq buffers)",
                        model.layers
                    ),
                ));
            }
        }
        Ok(HfModel {
            dir: dir.to_path_buf(),
            config,
            files: headers,
            tensors,
            tied_head,
        })
    }

    /// The model's shape.
    pub fn model(&self) -> &ModelConfig {
        &self.config.model
    }

    /// Reads the initial values of `specs` (parameters of this model, by the
    /// trainer's names), converted to f32. Files that record a polychip
    /// checksum are verified first. Refuses a tied `lm_head.weight` that
    /// differs from the embedding.
    pub fn weights(&self, specs: &[ParamSpec]) -> Result<BTreeMap<String, Vec<f32>>> {
        let mut open: BTreeMap<usize, File> = BTreeMap::new();
        let mut read = |loc: &Located| -> Result<Vec<f32>> {
            let h = &self.files[loc.file];
            let file = match open.entry(loc.file) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let (mut f, _) =
                        crate::files::open_regular(&h.path, crate::files::Links::Follow, u64::MAX)?;
                    h.verify_checksum(&mut f)?;
                    e.insert(f)
                }
            };
            let bytes = h.read_tensor(file, &loc.hf)?;
            let dtype = h.tensors[&loc.hf].dtype.expect("checked when opened");
            let values = to_f32(dtype, &bytes);
            // Import, --init-from, logits.
            check_finite(&h.path, &loc.hf, values)
        };
        let mut out = BTreeMap::new();
        for spec in specs {
            let Some(loc) = self.tensors.get(&spec.name) else {
                return Err(TrainError::Checkpoint {
                    path: self.dir.clone(),
                    message: format!("has no parameter `{}`", spec.name),
                });
            };
            let values = read(loc)?;
            if spec.name == "output.weight"
                && let Some(head) = &self.tied_head
            {
                let own = read(head)?;
                if own
                    .iter()
                    .map(|v| v.to_bits())
                    .ne(values.iter().map(|v| v.to_bits()))
                {
                    return Err(TrainError::Checkpoint {
                        path: self.files[head.file].path.clone(),
                        message: format!(
                            "has `lm_head.weight`, which differs from `model.embed_tokens.weight` \
                             although {CONFIG_FILE} says tie_word_embeddings"
                        ),
                    });
                }
            }
            out.insert(spec.name.clone(), values);
        }
        Ok(out)
    }

    /// [`HfModel::weights`] of every parameter, as [`InitialWeights`].
    pub fn initial_weights(&self, specs: &[ParamSpec]) -> Result<InitialWeights> {
        Ok(InitialWeights::Given {
            values: self.weights(specs)?,
            source: polychip_files::shown_path(&self.dir),
        })
    }
}

/// Refuses a tensor of the wrong dtype or shape for `spec`.
fn check_entry(h: &Header, name: &str, spec: &ParamSpec) -> Result<()> {
    let e = &h.tensors[name];
    let fail = |message: String| TrainError::Checkpoint {
        path: h.path.clone(),
        message,
    };
    if !matches!(e.dtype, Some(DType::F32 | DType::BF16 | DType::F16)) {
        return Err(fail(format!(
            "has tensor `{name}` in {}; polychip imports F32, BF16 and F16 weights",
            e.dtype_name
        )));
    }
    if e.shape != spec.shape {
        return Err(fail(format!(
            "has tensor `{name}` of shape {}, but the model of {CONFIG_FILE} needs {} (the \
             trainer's `{}`)",
            show_shape(&e.shape),
            show_shape(&spec.shape),
            spec.name
        )));
    }
    Ok(())
}

/// Little-endian F32, BF16 or F16 bytes as f32 (exactly).
fn to_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => unreachable!("{other} weights are refused when opened"),
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The `config.json` of `model` for `LlamaForCausalLM`.
pub fn config_json(model: &ModelConfig) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.vocab,
        "hidden_size": model.dim,
        "intermediate_size": model.ffn,
        "num_hidden_layers": model.layers,
        "num_attention_heads": model.heads,
        "num_key_value_heads": model.kv_heads,
        "head_dim": model.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": model.seq_len,
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
        "tie_word_embeddings": false,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "initializer_range": 0.02,
        "use_cache": true,
        "torch_dtype": "float32",
        "bos_token_id": null,
        "eos_token_id": null,
        "pad_token_id": null,
    })
}

/// Writes a new directory `out` all-or-nothing: `fill` writes into a
/// temporary sibling (`.NAME.tmp-PID`), which is renamed to `out` only when
/// `fill` succeeded; on any failure the sibling is removed and `out` is
/// untouched. `out` must not exist or be an empty directory: nothing is
/// ever overwritten.
pub fn write_new_dir(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    check_new_dir(out)?;
    let name = out.file_name().ok_or_else(|| TrainError::Checkpoint {
        path: out.to_path_buf(),
        message: "has no directory name to write to".into(),
    })?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| TrainError::io(&parent, e))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = parent.join(tmp_name);
    // A failure here is said of `out`, the directory asked for (it named
    // only the temporary one, a path the user never gave).
    let beside = |e: std::io::Error| {
        let what = format!(
            "cannot be written: its temporary directory {} could not be made: {e}",
            polychip_files::shown_path(&tmp)
        );
        TrainError::io(out, std::io::Error::new(e.kind(), what))
    };
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(beside)?;
    }
    std::fs::create_dir(&tmp).map_err(beside)?;
    let done = fill(&tmp).and_then(|()| {
        if out.is_dir() {
            // Empty (checked above); remove_dir refuses if that changed.
            std::fs::remove_dir(out).map_err(|e| TrainError::io(out, e))?;
        }
        std::fs::rename(&tmp, out).map_err(|e| TrainError::io(out, e))
    });
    if let Err(e) = done {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Ok(d) = File::open(&parent) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Refuses an output directory that exists and is not empty (or is a file),
/// naming it as the path it is (`OUT: exists and is not empty; ...`): an
/// output is not a checkpoint (a Hugging Face directory is not), and it
/// was said as "checkpoint OUT" until 2026-12-06.
pub fn check_new_dir(out: &Path) -> Result<()> {
    let fail = |message: &str| {
        TrainError::io(
            out,
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, message),
        )
    };
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(fail(
                    "exists and is not empty; polychip never overwrites an output directory \
                     (remove it or choose another)",
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) if out.exists() => Err(fail("exists and is not a directory")),
        Err(e) => Err(TrainError::io(out, e)),
    }
}

fn write_file_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(|e| TrainError::io(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| TrainError::io(path, e))
}

/// Writes `weights` (every parameter of `model`, by the trainer's names) as
/// a Hugging Face directory `out`: `config.json` and an F32
/// `model.safetensors` (metadata `format: pt`, as transformers requires,
/// and polychip's checksum), all-or-nothing ([`write_new_dir`]).
pub fn export_weights(
    model: &ModelConfig,
    weights: &BTreeMap<String, Vec<f32>>,
    out: &Path,
) -> Result<()> {
    model.validate().map_err(TrainError::Config)?;
    let mut st = SafeTensors::new();
    st.metadata.insert("format".into(), "pt".into());
    for spec in stage_params(model, &StageRange::whole(model)) {
        let Some(values) = weights.get(&spec.name) else {
            return Err(TrainError::Config(format!(
                "exporting: no weights for `{}`",
                spec.name
            )));
        };
        let hf = hf_name(&spec.name).expect("every parameter has a Hugging Face name");
        st.insert(
            hf,
            StoredTensor {
                dtype: DType::F32,
                shape: spec.shape.clone(),
                data: f32_bytes(values),
            },
        )?;
    }
    let config = serde_json::to_string_pretty(&config_json(model)).expect("json") + "\n";
    write_new_dir(out, |tmp| {
        write_file_synced(&tmp.join(CONFIG_FILE), config.as_bytes())?;
        st.save(&tmp.join(WEIGHTS_FILE))
    })
}

/// `values`, tensor `name` of the file `path`, when every one is finite:
/// a model with NaN or infinite weights computes nothing usable, and is
/// refused naming the file, the tensor and the element.
fn check_finite(path: &Path, name: &str, values: Vec<f32>) -> Result<Vec<f32>> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(values),
        Some(i) => Err(TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: format!(
                "has a weight that is not finite: tensor `{name}` element {i} is {} (of {}); \
                 a model with NaN or infinite weights cannot be used",
                values[i],
                values.len()
            ),
        }),
    }
}

/// The weights of a polychip checkpoint (a step directory or a root with
/// `latest`, of any stage split), by the trainer's names, and its manifest.
pub fn checkpoint_weights(path: &Path) -> Result<(Manifest, BTreeMap<String, Vec<f32>>)> {
    let mut loaded = checkpoint::open(path)?;
    let model = loaded.manifest.model.clone();
    checkpoint::check_contents(&model, &loaded.tensors)?;
    let mut out = BTreeMap::new();
    for spec in stage_params(&model, &StageRange::whole(&model)) {
        let Some((file, st)) = loaded
            .tensors
            .iter_mut()
            .find(|(_, st)| st.tensors.contains_key(&spec.name))
        else {
            return Err(TrainError::Checkpoint {
                path: loaded.dir.clone(),
                message: format!("has no tensor `{}` in any stage file", spec.name),
            });
        };
        let bytes = st.take(file, &spec.name, DType::F32, &spec.shape)?;
        // Saves refuse diverged weights; a checkpoint written before they
        // did (or by hand) is refused here, for logits and export alike.
        let values = check_finite(file, &spec.name, to_f32(DType::F32, &bytes))?;
        out.insert(spec.name.clone(), values);
    }
    Ok((loaded.manifest, out))
}

/// Exports the polychip checkpoint `checkpoint` to the Hugging Face
/// directory `out` ([`export_weights`]); returns the model.
pub fn export(checkpoint: &Path, out: &Path) -> Result<ModelConfig> {
    let (manifest, weights) = checkpoint_weights(checkpoint)?;
    export_weights(&manifest.model, &weights, out)?;
    Ok(manifest.model)
}

/// Imports the Hugging Face directory `hf_dir` as a step-0 polychip
/// checkpoint root `out` (`out/latest` -> `step-00000000`, one stage file
/// with the weights and zero AdamW moments), all-or-nothing. Returns the
/// model.
pub fn import(hf_dir: &Path, seq_len: Option<usize>, out: &Path) -> Result<ModelConfig> {
    check_new_dir(out)?;
    let hf = HfModel::open(hf_dir, seq_len)?;
    let model = hf.model().clone();
    let specs = stage_params(&model, &StageRange::whole(&model));
    let weights = hf.weights(&specs)?;
    let mut st = SafeTensors::new();
    for spec in &specs {
        let data = f32_bytes(&weights[&spec.name]);
        let zeros = vec![0u8; data.len()];
        let t = |data| StoredTensor {
            dtype: DType::F32,
            shape: spec.shape.clone(),
            data,
        };
        st.insert(format!("{}.exp_avg", spec.name), t(zeros.clone()))?;
        st.insert(format!("{}.exp_avg_sq", spec.name), t(zeros))?;
        st.insert(spec.name.clone(), t(data))?;
    }
    let manifest = Manifest {
        format: checkpoint::FORMAT.into(),
        step: 0,
        model: model.clone(),
        train: TrainConfig::default(),
        plan: format!("imported from the Hugging Face model {}", hf_dir.display()),
        files: vec![checkpoint::stage_file(0, 1)],
        sums: Vec::new(),
    };
    write_new_dir(out, |tmp| {
        checkpoint::write_tensors(tmp, 0, &st, 0, 1)?;
        checkpoint::commit(tmp, &manifest).map(|_| ())
    })?;
    Ok(model)
}

/// A model and its weights from either kind of directory: a Hugging Face
/// one (it has `config.json`) or a polychip checkpoint. `seq_len` replaces
/// the model's (for a checkpoint it may not exceed the trained one; for a
/// Hugging Face model not `max_position_embeddings`).
pub fn any_weights(
    path: &Path,
    seq_len: Option<usize>,
) -> Result<(ModelConfig, BTreeMap<String, Vec<f32>>)> {
    if path.join(CONFIG_FILE).is_file() {
        let hf = HfModel::open(path, seq_len)?;
        let model = hf.model().clone();
        let w = hf.weights(&stage_params(&model, &StageRange::whole(&model)))?;
        return Ok((model, w));
    }
    let (manifest, w) = checkpoint_weights(path)?;
    let mut model = manifest.model;
    if let Some(s) = seq_len {
        if s == 0 || s > model.seq_len {
            return Err(TrainError::Checkpoint {
                path: path.to_path_buf(),
                message: format!(
                    "holds a model trained on sequences of {} tokens; {s} positions were asked for",
                    model.seq_len
                ),
            });
        }
        model.seq_len = s;
    }
    Ok((model, w))
}
