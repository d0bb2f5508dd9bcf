//! A model's shape from a Hugging Face `config.json` (`polychip plan
//! --model DIR_OR_CONFIG.json`): the layers, widths, heads, vocabulary and
//! context of any dense decoder transformers describes, mapped onto
//! [`ModelSpec`]. The planner models a SwiGLU feed-forward block (three
//! matrices of `h x f`); a model whose MLP has two matrices (GPT-2, OPT,
//! GPT-NeoX, Falcon, BLOOM, ...) of inner width `i` is the SwiGLU of width
//! `2 i / 3`, which has its parameters and FLOPs. A mixture of experts
//! whose every layer is one (Mixtral, Qwen2/3-MoE, OLMoE, PhiMoE, Granite
//! MoE, GPT-OSS) is read as its experts, top-k, expert width and shared
//! expert, and one with dense layers (GLM-4.5's, ERNIE 4.5's and DeepSeek's
//! first ones; Llama 4 Maverick's every other layer) as those layers beside
//! them (`expert_layer_pattern`); multi-head latent attention
//! (DeepSeek-V2 and V3, Kimi K2) as its latents and head widths; attention
//! over a window as its window. One whose expert layers follow no pattern
//! of dense first layers and then every k-th layer, or that runs layers of
//! linear attention, state-space or recurrent mixers (beside attention or
//! instead of it) or zero-computation experts, is refused naming the field
//! that says so.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{SpecError, read_file};
use crate::model::ModelSpec;

/// The sequence length taken when neither the caller nor the config gives
/// a shorter context: the presets' 4096.
pub const DEFAULT_SEQ_LEN: u64 = 4096;

/// `model_type`s whose feed-forward block is gated (three matrices: SwiGLU
/// or GeGLU). A type in neither list is taken as gated when its
/// `hidden_act` is SiLU (every SiLU transformer in transformers gates its
/// MLP), as plain otherwise.
const GATED: &[&str] = &[
    "llama",
    "mistral",
    "qwen",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo",
    "olmo2",
    "internlm",
    "internlm2",
    "cohere",
    "cohere2",
    "granite",
    "stablelm",
    "baichuan",
    "exaone",
    "exaone4",
    "chatglm",
    "glm",
    "glm4",
    "smollm3",
    "helium",
    "deepseek",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "flex_olmo",
    "phimoe",
    "granitemoe",
    "granitemoeshared",
    "gpt_oss",
    "jetmoe",
    "glm4_moe",
    "dots1",
    "ernie4_5",
    "ernie4_5_moe",
    "llama4",
    "llama4_text",
];

/// `model_type`s whose MLP is two matrices (up and down).
const PLAIN: &[&str] = &[
    "gpt2",
    "gpt_bigcode",
    "gpt_neo",
    "gpt_neox",
    "gptj",
    "codegen",
    "opt",
    "bloom",
    "falcon",
    "phi",
    "starcoder2",
    "nemotron",
    "mpt",
    "persimmon",
];

/// A field that makes the model a mixture of experts, with its count:
/// one whose name holds "experts" (`num_local_experts`, `num_experts`,
/// `n_routed_experts`, `num_experts_per_tok`, ...) and whose value is a
/// count above 1, in the config or one of its sections (DBRX's
/// `ffn_config.moe_num_experts`): where the config names no routed
/// experts under a name the reader knows ([`EXPERTS`]), such a field is a
/// mixture it cannot read, refused rather than planned as dense.
fn unread_experts(map: &Map<String, Value>) -> Option<(String, u64)> {
    let here = |map: &Map<String, Value>, at: &str| {
        map.iter().find_map(|(k, v)| {
            let n = v.as_u64().filter(|&n| n > 1)?;
            k.contains("experts").then(|| (format!("{at}{k}"), n))
        })
    };
    here(map, "").or_else(|| {
        map.iter().find_map(|(k, v)| match v {
            Value::Object(inner) => here(inner, &format!("{k}.")),
            _ => None,
        })
    })
}

/// The routed experts' count, the experts a token runs, each expert's
/// width and the shared experts' (by width, or by count of the experts'
/// width), under transformers' names.
const EXPERTS: &[&str] = &[
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
];
const TOP_K: &[&str] = &[
    "num_experts_per_tok",
    "experts_per_token",
    "moe_topk",
    "moe_k",
    "moe_top_k",
];
const EXPERT_FFN: &[&str] = &["moe_intermediate_size", "expert_ffn_hidden_size"];
const SHARED_FFN: &[&str] = &[
    "shared_expert_intermediate_size",
    "shared_experts_intermediate_size",
    "shared_intermediate_size",
    "share_expert_dim",
];
const SHARED_COUNT: &[&str] = &[
    "n_shared_experts",
    "num_shared_experts",
    "moe_num_shared_experts",
];

/// Fields that give a mixture's expert layers by a step `k`, each with
/// which layer of a step runs the experts: Qwen-MoE's `decoder_sparse_step`,
/// ERNIE 4.5's `moe_layer_interval` and Llama 4's
/// `interleave_moe_layer_step` the last (`(i + 1) % k == 0`, true),
/// DeepSeek's `moe_layer_freq` the first (`i % k == 0`, false).
const STEPS: &[(&str, bool)] = &[
    ("decoder_sparse_step", true),
    ("moe_layer_interval", true),
    ("interleave_moe_layer_step", true),
    ("moe_layer_freq", false),
];

/// Fields that give how many of a mixture's first layers are dense:
/// DeepSeek's, GLM-4.5's and Kimi K2's `first_k_dense_replace`, ERNIE
/// 4.5's `moe_layer_start_index` (a list per modality: its least), LFM2-MoE's
/// and AFMoE's `num_dense_layers`.
const DENSE_FIRST: &[&str] = &[
    "first_k_dense_replace",
    "moe_layer_start_index",
    "num_dense_layers",
];

/// The `layer_types` of attention layers the planner prices (full, or
/// over a window or chunks, which [`hf_notes`] notes, or DeepSeek's sparse
/// attention over indexed keys, also noted); any other type is refused.
const ATTENTION_LAYERS: &[&str] = &[
    "full_attention",
    "attention",
    "sliding_attention",
    "chunked_attention",
    "window_attention",
    "reference_sliding_attention",
    "indexed_attention",
];

/// Which layers of a mixture of experts run the experts, as [`ModelSpec`]
/// describes them: its dense first layers, then every `step`-th layer
/// whose index is `offset` modulo the step (`(dense_layers, step,
/// offset)`; every layer dense: `(layers, 1, 0)`), each layer's kind taken
/// from every field that says it ([`DENSE_FIRST`], [`STEPS`], Jamba's
/// `expert_layer_period` and `expert_layer_offset`, ERNIE's
/// `moe_layer_end_index`, Qwen-MoE's `mlp_only_layers`, `mlp_layer_types`,
/// Llama 4's `moe_layers`); why not, naming the fields, where the expert
/// layers follow no such pattern (dense last layers, an irregular list).
fn expert_layer_pattern(fields: &Fields, layers: u64) -> Result<(u64, u64, u64), String> {
    // (A flag a layer only within the layers' limit, which the model's
    // validation refuses past.)
    if layers > crate::model::MODEL_LIMITS[0].1 {
        return Ok((0, 1, 0));
    }
    let n = layers as usize;
    let mut expert = vec![true; n];
    let mut said: Vec<&str> = Vec::new();
    // A count, or (ERNIE's per-modality lists) its least or greatest.
    let count = |key: &str, v: &Value, least: bool| -> Result<u64, String> {
        let items = match v {
            Value::Array(items) => items.iter().map(Value::as_u64).collect::<Option<Vec<_>>>(),
            v => v.as_u64().map(|n| vec![n]),
        };
        let n = items.and_then(|ns| match least {
            true => ns.into_iter().min(),
            false => ns.into_iter().max(),
        });
        n.ok_or_else(|| format!("config.json has `{key}` = {v}, not a layer count or index"))
    };
    // A list of layer indices, sorted, each once, each a layer.
    let indices = |key: &str, v: &Value| {
        let not_layers = || format!("config.json has `{key}` = {v}, not a list of layers");
        let Value::Array(items) = v else {
            return Err(not_layers());
        };
        let mut listed = items
            .iter()
            .map(Value::as_u64)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(not_layers)?;
        listed.sort_unstable();
        listed.dedup();
        match listed.last() {
            Some(&l) if l >= layers => Err(format!(
                "config.json's `{key}` names layer {l} of its {layers}"
            )),
            _ => Ok(listed),
        }
    };
    let mut keep = |key: &'static str, on: &dyn Fn(usize) -> bool| {
        for (i, e) in expert.iter_mut().enumerate() {
            *e &= on(i);
        }
        said.push(key);
    };
    for &key in DENSE_FIRST {
        if let Some(v) = fields.get(key) {
            let k = count(key, v, true)?;
            keep(key, &|i| i as u64 >= k);
        }
    }
    if let Some(v) = fields.get("moe_layer_end_index") {
        let end = count("moe_layer_end_index", v, false)?;
        keep("moe_layer_end_index", &|i| i as u64 <= end);
    }
    for &(key, last) in STEPS {
        if let Some(v) = fields.get(key) {
            let k = v
                .as_u64()
                .filter(|&k| k > 0)
                .ok_or_else(|| format!("config.json has `{key}` = {v}, not a positive step"))?;
            let at = if last { k - 1 } else { 0 };
            keep(key, &|i| i as u64 % k == at);
        }
    }
    if let Some(v) = fields.get("expert_layer_period") {
        let p = v.as_u64().filter(|&p| p > 0).ok_or_else(|| {
            format!("config.json has `expert_layer_period` = {v}, not a positive step")
        })?;
        let o = fields
            .get("expert_layer_offset")
            .map_or(Some(0), Value::as_u64)
            .ok_or_else(|| {
                "config.json's `expert_layer_offset` is not a layer index".to_string()
            })?;
        keep("expert_layer_period", &|i| i as u64 % p == o % p);
    }
    if let Some(v) = fields.get("mlp_only_layers") {
        let listed = indices("mlp_only_layers", v)?;
        keep("mlp_only_layers", &|i| {
            listed.binary_search(&(i as u64)).is_err()
        });
    }
    // A kind a layer: "dense" or "sparse" (GLM-4.7-Flash's, MiMo-V2-Flash's,
    // Step 3.5's `mlp_layer_types`).
    if let Some(v) = fields.get("mlp_layer_types") {
        let not_kinds = || {
            format!(
                "config.json has `mlp_layer_types` = {v}, not a list of \"dense\" and \"sparse\" \
                 a layer"
            )
        };
        let Value::Array(items) = v else {
            return Err(not_kinds());
        };
        let is_dense = items
            .iter()
            .map(|t| match t.as_str() {
                Some("dense") => Some(true),
                Some("sparse" | "moe") => Some(false),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(not_kinds)?;
        if is_dense.len() != n {
            return Err(format!(
                "config.json's `mlp_layer_types` lists {} layers of its {layers}",
                is_dense.len()
            ));
        }
        keep("mlp_layer_types", &|i| !is_dense[i]);
    }
    // The expert layers' indices (Llama 4's `moe_layers`).
    if let Some(v) = fields.get("moe_layers") {
        let listed = indices("moe_layers", v)?;
        keep("moe_layers", &|i| listed.binary_search(&(i as u64)).is_ok());
    }
    let first = expert.iter().take_while(|&&e| !e).count();
    let experts: Vec<u64> = (first..n)
        .filter(|&i| expert[i])
        .map(|i| i as u64)
        .collect();
    let (step, offset) = match experts[..] {
        [] => return Ok((layers, 1, 0)),
        [only] => (layers, only),
        [a, b, ..] => (b - a, a % (b - a)),
    };
    if let Some(i) = (first..n).find(|&i| expert[i] != (i as u64 % step == offset)) {
        let shown: Vec<String> = experts.iter().take(8).map(u64::to_string).collect();
        let more = if experts.len() > 8 { ", ..." } else { "" };
        return Err(format!(
            "config.json's {} make layers {}{more} of {layers} expert ones (layer {i} {}): a \
             mixture of experts whose expert layers follow no pattern the planner models \
             (dense first layers, then every k-th layer); describe it as a model TOML",
            said.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            shown.join(", "),
            match expert[i] {
                true => "among them",
                false => "dense",
            }
        ));
    }
    Ok((first as u64, step, offset))
}

/// Per-layer type lists under other names than `layer_types`, each with
/// the entries that are attention layers the planner prices: Zamba's
/// `layers_block_type` ("mamba", "hybrid"), RecurrentGemma's
/// `block_types` ("recurrent"), Reformer's `attn_layers` ("lsh": hashed
/// attention; "local" is attention over chunks, as `chunked_attention`).
const LAYER_LISTS: &[(&str, &[&str])] = &[
    ("layers_block_type", &["attention", "full_attention"]),
    ("block_types", &["attention"]),
    ("attn_layers", &["local"]),
];

/// `model_type`s with no attention layers to price: recurrent models
/// whose configs may otherwise read as a transformer's (xLSTM's heads and
/// widths, RWKV's).
const RECURRENT_TYPES: &[&str] = &["xlstm", "rwkv", "rwkv5", "rwkv6", "rwkv7"];

/// A field of a state-space (Mamba) mixer: Bamba's, Falcon-H1's, Zamba's
/// and Granite 4's `mamba_*`, Nemotron-H's `ssm_state_size`, Mamba's own
/// `state_size` and `time_step_rank`.
fn state_space_field(key: &str) -> bool {
    key.starts_with("mamba")
        || key.contains("_mamba")
        || key.starts_with("ssm_")
        || matches!(key, "state_size" | "time_step_rank")
}

/// Why the planner cannot model a config's layers, naming the field:
/// layers of any type but attention's in `layer_types` (linear
/// attention, state-space, convolution or compressed layers:
/// [`ATTENTION_LAYERS`]) or in another list of layer types
/// ([`LAYER_LISTS`], Nemotron-H's `hybrid_override_pattern`, MiniMax-01's
/// `attn_type_list`), a state-space mixer's fields without a
/// `layer_types` that makes every layer attention ([`state_space_field`]:
/// Bamba, Falcon-H1, whose layers run one beside their attention), a
/// recurrent model ([`RECURRENT_TYPES`]), layers run several times a
/// token (HRM's `H_cycles` and `L_cycles`), hyper-connections (`hc_mult`: a residual
/// stream several wide, DeepSeek-V4's), zero-computation experts
/// (LongCat-Flash's `zero_expert_num`, whose layers also run two attention
/// blocks).
fn unmodelled_layers(fields: &Fields) -> Option<String> {
    if let Some(t) = fields
        .get("model_type")
        .and_then(Value::as_str)
        .filter(|t| RECURRENT_TYPES.contains(t))
    {
        return Some(format!(
            "config.json's `model_type` \"{t}\" is a recurrent model without attention \
             layers, which the planner does not model (its layers are attention and a \
             feed-forward block)"
        ));
    }
    if let Some(v) = fields.get("hc_mult")
        && v.as_u64().is_none_or(|n| n > 1)
    {
        return Some(format!(
            "config.json has `hc_mult` = {v}: hyper-connections (a residual stream {v} wide), \
             which the planner does not model"
        ));
    }
    if let Some(v) = fields.get("zero_expert_num")
        && v.as_u64() != Some(0)
    {
        return Some(format!(
            "config.json has `zero_expert_num` = {v}: zero-computation experts (and \
             LongCat-Flash's layers of two attention blocks), which the planner does not \
             model"
        ));
    }
    for key in ["H_cycles", "L_cycles"] {
        if let Some(v) = fields.get(key)
            && v.as_u64() != Some(1)
        {
            return Some(format!(
                "config.json has `{key}` = {v}: layers run several times a token (a \
                 hierarchical recurrent model), which the planner does not model"
            ));
        }
    }
    let unpriced = |key: &str, t: &Value| {
        let t = t.as_str().map_or_else(|| t.to_string(), |t| t.to_string());
        format!(
            "config.json's `{key}` holds \"{t}\" layers, which the planner does not model \
             (its layers are attention and a feed-forward block)"
        )
    };
    let layer_types = fields.get("layer_types");
    if let Some(Value::Array(types)) = layer_types
        && let Some(t) = types
            .iter()
            .find(|t| !t.as_str().is_some_and(|t| ATTENTION_LAYERS.contains(&t)))
    {
        return Some(unpriced("layer_types", t));
    }
    for &(key, attention) in LAYER_LISTS {
        if let Some(Value::Array(types)) = fields.get(key)
            && let Some(t) = types
                .iter()
                .find(|t| !t.as_str().is_some_and(|t| attention.contains(&t)))
        {
            return Some(unpriced(key, t));
        }
    }
    if let Some(v) = fields.get("hybrid_override_pattern") {
        return Some(format!(
            "config.json has `hybrid_override_pattern` = {v}: layers of state-space mixers \
             (M), attention (*), MLPs (-) or experts (E) apart, which the planner does not \
             model (its layers are attention and a feed-forward block)"
        ));
    }
    if let Some(Value::Array(kinds)) = fields.get("attn_type_list")
        && kinds.iter().any(|k| k.as_u64() != Some(1))
    {
        return Some(
            "config.json's `attn_type_list` gives layers linear (lightning) attention (0), \
             which the planner does not model (it prices softmax attention, 1)"
                .into(),
        );
    }
    // (Naming the state's width where the config gives it.)
    let state_space = fields
        .map
        .iter()
        .filter(|(k, v)| !matches!(v, Value::Null | Value::Bool(false)) && state_space_field(k))
        .map(|(k, _)| k);
    if layer_types.is_none()
        && let Some(key) = state_space
            .clone()
            .find(|k| k.contains("state"))
            .or_else(|| state_space.clone().next())
    {
        return Some(format!(
            "config.json has `{key}`: state-space (Mamba) mixers in its layers, which the \
             planner does not model (its layers are attention and a feed-forward block)"
        ));
    }
    None
}

impl ModelSpec {
    /// Reads a Hugging Face model: `path` is its directory (holding
    /// `config.json`) or the config file itself. `seq_len`: the training
    /// sequence length; by default the config's context, at most
    /// [`DEFAULT_SEQ_LEN`]. With the model, what of the config it does not
    /// represent exactly ([`hf_notes`]).
    pub fn load_hf(path: &Path, seq_len: Option<u64>) -> Result<(Self, Vec<String>), SpecError> {
        let file = match path.is_dir() {
            true => path.join("config.json"),
            false => path.to_path_buf(),
        };
        let name = model_name(path);
        let text = read_file(&file)?;
        let in_file = |e| SpecError::InFile {
            path: file.clone(),
            source: Box::new(e),
        };
        let model = Self::from_hf_config(&text, &name, seq_len).map_err(in_file)?;
        Ok((model, hf_notes(&text)))
    }

    /// [`ModelSpec::load_hf`] from the config's text.
    pub fn from_hf_config(text: &str, name: &str, seq_len: Option<u64>) -> Result<Self, SpecError> {
        let bad = |problem: String| SpecError::Model {
            model: name.to_string(),
            problem,
        };
        let root = match polychip_files::parse_json_value(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(bad("config.json is not a JSON object".into())),
            Err(e) => return Err(bad(format!("config.json is not valid JSON: {e}"))),
        };
        // A multimodal model's language model is its `text_config`.
        let map = match root.get("text_config") {
            Some(Value::Object(text)) if first(&root, HIDDEN).is_none() => text,
            _ => &root,
        };
        let fields = Fields { map, bad: &bad };
        let declared = first(map, EXPERTS);
        if let Some((key, v)) = declared.filter(|(_, v)| v.as_u64().is_none()) {
            return Err(bad(format!(
                "config.json has `{key}` = {v}, not a count of experts (a whole number; 0 or 1 \
                 for a dense model)"
            )));
        }
        let routed = declared.and_then(|(_, v)| v.as_u64()).filter(|&e| e > 1);
        // (A known name of 1 or 0 says the model is dense: HunYuan's
        // `num_experts` of 1 beside its top-k.)
        if declared.is_none()
            && let Some((key, n)) = unread_experts(map)
        {
            return Err(bad(format!(
                "config.json has `{key}` = {n}: a mixture of experts whose routed experts the \
                 reader does not find under a name it knows ({}, at the top of the config); \
                 describe it as a model TOML (experts, experts_per_token, ffn)",
                list(EXPERTS)
            )));
        }
        if let Some(why) = unmodelled_layers(&fields) {
            return Err(bad(why));
        }
        // Switches read as true or false: another value is refused, not
        // read as false.
        for key in ["is_encoder_decoder", "multi_query", "use_sliding_window"] {
            if let Some(v) = fields.get(key).filter(|v| !v.is_boolean()) {
                return Err(bad(format!(
                    "config.json has `{key}` = {v}, not true or false"
                )));
            }
        }
        if fields.get("is_encoder_decoder").and_then(Value::as_bool) == Some(true) {
            return Err(bad(
                "config.json describes an encoder-decoder model (`is_encoder_decoder`: true); \
                 the planner models one stack of layers (a decoder, or an encoder): describe it \
                 as a model TOML"
                    .into(),
            ));
        }
        let model_type = fields.string("model_type")?.unwrap_or("");
        let act = fields
            .string("hidden_act")?
            .or(fields.string("activation_function")?)
            .unwrap_or("");
        let gated = GATED.contains(&model_type)
            || (!PLAIN.contains(&model_type) && matches!(act, "silu" | "swish" | "swiglu"));
        let layers = fields.size(LAYERS)?;
        // A mixture's dense first layers and the step of its expert ones;
        // every layer dense is a dense model.
        let (dense_first, moe_step, moe_offset) = match routed {
            Some(_) => expert_layer_pattern(&fields, layers).map_err(bad)?,
            None => (0, 1, 0),
        };
        let routed = routed.filter(|_| dense_first < layers);
        let (moe_step, moe_offset) = match (routed, moe_step) {
            (Some(_), k) if k > 1 => (k, moe_offset),
            _ => (0, 0),
        };
        let hidden = fields.size(HIDDEN)?;
        let heads = fields.size(HEADS)?;
        let kv_heads = match fields.optional_size(KV_HEADS)? {
            Some(kv) => kv,
            // Falcon's and GPT-BigCode's one key/value head.
            None if fields.get("multi_query").and_then(Value::as_bool) == Some(true) => 1,
            None => heads,
        };
        // MPT gives its MLP as a multiple of the width.
        let inner = match fields.optional_size(FFN)? {
            Some(f) => Some(f),
            None => fields
                .optional_size(&["expansion_ratio"])?
                .map(|r| r.saturating_mul(hidden)),
        };
        // The dense layers' MLP, beside a mixture's experts (Llama 4's
        // `intermediate_size_mlp`, its `intermediate_size` the experts').
        let mlp = fields.optional_size(&["intermediate_size_mlp"])?.or(inner);
        // An expert's width, where the config gives one apart from the
        // dense MLP's.
        let inner = match routed {
            Some(_) => fields.optional_size(EXPERT_FFN)?.or(inner),
            None => inner,
        };
        // Two matrices of `i` are a SwiGLU of `2 i / 3`; 4h unless given,
        // as GPT-2's `n_inner: null` means. (Saturating: the sizes'
        // bounds are checked below.)
        let as_swiglu = |i: u64| match gated {
            true => i,
            false => i.saturating_mul(2).div_ceil(3),
        };
        let ffn = match (gated, inner) {
            (true, Some(f)) => f,
            (true, None) => {
                return Err(bad(format!(
                    "config.json gives no feed-forward width (one of {}) for its gated MLP",
                    list(FFN)
                )));
            }
            (false, inner) => as_swiglu(inner.unwrap_or(hidden.saturating_mul(4))),
        };
        let (experts, experts_per_token, shared_ffn) = match routed {
            None => (0, 0, 0),
            Some(e) => {
                let k = fields.optional_size(TOP_K)?.ok_or_else(|| {
                    bad(format!(
                        "config.json gives {e} experts but not how many a token runs (one of \
                         {})",
                        list(TOP_K)
                    ))
                })?;
                // By width (as the config's MLP), or by count of experts.
                let shared = match first(map, SHARED_FFN) {
                    // Granite's `shared_intermediate_size` of 0: none.
                    Some((_, v)) if v.as_u64() == Some(0) => 0,
                    Some(_) => as_swiglu(fields.size(SHARED_FFN)?),
                    // Llama 4's MoE block runs a shared expert of the
                    // experts' width, which its config does not name.
                    None if model_type.starts_with("llama4") => ffn,
                    None => match first(map, SHARED_COUNT).map(|(_, v)| v.as_u64()) {
                        None | Some(Some(0)) => 0,
                        Some(_) => fields.size(SHARED_COUNT)?.saturating_mul(ffn),
                    },
                };
                (e, k, shared)
            }
        };
        let (dense_layers, dense_ffn) = match (routed, dense_first, moe_step) {
            (None, ..) | (_, 0, 0) => (0, 0),
            (Some(_), k, step) => match mlp {
                Some(i) => (k, as_swiglu(i)),
                None => {
                    let which = match (k, step) {
                        (k, 0) => format!("its first {k} layers are dense"),
                        (_, step) => format!("one layer in {step} runs the experts"),
                    };
                    return Err(bad(format!(
                        "config.json says {which} but gives no width for its dense layers' \
                         MLP (one of {})",
                        list(FFN)
                    )));
                }
            },
        };
        let vocab = fields.size(VOCAB)?;
        let context = fields.optional_size(CONTEXT)?;
        let seq_len = match (seq_len, context) {
            (Some(s), _) => s,
            (None, Some(c)) => c.min(DEFAULT_SEQ_LEN),
            (None, None) => DEFAULT_SEQ_LEN,
        };
        check_attention_fields(&fields, layers)?;
        let window = attention_window(map, layers).or_else(|| block_sparse(map, seq_len));
        // transformers' default when a config leaves it out is tied.
        let tied = match fields.get("tie_word_embeddings") {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                bad(format!(
                    "config.json has `tie_word_embeddings` = {v}, not true or false"
                ))
            })?,
        };
        // A head width apart from `hidden / heads` (Qwen3's, Gemma's);
        // the default where it is that. Without one, transformers' models
        // take `hidden / heads` rounded down (GLM-4-MoE's default config:
        // 96 heads at hidden 4096, of 42).
        let head_dim = match fields.get("head_dim") {
            None if hidden % heads != 0 => hidden / heads,
            None => 0,
            Some(v) => match v.as_u64() {
                Some(d) if d > 0 && d.checked_mul(heads) == Some(hidden) => 0,
                Some(d) if d > 0 => d,
                _ => {
                    return Err(bad(format!(
                        "config.json has `head_dim` = {v}, not a positive integer"
                    )));
                }
            },
        };
        // Multi-head latent attention (DeepSeek-V2 and V3, Kimi K2): the
        // heads' width is the queries' and keys' `qk_nope_head_dim +
        // qk_rope_head_dim` (its `head_dim`, where a config gives one, is
        // the rotary part), every head its own keys and values.
        let (head_dim, kv_heads, kv_lora_rank, q_lora_rank, rope_head_dim, v_head_dim) =
            match fields.optional_size(&["kv_lora_rank"])? {
                None => (head_dim, kv_heads, 0, 0, 0, 0),
                Some(rkv) => {
                    let nope = fields.size(&["qk_nope_head_dim"])?;
                    let rope = fields.size(&["qk_rope_head_dim"])?;
                    let v = fields.size(&["v_head_dim"])?;
                    let rq = fields.optional_size(&["q_lora_rank"])?.unwrap_or(0);
                    let d = nope.saturating_add(rope);
                    let head_dim = match d.checked_mul(heads) == Some(hidden) {
                        true => 0,
                        false => d,
                    };
                    let v = if v == d { 0 } else { v };
                    (head_dim, heads, rkv, rq, rope, v)
                }
            };
        let model = ModelSpec {
            name: name.to_string(),
            layers,
            hidden,
            ffn,
            heads,
            kv_heads,
            vocab,
            seq_len,
            tied_embeddings: tied,
            experts,
            experts_per_token,
            shared_ffn,
            head_dim,
            dense_layers,
            dense_ffn,
            moe_layer_step: moe_step,
            moe_layer_offset: moe_offset,
            kv_lora_rank,
            q_lora_rank,
            rope_head_dim,
            v_head_dim,
            // Multi-token prediction: noted ([`hf_notes`]), priced where
            // asked (`--mtp-layers`).
            mtp_layers: 0,
            sliding_window: window
                .as_ref()
                .filter(|w| !w.chunked)
                .map_or(0, |w| w.width),
            attention_chunk: window.as_ref().filter(|w| w.chunked).map_or(0, |w| w.width),
            window_layers: window.as_ref().map_or(0, |w| w.layers),
        };
        model.validate()?;
        Ok(model)
    }
}

/// What a config says that [`ModelSpec::from_hf_config`]'s model does not
/// represent exactly, as sentences: attention over a window or chunks of
/// the sequence (`attention_window`'s fields: Mistral's `sliding_window`,
/// sliding or chunked layers in `layer_types`, GPT-Neo's local layers, an
/// encoder's window around each token), which the planner prices over the
/// window but counts as full attention's FLOPs and activations, or whose
/// width the config does not give; sparse attention over indexed keys
/// (`indexed_attention` layers, DeepSeek-V3.2's and GLM-5's), priced over
/// the whole sequence and without its indexer; BigBird's block-sparse
/// attention, priced by its mean keys; attention approximated in other ways
/// (Nyströmformer's, YOSO's, MRA's, Longformer's global tokens), priced as
/// full attention; multi-token-prediction layers
/// (DeepSeek-V3's, GLM-4.5's `num_nextn_predict_layers`), which it leaves
/// out; sliding layers of other heads than the full ones (Step 3.5's).
pub fn hf_notes(text: &str) -> Vec<String> {
    let Ok(Value::Object(root)) = polychip_files::parse_json_value(text) else {
        return Vec::new();
    };
    let map = match root.get("text_config") {
        Some(Value::Object(text)) if first(&root, HIDDEN).is_none() => text,
        _ => &root,
    };
    let mut notes = Vec::new();
    // Layers a config says attend over a window or chunks (GPT-Neo's
    // `local` ones among them), whatever it gives of the width.
    let windowed = match map.get("layer_types") {
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| t.contains("sliding") || t.contains("chunked"))
            .count() as u64,
        _ => 0,
    }
    .saturating_add(gpt_neo_local_layers(map).unwrap_or(0));
    if let Some(n) = map
        .get("num_nextn_predict_layers")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)
    {
        let layers = if n == 1 { "layer" } else { "layers" };
        notes.push(format!(
            "config.json gives {n} multi-token-prediction {layers} (num_nextn_predict_layers), \
             which the planner leaves out (transformers' model does not train them); \
             --mtp-layers {n} prices them as Megatron-LM trains them"
        ));
    }
    let indexed = match map.get("layer_types") {
        Some(Value::Array(types)) => types
            .iter()
            .filter(|t| t.as_str() == Some("indexed_attention"))
            .count(),
        _ => 0,
    };
    if indexed > 0 {
        let keys = map
            .get("index_topk")
            .and_then(Value::as_u64)
            .map_or(String::new(), |k| format!(" of {k} keys a query"));
        notes.push(format!(
            "config.json gives {indexed} layers sparse attention over indexed keys{keys} \
             (`indexed_attention`, DeepSeek's sparse attention); the planner prices their \
             attention over the whole sequence and not their indexer"
        ));
    }
    let layers = first(map, LAYERS)
        .and_then(|(_, v)| v.as_u64())
        .unwrap_or(u64::MAX);
    match attention_window(map, layers) {
        Some(w) => {
            let which = match w.layers {
                0 => "its layers'".to_string(),
                n => format!("{n} layers'"),
            };
            let (width, fields) = (w.width, w.fields);
            notes.push(match (w.chunked, w.total) {
                (true, _) => format!(
                    "config.json gives {which} attention chunks of {width} tokens \
                     ({fields}); the planner prices it within them (each stage at its layers' \
                     mean; the FLOP count and the activations as full attention's)"
                ),
                (false, None) => format!(
                    "config.json gives {which} attention a window of {width} tokens \
                     ({fields}); the planner prices their attention over it (each stage at \
                     its layers' mean; the FLOP count and the activations as full \
                     attention's)"
                ),
                (false, Some(total)) => format!(
                    "config.json gives {which} attention a window of {total} tokens around \
                     each token ({fields}); the planner prices their attention over it, as a \
                     causal window of {width} does the same work (each stage at its layers' \
                     mean; the FLOP count and the activations as full attention's)"
                ),
            });
        }
        None if windowed > 0 => notes.push(format!(
            "config.json gives {windowed} layers' attention a window or chunks (layer_types, \
             attention_layers) but not their width; the planner prices it over the whole \
             sequence"
        )),
        None => {}
    }
    notes.extend(approximate_attention(map));
    // Step 3.5's sliding layers run other heads than its full ones.
    let heads = first(map, HEADS).and_then(|(_, v)| v.as_u64());
    let sliding_heads = ["num_sliding_attention_heads", "swa_num_attention_heads"]
        .iter()
        .find_map(|&k| map.get(k).and_then(Value::as_u64).map(|n| (k, n)));
    if let (Some(heads), Some((key, sliding))) = (heads, sliding_heads)
        && windowed > 0
        && sliding != heads
    {
        notes.push(format!(
            "config.json gives its sliding layers {sliding} attention heads (`{key}`) where \
             the others have {heads}; the planner prices every layer's attention at {heads}"
        ));
    }
    notes
}

/// The window a config's layers attend over ([`ModelSpec::sliding_window`])
/// or the chunks they attend within ([`ModelSpec::attention_chunk`],
/// `chunked`): its width in tokens, and how many layers (0: every one). An
/// encoder's window around each token (`total` keys, half on each side) is
/// priced as a causal window of half that width, which does the same work
/// ([`ModelSpec::attention_span`]: `2 w - w^2 / s` keys of Megatron-LM's
/// causal count, `W - W^2 / 4s` of a two-sided window of `W = 2 w`).
struct Window {
    width: u64,
    chunked: bool,
    layers: u64,
    /// The config's fields it was read from.
    fields: &'static str,
    /// An encoder's window: the keys around each token, both sides.
    total: Option<u64>,
}

/// A config's [`Window`]: `sliding_window` on the `layer_types` entries that
/// say sliding (every layer without `layer_types`; none with
/// `use_sliding_window` false, Qwen2's), or Llama 4's
/// `attention_chunk_size` on its chunked layers; GPT-Neo's `window_size` on
/// its `local` layers (`attention_layers`, or `attention_types` unrolled);
/// an encoder's window around each token on its sliding layers
/// (ModernBERT's `local_attention`) or on every layer (Longformer's
/// `attention_window`, the widest where each layer gives one). `None`:
/// full attention, or windowed layers whose width the config does not give.
fn attention_window(map: &Map<String, Value>, layers: u64) -> Option<Window> {
    let types = match map.get("layer_types") {
        Some(Value::Array(types)) => Some(types),
        _ => None,
    };
    let count = |word: &str| {
        types.map_or(0, |t| {
            t.iter()
                .filter_map(Value::as_str)
                .filter(|t| t.contains(word))
                .count() as u64
        })
    };
    let positive = |key: &str| map.get(key).and_then(Value::as_u64).filter(|&n| n > 0);
    let chunked = count("chunked");
    if chunked > 0 {
        let chunk = positive("attention_chunk_size")?;
        return Some(Window {
            width: chunk,
            chunked: true,
            layers: chunked.min(layers),
            fields: "attention_chunk_size, layer_types",
            total: None,
        });
    }
    if let Some(local) = gpt_neo_local_layers(map) {
        let width = positive("window_size")?;
        return (local > 0).then_some(Window {
            width,
            chunked: false,
            layers: local.min(layers),
            fields: "window_size, attention_layers",
            total: None,
        });
    }
    let two_sided = |total: u64, layers: u64, fields| {
        (total >= 2).then_some(Window {
            width: total / 2,
            chunked: false,
            layers,
            fields,
            total: Some(total),
        })
    };
    if map.get("sliding_window").is_none_or(Value::is_null) {
        if let Some(total) = positive("local_attention") {
            let sliding = count("sliding").min(layers);
            return match types {
                Some(_) if sliding == 0 => None,
                _ => two_sided(total, sliding, "local_attention, layer_types"),
            };
        }
        let widest = match map.get("attention_window") {
            Some(Value::Array(widths)) => widths.iter().filter_map(Value::as_u64).max(),
            Some(w) => w.as_u64(),
            None => None,
        };
        if let Some(total) = widest.filter(|&w| w > 0) {
            return two_sided(total, 0, "attention_window");
        }
    }
    let tokens = positive("sliding_window")?;
    if map.get("use_sliding_window").and_then(Value::as_bool) == Some(false) {
        return None;
    }
    let layers = match types {
        Some(_) => count("sliding").min(layers),
        None => 0,
    };
    (types.is_none() || layers > 0).then_some(Window {
        width: tokens,
        chunked: false,
        layers,
        fields: "sliding_window",
        total: None,
    })
}

/// Refuses attention fields whose values the reader would otherwise take as
/// full attention without a word: a window, chunk or block that is not a
/// whole number of tokens (0 and null are no window, as transformers reads
/// them), `layer_types` that is not one kind of layer a layer, GPT-Neo's
/// `attention_layers` or `attention_types` that do not give its layers'
/// kinds, and BigBird's block-sparse attention without its blocks.
fn check_attention_fields(fields: &Fields, layers: u64) -> Result<(), SpecError> {
    let bad = |key: &str, v: &Value, what: &str| {
        (fields.bad)(format!("config.json has `{key}` = {v}, {what}"))
    };
    let tokens = |key: &str| match fields.get(key) {
        Some(v) if v.as_u64().is_none() => Err(bad(key, v, "not a whole number of tokens")),
        _ => Ok(()),
    };
    for key in ["sliding_window", "attention_chunk_size", "local_attention"] {
        tokens(key)?;
    }
    let kinds = |key: &str, v: &Value| match v.as_array() {
        Some(kinds) if kinds.iter().all(Value::is_string) => Ok(kinds.len() as u64),
        _ => Err(bad(key, v, "not a list of layer kinds (strings)")),
    };
    let count = |key: &str, n: u64| match n == layers {
        true => Ok(()),
        false => Err((fields.bad)(format!(
            "config.json's `{key}` gives the kinds of {n} layers, but the model has {layers}"
        ))),
    };
    if let Some(v) = fields.get("layer_types") {
        count("layer_types", kinds("layer_types", v)?)?;
    }
    let widths = match fields.get("attention_window") {
        Some(Value::Array(widths)) => widths.iter().collect(),
        w => w.into_iter().collect::<Vec<_>>(),
    };
    if let Some(w) = widths.into_iter().find(|w| w.as_u64().is_none()) {
        return Err(bad("attention_window", w, "not a whole number of tokens"));
    }
    // GPT-Neo's kinds of layers, and its window where it has local ones.
    if let Some(v) = fields.get("attention_layers") {
        count("attention_layers", kinds("attention_layers", v)?)?;
    }
    if let Some(v) = fields.get("attention_types") {
        let pairs = "not a list of [layer kinds, repeats] pairs";
        let groups = v
            .as_array()
            .ok_or_else(|| bad("attention_types", v, pairs))?;
        let mut n = 0u64;
        for group in groups {
            let Some([g, repeats]) = group.as_array().map(Vec::as_slice) else {
                return Err(bad("attention_types", v, pairs));
            };
            let repeats = repeats
                .as_u64()
                .ok_or_else(|| bad("attention_types", v, pairs))?;
            n = n.saturating_add(kinds("attention_types", g)?.saturating_mul(repeats));
        }
        if fields.get("attention_layers").is_none() {
            count("attention_types", n)?;
        }
    }
    if gpt_neo_local_layers(fields.map).is_some_and(|n| n > 0) {
        tokens("window_size")?;
    }
    if fields.get("attention_type").and_then(Value::as_str) == Some("block_sparse") {
        for (key, least, what) in [
            ("block_size", 1, "not a positive whole number of tokens"),
            ("num_random_blocks", 0, "not a whole number of blocks"),
        ] {
            match fields.get(key) {
                Some(v) if v.as_u64().is_some_and(|n| n >= least) => {}
                Some(v) => return Err(bad(key, v, what)),
                None => {
                    return Err((fields.bad)(format!(
                        "config.json has block-sparse attention (`attention_type` = \
                         \"block_sparse\") but no `{key}`"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// BigBird's block-sparse attention (`attention_type` "block_sparse") over
/// `s` tokens in blocks of `b` (`block_size`) with `r` random blocks
/// (`num_random_blocks`), as the causal window that does its work: the
/// first and last blocks of queries attend every key, each other block
/// three sliding blocks, the first and the last and `r` random ones, so a
/// query attends `K = ((s/b - 2)(5 + r) b + 2 s) / (s/b)` keys on the mean,
/// and a causal window of `w = s (1 - sqrt(1 - K/s))` does as much (`2 w -
/// w^2/s = K`). `None` (full attention) where BigBird runs full attention:
/// a sequence of at most `(5 + 2r) b` tokens.
fn block_sparse(map: &Map<String, Value>, s: u64) -> Option<Window> {
    if map.get("attention_type").and_then(Value::as_str) != Some("block_sparse") {
        return None;
    }
    let b = map
        .get("block_size")
        .and_then(Value::as_u64)
        .filter(|&b| b > 0)?;
    let r = map.get("num_random_blocks").and_then(Value::as_u64)?;
    let full = r.checked_mul(2)?.checked_add(5)?.checked_mul(b)?;
    if s <= full {
        return None;
    }
    let (s, b, r) = (s as f64, b as f64, r as f64);
    let blocks = s / b;
    let keys = (((blocks - 2.0) * (5.0 + r) * b + 2.0 * s) / blocks).min(s);
    let width = (s * (1.0 - (1.0 - keys / s).sqrt())).round() as u64;
    Some(Window {
        width: width.max(1),
        chunked: false,
        layers: 0,
        fields: "attention_type, block_size, num_random_blocks",
        total: None,
    })
}

/// GPT-Neo's local (windowed) layers: the `local` entries of
/// `attention_layers`, or of `attention_types` (`[[kinds, repeats], ...]`)
/// unrolled; `None` when the config gives neither.
fn gpt_neo_local_layers(map: &Map<String, Value>) -> Option<u64> {
    if let Some(Value::Array(kinds)) = map.get("attention_layers") {
        return Some(kinds.iter().filter(|k| k.as_str() == Some("local")).count() as u64);
    }
    let Some(Value::Array(groups)) = map.get("attention_types") else {
        return None;
    };
    let mut local = 0u64;
    for group in groups {
        let Some([Value::Array(kinds), repeats]) = group.as_array().map(Vec::as_slice) else {
            return None;
        };
        let n = kinds.iter().filter(|k| k.as_str() == Some("local")).count() as u64;
        local = local.saturating_add(n.saturating_mul(repeats.as_u64()?));
    }
    Some(local)
}

/// A sentence for attention a config approximates: BigBird's block-sparse
/// attention, which the planner prices by its mean keys ([`block_sparse`]),
/// and what it does not price (it prices such attention over the whole
/// sequence): Nyströmformer's landmarks, YOSO's and MRA's approximations,
/// Longformer's global tokens.
fn approximate_attention(map: &Map<String, Value>) -> Option<String> {
    let model_type = map.get("model_type").and_then(Value::as_str).unwrap_or("");
    let what = match model_type {
        _ if map.get("attention_type").and_then(Value::as_str) == Some("block_sparse") => {
            return Some(
                "config.json describes block-sparse attention (BigBird's `attention_type`, \
                 `block_size`, `num_random_blocks`); past `(5 + 2 r) b` tokens the planner \
                 prices it by the keys a query attends on the mean, `((s/b - 2)(5 + r) b + \
                 2 s) b / s`, as the causal window that does that work (the FLOP count and the \
                 activations as full attention's), and below as full attention, as BigBird \
                 runs it"
                    .into(),
            );
        }
        _ if map.contains_key("num_landmarks") => {
            "attention approximated through landmarks (Nyströmformer's `num_landmarks`)"
        }
        "yoso" => "attention approximated by hashing (YOSO's `hash_code_len`)",
        "mra" => "multi-resolution approximate attention (MRA's `approx_mode`)",
        _ if map.contains_key("attention_window") => {
            return Some(
                "config.json's Longformer attention lets the tokens an input marks global \
                 attend to and from every token; the planner prices only the window"
                    .into(),
            );
        }
        _ => return None,
    };
    Some(format!(
        "config.json describes {what}; the planner prices each layer's attention as full \
         attention over the whole sequence, more work than the model does"
    ))
}

/// The names transformers' configs give each size, in the order tried.
const LAYERS: &[&str] = &["num_hidden_layers", "n_layer", "num_layers", "n_layers"];
const HIDDEN: &[&str] = &["hidden_size", "n_embd", "d_model", "dim"];
const HEADS: &[&str] = &["num_attention_heads", "n_head", "num_heads", "n_heads"];
const KV_HEADS: &[&str] = &[
    "num_key_value_heads",
    "num_kv_heads",
    "n_head_kv",
    "multi_query_group_num",
];
const FFN: &[&str] = &[
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "ffn_hidden_size",
    "d_ff",
    "hidden_dim",
];
const VOCAB: &[&str] = &["vocab_size", "padded_vocab_size", "n_vocab"];
const CONTEXT: &[&str] = &[
    "max_position_embeddings",
    "n_positions",
    "seq_length",
    "max_sequence_length",
    "max_seq_len",
    "n_ctx",
];

/// The first of `keys` that `map` holds (not null), with its name.
fn first<'a>(
    map: &'a Map<String, Value>,
    keys: &[&'static str],
) -> Option<(&'static str, &'a Value)> {
    keys.iter()
        .find_map(|&k| map.get(k).filter(|v| !v.is_null()).map(|v| (k, v)))
}

fn list(keys: &[&'static str]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct Fields<'a> {
    map: &'a Map<String, Value>,
    bad: &'a dyn Fn(String) -> SpecError,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<&str>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| (self.bad)(format!("config.json has `{key}` = {v}, not a string"))),
        }
    }

    /// The first of `keys` present, a positive integer; `None` when none is.
    fn optional_size(&self, keys: &[&'static str]) -> Result<Option<u64>, SpecError> {
        let Some((key, v)) = first(self.map, keys) else {
            return Ok(None);
        };
        match (v.as_u64(), v) {
            (Some(n), _) if n > 0 => Ok(Some(n)),
            // (ERNIE 4.5 VL's expert widths a modality, Swin's depths a
            // stage.)
            (_, Value::Array(_)) => Err((self.bad)(format!(
                "config.json has `{key}` = {v}: a size for each of several parts (each \
                 modality, stage or layer), where the planner takes one; describe the model \
                 as a model TOML"
            ))),
            _ => Err((self.bad)(format!(
                "config.json has `{key}` = {v}, not a positive integer"
            ))),
        }
    }

    fn size(&self, keys: &[&'static str]) -> Result<u64, SpecError> {
        self.optional_size(keys)?.ok_or_else(|| {
            (self.bad)(format!(
                "config.json has none of {}; the planner needs it for the model's shape",
                list(keys)
            ))
        })
    }
}

/// A model's name from its path: the directory's name for a directory or
/// its `config.json`, else the file's stem (`mistral-7b.json`).
fn model_name(path: &Path) -> String {
    let dir = match path.is_dir() {
        true => Some(path),
        false if path.file_name().is_some_and(|n| n == "config.json") => path.parent(),
        false => None,
    };
    dir.and_then(|d| d.canonicalize().ok())
        .as_deref()
        .and_then(Path::file_name)
        .or_else(|| path.file_stem())
        .and_then(|n| n.to_str())
        .unwrap_or("model")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 2 7B's config.json (as published, trimmed of the fields the
    /// planner does not read): the preset's shape.
    #[test]
    fn a_llama_config_is_the_llama_preset() {
        let text = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
            "max_position_embeddings": 4096, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
            "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16"}"#;
        let m = ModelSpec::from_hf_config(text, "llama-7b", None).unwrap();
        assert_eq!(m, ModelSpec::llama_7b());
        let m = ModelSpec::from_hf_config(text, "llama-7b", Some(2048)).unwrap();
        assert_eq!(m.seq_len, 2048);
    }

    /// GPT-2's two-matrix MLP of 4h (`n_inner: null`) is a SwiGLU of 8h/3:
    /// the same parameters.
    #[test]
    fn a_gpt2_config_has_its_parameters() {
        let text = r#"{"model_type": "gpt2", "activation_function": "gelu_new",
            "n_embd": 768, "n_head": 12, "n_layer": 12, "n_inner": null,
            "n_positions": 1024, "vocab_size": 50257}"#;
        let m = ModelSpec::from_hf_config(text, "gpt2", None).unwrap();
        assert_eq!((m.layers, m.hidden, m.heads, m.kv_heads), (12, 768, 12, 12));
        assert_eq!((m.ffn, m.vocab, m.seq_len), (2048, 50257, 1024));
        // 2 h 4h = 3 h f: the MLP's weights; the head is the embedding
        // (transformers' default), so GPT-2 small counts 124 M parameters.
        assert_eq!(3 * m.hidden * m.ffn, 2 * 768 * 3072);
        assert!(m.tied_embeddings);
        let p = m.total_params();
        assert!((123_000_000..125_000_000).contains(&p), "{p}");
        // Falcon's multi-query attention: one key/value head.
        let falcon = r#"{"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
            "num_hidden_layers": 32, "multi_query": true, "vocab_size": 65024}"#;
        let m = ModelSpec::from_hf_config(falcon, "falcon-7b", None).unwrap();
        assert_eq!((m.kv_heads, m.ffn, m.seq_len), (1, 12118, 4096));
    }

    /// MPT's MLP as a multiple of the width; Gemma's wide heads as its
    /// `head_dim` (its attention twice the projections `hidden / heads`
    /// would give), a Llama's `head_dim` of `hidden / heads` as the
    /// default; a sliding window said as what the model does not
    /// represent.
    #[test]
    fn an_expansion_ratio_a_head_dim_and_a_window() {
        let mpt = r#"{"model_type": "mpt", "d_model": 2048, "n_heads": 16, "n_layers": 24,
            "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50368}"#;
        let m = ModelSpec::from_hf_config(mpt, "mpt", None).unwrap();
        assert_eq!((m.ffn, m.seq_len), (2 * 4 * 2048 / 3 + 1, 2048));
        assert!(hf_notes(mpt).is_empty());
        let gemma = r#"{"model_type": "gemma", "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
            "num_key_value_heads": 16, "head_dim": 256, "num_hidden_layers": 28,
            "vocab_size": 256000, "max_position_embeddings": 8192}"#;
        let m = ModelSpec::from_hf_config(gemma, "gemma-7b", None).unwrap();
        // GeGLU is gated: the width as given.
        assert_eq!(m.ffn, 24576);
        assert_eq!((m.head_dim(), m.q_dim(), m.kv_dim()), (256, 4096, 4096));
        assert_eq!(m.attention_params(), 4 * 3072 * 4096);
        assert!(hf_notes(gemma).is_empty());
        let llama = gemma.replace("\"head_dim\": 256", "\"head_dim\": 192");
        assert_eq!(
            ModelSpec::from_hf_config(&llama, "l", None)
                .unwrap()
                .head_dim,
            0
        );
        // Without a head_dim, heads that do not divide the width are
        // `hidden / heads` wide, rounded down, as transformers takes them.
        let glm = gemma.replace("\"head_dim\": 256,", "\"num_attention_heads\": 96,");
        let glm = glm.replacen("\"num_attention_heads\": 16,", "", 1);
        let m = ModelSpec::from_hf_config(&glm, "g", None).unwrap();
        assert_eq!((m.heads, m.head_dim(), m.q_dim()), (96, 32, 3072));
        // A head_dim past the bounds is refused, not multiplied past u64.
        let huge = gemma.replace("\"head_dim\": 256", "\"head_dim\": 18446744073709551615");
        let e = ModelSpec::from_hf_config(&huge, "g", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("head_dim is 18446744073709551615, more than"),
            "{e}"
        );
        let bad = gemma.replace("\"head_dim\": 256", "\"head_dim\": -2");
        let e = ModelSpec::from_hf_config(&bad, "g", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`head_dim` = -2, not a positive integer"), "{e}");
        let mistral = r#"{"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
            "sliding_window": 4096}"#;
        let notes = hf_notes(mistral);
        assert!(
            notes[0].contains("gives its layers' attention a window of 4096 tokens"),
            "{notes:?}"
        );
        let oss = r#"{"layer_types": ["sliding_attention", "full_attention",
            "sliding_attention"], "sliding_window": 128}"#;
        assert!(hf_notes(oss)[0].contains("gives 2 layers' attention a window of 128"));
        // Read as the window and the layers that attend over it: GPT-OSS's
        // every other layer, Mistral 7B v0.1's every one (0), none where
        // Qwen2 turns it off; Llama 4's chunks as chunks.
        let base = WINDOW_BASE;
        let oss = format!(
            r#"{{{base}, "sliding_window": 128, "layer_types": ["sliding_attention",
            "full_attention", "sliding_attention", "full_attention"]}}"#
        );
        assert_eq!(window(&oss), (128, 2));
        assert_eq!(
            window(&format!(r#"{{{base}, "sliding_window": 4096}}"#)),
            (4096, 0)
        );
        let qwen = format!(r#"{{{base}, "sliding_window": 4096, "use_sliding_window": false}}"#);
        assert_eq!(window(&qwen), (0, 0));
        assert!(hf_notes(&qwen).is_empty());
        let llama4 = format!(
            r#"{{{base}, "attention_chunk_size": 8192, "layer_types": ["chunked_attention",
            "chunked_attention", "chunked_attention", "full_attention"]}}"#
        );
        assert_eq!(window(&llama4), (0, 3));
        let m = ModelSpec::from_hf_config(&llama4, "l4", None).unwrap();
        assert_eq!(m.attention_chunk, 8192);
        assert!(hf_notes(&llama4)[0].contains("chunks of 8192 tokens"));
        let no_width = format!(
            r#"{{{base}, "layer_types": ["sliding_attention", "full_attention",
            "full_attention", "full_attention"]}}"#
        );
        assert_eq!(window(&no_width), (0, 0));
        assert!(hf_notes(&no_width)[0].contains("but not their width"));
    }

    /// A config's window and its windowed layers, as the model reads them.
    fn window(text: &str) -> (u64, u64) {
        let m = ModelSpec::from_hf_config(text, "w", None).unwrap();
        (m.sliding_window, m.window_layers)
    }

    /// A small dense config's fields, to add a window's to.
    const WINDOW_BASE: &str = r#""hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 256,
        "hidden_act": "silu""#;

    /// Windows given in other fields: GPT-Neo's `window_size` on its
    /// `local` layers (listed, or as `attention_types` groups); an
    /// encoder's window around each token (ModernBERT's `local_attention`
    /// on its sliding layers, Longformer's `attention_window`, the widest
    /// of a list) as a causal window of half its width, which does the same
    /// work; attention the planner does not price as what it is, noted.
    #[test]
    fn windows_of_gpt_neo_and_of_encoders() {
        let base = WINDOW_BASE;
        let neo = format!(
            r#"{{{base}, "model_type": "gpt_neo", "window_size": 256,
            "attention_types": [[["global", "local"], 2]]}}"#
        );
        assert_eq!(window(&neo), (256, 2));
        assert!(hf_notes(&neo)[0].contains(
            "2 layers' attention a window of 256 tokens \
            (window_size, attention_layers)"
        ));
        let listed = neo.replace(
            r#""attention_types": [[["global", "local"], 2]]"#,
            r#""attention_layers": ["local", "local", "local", "global"]"#,
        );
        assert_eq!(window(&listed), (256, 3));
        let no_width = neo.replace(r#""window_size": 256,"#, "");
        assert_eq!(window(&no_width), (0, 0));
        assert!(hf_notes(&no_width)[0].contains("2 layers' attention a window or chunks"));
        let global = neo.replace(r#"["global", "local"]"#, r#"["global", "global"]"#);
        assert_eq!(window(&global), (0, 0));
        assert!(hf_notes(&global).is_empty());
        // GPT-Neo 2.7B's halves, at its 2,048 tokens: the local layers take
        // 2 x 256 - 256^2 / 2048 = 480 keys, the mean (2048 + 480) / 2.
        let neo = format!(
            r#"{{{base}, "window_size": 256, "max_position_embeddings": 2048,
            "attention_types": [[["global", "local"], 2]]}}"#
        );
        let m = ModelSpec::from_hf_config(&neo, "n", None).unwrap();
        assert_eq!(m.attention_span(), (2048.0 + 480.0) / 2.0);
        let modernbert = format!(
            r#"{{{base}, "model_type": "modernbert", "local_attention": 128,
            "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
            "full_attention"]}}"#
        );
        assert_eq!(window(&modernbert), (64, 2));
        let notes = hf_notes(&modernbert);
        assert!(
            notes[0].contains(
                "a window of 128 tokens around each token (local_attention, \
                layer_types); the planner prices their attention over it, as a causal window \
                of 64 does the same work"
            ),
            "{notes:?}"
        );
        // transformers' ModernBERT decoder writes the half as
        // `sliding_window`, which it is.
        let decoder = modernbert.replace(
            r#""local_attention": 128"#,
            r#""local_attention": 128,
            "sliding_window": 64"#,
        );
        assert_eq!(window(&decoder), (64, 2));
        let longformer = format!(r#"{{{base}, "attention_window": [512, 256, 512, 512]}}"#);
        assert_eq!(window(&longformer), (256, 0));
        let notes = hf_notes(&longformer);
        assert!(notes[0].contains("its layers' attention a window of 512 tokens around"));
        assert!(
            notes[1].contains("the planner prices only the window"),
            "{notes:?}"
        );
        // A two-sided window of W = 512 over s = 4096: W - W^2 / 4s keys.
        let m = ModelSpec::from_hf_config(&longformer, "l", Some(4096)).unwrap();
        assert_eq!(m.attention_span(), 512.0 - 512.0 * 512.0 / (4.0 * 4096.0));
        for (fields, what) in [
            (r#""num_landmarks": 64"#, "landmarks"),
            (r#""model_type": "yoso""#, "hashing"),
            (r#""model_type": "mra""#, "multi-resolution"),
        ] {
            let text = format!("{{{base}, {fields}}}");
            assert_eq!(window(&text), (0, 0));
            let notes = hf_notes(&text);
            assert!(
                notes.len() == 1 && notes[0].contains(what) && notes[0].contains("full attention"),
                "{notes:?}"
            );
        }
        // BigBird's block-sparse attention at 4,096 tokens in blocks of 64
        // with 3 random ones: (62 x 8 x 64 + 2 x 4096) / 64 = 624 keys a
        // query on the mean, a causal window of 325 (2 x 325 - 325^2 /
        // 4096 = 624.2); at 704 tokens or fewer BigBird attends fully.
        let bigbird = format!(
            r#"{{{base}, "attention_type": "block_sparse", "block_size": 64,
            "num_random_blocks": 3, "max_position_embeddings": 4096}}"#
        );
        assert_eq!(window(&bigbird), (325, 0));
        let m = ModelSpec::from_hf_config(&bigbird, "b", None).unwrap();
        assert!(
            (m.attention_span() - 624.0).abs() < 0.5,
            "{}",
            m.attention_span()
        );
        let m = ModelSpec::from_hf_config(&bigbird, "b", Some(704)).unwrap();
        assert_eq!((m.sliding_window, m.attention_span()), (0, 704.0));
        let notes = hf_notes(&bigbird);
        assert!(
            notes.len() == 1 && notes[0].contains("by the keys a query attends on the mean"),
            "{notes:?}"
        );
        // Step 3.5's sliding layers of other heads.
        let step = format!(
            r#"{{{base}, "sliding_window": 512, "num_sliding_attention_heads": 8,
            "layer_types": ["sliding_attention", "full_attention"]}}"#
        );
        let notes = hf_notes(&step);
        assert!(
            notes[1].contains(
                "its sliding layers 8 attention heads (`num_sliding_attention_heads`) \
                where the others have 4; the planner prices every layer's attention at 4"
            ),
            "{notes:?}"
        );
        let same = step.replace(
            "\"num_sliding_attention_heads\": 8",
            "\"num_sliding_attention_heads\": 4",
        );
        assert_eq!(hf_notes(&same).len(), 1);
    }

    /// Attention fields and expert counts that are not what transformers
    /// reads are refused with the field and its value, not priced as full
    /// attention or a dense model (until 2026-12-08 a Mixtral config of
    /// `sliding_window` -4 or "4096", or a Qwen3-MoE config of
    /// `num_experts` -1, planned so without a word). 0 and null stay no
    /// window, and 0 or 1 expert a dense model.
    #[test]
    fn attention_fields_and_expert_counts_that_are_not_whole_numbers_are_refused() {
        let base = WINDOW_BASE;
        let refused = |extra: &str, want: &str| {
            let text = format!("{{{base}, {extra}}}");
            let e = ModelSpec::from_hf_config(&text, "m", None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{extra}: {e}");
        };
        for (extra, want) in [
            (
                r#""sliding_window": -4"#,
                "`sliding_window` = -4, not a whole number of tokens",
            ),
            (
                r#""sliding_window": "4096""#,
                r#"`sliding_window` = "4096", not a whole"#,
            ),
            (r#""sliding_window": 1.5"#, "`sliding_window` = 1.5, not"),
            (
                r#""attention_chunk_size": [8]"#,
                "`attention_chunk_size` = [8], not",
            ),
            (
                r#""local_attention": true"#,
                "`local_attention` = true, not",
            ),
            (
                r#""attention_window": [512, -1, 512, 512]"#,
                "`attention_window` = -1, not",
            ),
            (
                r#""attention_window": "512""#,
                r#"`attention_window` = "512", not"#,
            ),
            (
                r#""use_sliding_window": "false""#,
                r#"`use_sliding_window` = "false", not true or false"#,
            ),
            (
                r#""multi_query": 1"#,
                "`multi_query` = 1, not true or false",
            ),
            (
                r#""is_encoder_decoder": "true""#,
                r#"`is_encoder_decoder` = "true", not true or false"#,
            ),
            (
                r#""layer_types": 3"#,
                "`layer_types` = 3, not a list of layer kinds",
            ),
            (
                r#""layer_types": [1, 2, 3, 4]"#,
                "`layer_types` holds \"1\" layers, which",
            ),
            (
                r#""layer_types": ["full_attention", "sliding_attention"]"#,
                "`layer_types` gives the kinds of 2 layers, but the model has 4",
            ),
            (
                r#""attention_layers": ["local", "global"]"#,
                "`attention_layers` gives the kinds of 2 layers, but the model has 4",
            ),
            (
                r#""attention_types": [[["local"], -2]]"#,
                "`attention_types` = [[[\"local\"],-2]], not a list of [layer kinds, repeats] pairs",
            ),
            (
                r#""attention_types": "local""#,
                "`attention_types` = \"local\", not a list of",
            ),
            (
                r#""attention_types": [[["global", "local"], 3]]"#,
                "`attention_types` gives the kinds of 6 layers, but the model has 4",
            ),
            (
                r#""attention_types": [[["global", "local"], 2]], "window_size": -256"#,
                "`window_size` = -256, not a whole number of tokens",
            ),
            (
                r#""attention_type": "block_sparse", "block_size": 0, "num_random_blocks": 3"#,
                "`block_size` = 0, not a positive whole number of tokens",
            ),
            (
                r#""attention_type": "block_sparse", "block_size": 64"#,
                "block-sparse attention (`attention_type` = \"block_sparse\") but no `num_random_blocks`",
            ),
            (
                r#""num_experts": -1, "num_experts_per_tok": 2"#,
                "`num_experts` = -1, not a count of experts",
            ),
            (
                r#""num_local_experts": 1.5"#,
                "`num_local_experts` = 1.5, not a count",
            ),
            (
                r#""n_routed_experts": "8""#,
                r#"`n_routed_experts` = "8", not a count"#,
            ),
        ] {
            refused(extra, want);
        }
        // What transformers reads as no window, and as a dense model.
        for extra in [
            r#""sliding_window": 0"#,
            r#""sliding_window": null, "use_sliding_window": null"#,
            r#""attention_window": 0"#,
            r#""window_size": -1"#,
            r#""num_experts": 1"#,
            r#""num_experts": 0, "num_local_experts": null"#,
        ] {
            let text = format!("{{{base}, {extra}}}");
            let m = ModelSpec::from_hf_config(&text, "m", None).unwrap();
            assert_eq!((m.sliding_window, m.experts), (0, 0), "{extra}");
        }
    }

    /// Mixtures of experts as transformers writes them: Mixtral (experts of
    /// the config's `intermediate_size`), Qwen2-MoE (`moe_intermediate_size`
    /// and a shared expert by width), a DeepSeek-style shared expert by
    /// count, GPT-2-style two-matrix experts as SwiGLUs of `2 i / 3`, and
    /// Granite's shared width of 0 (none).
    #[test]
    fn mixtures_of_experts_read_their_experts() {
        let mixtral = r#"{"model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
            "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": false}"#;
        let m = ModelSpec::from_hf_config(mixtral, "mixtral-8x7b", None).unwrap();
        assert_eq!(m, ModelSpec::mixtral_8x7b());
        let qwen = r#"{"model_type": "qwen2_moe", "hidden_size": 2048, "hidden_act": "silu",
            "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_experts": 60,
            "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "num_attention_heads": 16, "num_hidden_layers": 2, "vocab_size": 151936,
            "layer_types": ["full_attention", "full_attention"]}"#;
        let m = ModelSpec::from_hf_config(qwen, "q", None).unwrap();
        assert_eq!(
            (m.experts, m.experts_per_token, m.ffn, m.shared_ffn),
            (60, 4, 1408, 5632)
        );
        let by_count = r#"{"model_type": "deepseek", "hidden_size": 2048,
            "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
            "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 0,
            "num_attention_heads": 16, "num_hidden_layers": 28, "vocab_size": 102400}"#;
        let m = ModelSpec::from_hf_config(by_count, "d", None).unwrap();
        assert_eq!((m.ffn, m.shared_ffn), (1408, 2 * 1408));
        let plain = r#"{"model_type": "gpt2", "n_embd": 96, "n_head": 4, "n_layer": 2,
            "n_inner": 300, "vocab_size": 256, "num_experts": 4, "num_experts_per_tok": 1,
            "shared_intermediate_size": 150}"#;
        let m = ModelSpec::from_hf_config(plain, "p", None).unwrap();
        assert_eq!((m.ffn, m.shared_ffn, m.experts), (200, 100, 4));
        let granite = r#"{"model_type": "granitemoeshared", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 256, "num_local_experts": 8, "num_experts_per_tok": 2,
            "shared_intermediate_size": 0}"#;
        let m = ModelSpec::from_hf_config(granite, "g", None).unwrap();
        assert_eq!((m.ffn, m.shared_ffn, m.experts), (128, 0, 8));
        // One expert is a dense model (HunYuan's default `num_experts`: 1).
        let one = granite.replace("\"num_local_experts\": 8", "\"num_local_experts\": 1");
        let m = ModelSpec::from_hf_config(&one, "o", None).unwrap();
        assert!(!m.is_moe() && m.experts_per_token == 0);
    }

    /// GLM-4.5's config.json (zai-org/GLM-4.5, as published, trimmed of
    /// the fields the planner does not read): its first 3 of 92 layers
    /// dense (`first_k_dense_replace`), an MLP of `intermediate_size`; the
    /// others 160 experts of `moe_intermediate_size` and a shared one. The
    /// same from Qwen-MoE's `mlp_only_layers` when they are the first, and
    /// from ERNIE 4.5's `moe_layer_start_index`; a config whose every layer
    /// is dense is a dense model.
    #[test]
    fn a_mixture_s_dense_first_layers_are_read() {
        let glm = r#"{"architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
            "first_k_dense_replace": 3, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 5120, "intermediate_size": 12288,
            "max_position_embeddings": 131072, "model_type": "glm4_moe",
            "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 1,
            "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 92,
            "num_key_value_heads": 8, "tie_word_embeddings": false, "vocab_size": 151552}"#;
        let m = ModelSpec::from_hf_config(glm, "glm-4.5", None).unwrap();
        assert_eq!((m.dense_layers, m.dense_ffn), (3, 12288));
        assert_eq!((m.experts, m.experts_per_token, m.ffn), (160, 8, 1536));
        assert_eq!((m.shared_ffn, m.head_dim, m.layers), (1536, 128, 92));
        let qwen = r#"{"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 256,
            "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
            "vocab_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
            "decoder_sparse_step": 1, "mlp_only_layers": [1, 0]}"#;
        let m = ModelSpec::from_hf_config(qwen, "q", None).unwrap();
        assert_eq!((m.dense_layers, m.dense_ffn, m.ffn), (2, 256, 32));
        let ernie = r#"{"model_type": "ernie4_5_moe", "hidden_size": 64,
            "intermediate_size": 256, "moe_intermediate_size": 32, "num_hidden_layers": 4,
            "num_attention_heads": 4, "vocab_size": 256, "moe_num_experts": 8, "moe_k": 2,
            "moe_layer_start_index": 1, "moe_layer_end_index": 3, "moe_layer_interval": 1}"#;
        let m = ModelSpec::from_hf_config(ernie, "e", None).unwrap();
        assert_eq!((m.dense_layers, m.dense_ffn, m.experts), (1, 256, 8));
        // LFM2-MoE's and AFMoE's `num_dense_layers`: the first ones.
        let lfm = r#"{"model_type": "lfm2_moe", "hidden_size": 64, "intermediate_size": 256,
            "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
            "vocab_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
            "num_dense_layers": 2, "hidden_act": "silu"}"#;
        let m = ModelSpec::from_hf_config(lfm, "l", None).unwrap();
        assert_eq!((m.dense_layers, m.dense_ffn, m.experts), (2, 256, 8));
        // DeepSeek-V3.2's sparse attention over indexed keys: noted.
        let sparse = lfm.replace(
            "\"num_dense_layers\": 2,",
            "\"index_topk\": 2048, \"layer_types\": [\"indexed_attention\", \
             \"indexed_attention\", \"full_attention\", \"indexed_attention\"],",
        );
        ModelSpec::from_hf_config(&sparse, "s", None).unwrap();
        let notes = hf_notes(&sparse);
        assert!(
            notes.iter().any(|n| n.contains(
                "gives 3 layers sparse attention over indexed keys of 2048 keys a query"
            )),
            "{notes:?}"
        );
        let dense = qwen.replace("[1, 0]", "[0, 1, 2, 3]");
        let m = ModelSpec::from_hf_config(&dense, "d", None).unwrap();
        assert!(!m.is_moe());
        assert_eq!((m.ffn, m.dense_layers, m.dense_ffn), (256, 0, 0));
        // A kind a layer (GLM-4.7-Flash's, MiMo-V2-Flash's, Step 3.5's
        // `mlp_layer_types`), with Step's shared expert width
        // (`share_expert_dim`), and Llama 4's expert layers by index.
        let step = r#"{"model_type": "step3p5", "hidden_size": 64, "intermediate_size": 256,
            "moe_intermediate_size": 32, "share_expert_dim": 48, "num_hidden_layers": 4,
            "num_attention_heads": 4, "vocab_size": 256, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "hidden_act": "silu",
            "mlp_layer_types": ["dense", "dense", "sparse", "sparse"]}"#;
        let m = ModelSpec::from_hf_config(step, "s", None).unwrap();
        assert_eq!(
            (m.dense_layers, m.dense_ffn, m.ffn, m.shared_ffn),
            (2, 256, 32, 48)
        );
        let llama4 = r#"{"model_type": "llama4_text", "hidden_size": 64,
            "intermediate_size": 32, "intermediate_size_mlp": 256, "num_hidden_layers": 4,
            "num_attention_heads": 4, "vocab_size": 256, "num_local_experts": 8,
            "num_experts_per_tok": 1, "moe_layers": [3, 1, 2]}"#;
        let m = ModelSpec::from_hf_config(llama4, "l4", None).unwrap();
        assert_eq!(
            (m.dense_layers, m.dense_ffn, m.ffn, m.experts),
            (1, 256, 32, 8)
        );
        let dots = r#"{"model_type": "dots3", "hidden_size": 64, "intermediate_size": 256,
            "moe_intermediate_size": 32, "shared_experts_intermediate_size": 40,
            "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu"}"#;
        let m = ModelSpec::from_hf_config(dots, "d", None).unwrap();
        assert_eq!((m.dense_layers, m.shared_ffn), (0, 40));
        // Dense layers between expert ones: Llama 4 Maverick's every other
        // (`interleave_moe_layer_step`, and its `moe_layers` saying the
        // same), Qwen-MoE's `mlp_only_layers` of every other, a kind a
        // layer, DeepSeek's `moe_layer_freq` after its dense first ones; a
        // single expert layer.
        let pattern = |text: &str| {
            let m = ModelSpec::from_hf_config(text, "p", None).unwrap();
            m.validate().unwrap();
            (
                m.dense_layers,
                m.moe_layer_step,
                m.moe_layer_offset,
                m.dense_ffn,
            )
        };
        let maverick = llama4.replace(
            "\"moe_layers\": [3, 1, 2]",
            "\"interleave_moe_layer_step\": 2",
        );
        assert_eq!(pattern(&maverick), (1, 2, 1, 256));
        let both = maverick.replace(
            "\"interleave_moe_layer_step\": 2",
            "\"interleave_moe_layer_step\": 2, \"moe_layers\": [1, 3]",
        );
        assert_eq!(pattern(&both), (1, 2, 1, 256));
        let every_other = qwen.replace("[1, 0]", "[0, 2]");
        assert_eq!(pattern(&every_other), (1, 2, 1, 256));
        let kinds = step.replace(
            "[\"dense\", \"dense\", \"sparse\", \"sparse\"]",
            "[\"sparse\", \"dense\", \"sparse\", \"dense\"]",
        );
        assert_eq!(pattern(&kinds), (0, 2, 0, 256));
        let freq = glm.replace(
            "\"first_k_dense_replace\": 3,",
            "\"first_k_dense_replace\": 3, \"moe_layer_freq\": 2,",
        );
        let m = ModelSpec::from_hf_config(&freq, "f", None).unwrap();
        assert_eq!(
            (m.dense_layers, m.moe_layer_step, m.moe_layer_offset),
            (4, 2, 0)
        );
        assert_eq!(m.expert_layers_before(92), 44);
        let single = qwen.replace("[1, 0]", "[0, 1, 3]");
        assert_eq!(pattern(&single), (2, 4, 2, 256));
        // Every layer dense by its kinds: a dense model.
        let all = step.replace("\"sparse\", \"sparse\"", "\"dense\", \"dense\"");
        assert!(!ModelSpec::from_hf_config(&all, "a", None).unwrap().is_moe());
    }

    /// DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3, as published,
    /// trimmed of the fields the planner does not read): latent attention
    /// (queries through a latent of 1536, keys and values through one of
    /// 512, heads of 128 + 64 rotary, values of 128), its first 3 of 61
    /// layers dense. Its `head_dim`, where a config gives one, is the
    /// rotary part (transformers'), not the heads' width.
    #[test]
    fn a_latent_attention_config_is_read() {
        let text = r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61,
            "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
            "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
            "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "head_dim": 64, "vocab_size": 129280, "tie_word_embeddings": false,
            "max_position_embeddings": 163840, "num_nextn_predict_layers": 1}"#;
        let m = ModelSpec::from_hf_config(text, "deepseek-v3", None).unwrap();
        assert_eq!(
            (m.kv_lora_rank, m.q_lora_rank, m.rope_head_dim),
            (512, 1536, 64)
        );
        assert_eq!((m.head_dim(), m.v_head_dim(), m.kv_heads), (192, 128, 128));
        assert_eq!((m.dense_layers, m.dense_ffn, m.experts), (3, 18432, 256));
        assert_eq!((m.ffn, m.shared_ffn, m.experts_per_token), (2048, 2048, 8));
        // DeepSeek-V2-Lite's queries come straight from the hidden state.
        let lite = text.replace("\"q_lora_rank\": 1536", "\"q_lora_rank\": null");
        let m = ModelSpec::from_hf_config(&lite, "lite", None).unwrap();
        assert_eq!(m.q_lora_rank, 0);
        // Its multi-token-prediction layer is noted, not planned.
        let notes = hf_notes(text);
        assert!(
            notes.iter().any(|n| n.contains("num_nextn_predict_layers")),
            "{notes:?}"
        );
    }

    /// A multimodal config's language model; mixtures of experts the
    /// planner cannot describe (no top-k, dense layers among the expert
    /// ones, sizes in a section), latent and linear attention, refused;
    /// and every missing or malformed size named.
    #[test]
    fn configs_the_planner_cannot_take_are_refused_by_field() {
        let vlm = r#"{"model_type": "llava", "text_config": {"model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_hidden_layers": 32, "vocab_size": 32064}}"#;
        let m = ModelSpec::from_hf_config(vlm, "llava", None).unwrap();
        assert_eq!((m.hidden, m.vocab), (4096, 32064));
        let refusals = [
            (
                r#"{"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "num_local_experts": 8}"#,
                "gives 8 experts but not how many a token runs",
            ),
            (
                r#"{"model_type": "ernie4_5_moe", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256,
                    "moe_num_experts": 8, "moe_k": 2, "moe_layer_start_index": 1,
                    "moe_layer_end_index": 2}"#,
                "`moe_layer_start_index`, `moe_layer_end_index` make layers 1, 2 of 4 expert \
                 ones (layer 3 dense): a mixture of experts whose expert layers follow no pattern",
            ),
            (
                r#"{"model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 4,
                    "num_attention_heads": 4, "vocab_size": 256, "n_routed_experts": 8,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "first_k_dense_replace": 1}"#,
                "says its first 1 layers are dense but gives no width for its dense layers' MLP",
            ),
            (
                r#"{"model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256,
                    "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "first_k_dense_replace": "all"}"#,
                "`first_k_dense_replace` = \"all\", not a layer count or index",
            ),
            (
                r#"{"model_type": "x", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "n_experts": 8}"#,
                "`n_experts` = 8: a mixture of experts whose routed experts the reader does \
                 not find",
            ),
            (
                r#"{"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}"#,
                "none of `qk_rope_head_dim`",
            ),
            (
                r#"{"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 2000000}"#,
                "v_head_dim is 2000000, more than the planner accepts",
            ),
            (
                r#"{"model_type": "longcat_flash", "hidden_size": 64, "zero_expert_num": 4}"#,
                "`zero_expert_num` = 4: zero-computation experts",
            ),
            (
                r#"{"model_type": "deepseek_v4", "hidden_size": 64, "hc_mult": 4}"#,
                "`hc_mult` = 4: hyper-connections",
            ),
            (
                r#"{"model_type": "ernie4_5_vl_moe", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": [32, 16]}"#,
                "`moe_intermediate_size` = [32,16]: a size for each of several parts (each \
                 modality",
            ),
            (
                r#"{"model_type": "inkling", "hidden_size": 64,
                    "layer_types": ["hybrid_sliding", "hybrid"]}"#,
                "holds \"hybrid_sliding\" layers",
            ),
            (
                r#"{"model_type": "x", "hidden_size": 64, "layer_types": ["full_attention", 7]}"#,
                "holds \"7\" layers",
            ),
            (
                r#"{"model_type": "qwen3_next", "hidden_size": 64,
                    "layer_types": ["linear_attention", "full_attention"]}"#,
                "holds \"linear_attention\" layers",
            ),
            (
                r#"{"model_type": "step3p5", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 256,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "mlp_layer_types":
                    ["dense", "sparse", "sparse", "dense", "sparse", "dense"]}"#,
                "`mlp_layer_types` make layers 1, 2, 4 of 6 expert ones (layer 3 dense)",
            ),
            (
                r#"{"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256,
                    "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 0}"#,
                "`decoder_sparse_step` = 0, not a positive step",
            ),
            (
                r#"{"model_type": "step3p5", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256,
                    "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "mlp_layer_types": ["dense", "sparse"]}"#,
                "`mlp_layer_types` lists 2 layers of its 4",
            ),
            (
                r#"{"model_type": "step3p5", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "mlp_layer_types": ["dense", "mamba"]}"#,
                "not a list of \"dense\" and \"sparse\" a layer",
            ),
            (
                r#"{"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256,
                    "num_local_experts": 8, "num_experts_per_tok": 1, "moe_layers": [3, 4]}"#,
                "`moe_layers` names layer 4 of its 4",
            ),
            // Mamba hybrids: in parallel in each layer (Falcon-H1), as
            // layers of their own (Bamba, Zamba's `layers_block_type`,
            // Nemotron-H's pattern), and state-space models; other
            // recurrent layers (RecurrentGemma's, xLSTM's, HRM's cycles),
            // MiniMax-01's lightning attention and Reformer's hashed one.
            (
                r#"{"model_type": "falcon_h1", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                    "mamba_d_state": 16, "mamba_expand": 2}"#,
                "has `mamba_d_state`: state-space (Mamba) mixers in its layers",
            ),
            (
                r#"{"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2,
                    "vocab_size": 256, "state_size": 16, "use_mamba_kernels": false}"#,
                "has `state_size`: state-space (Mamba) mixers",
            ),
            (
                r#"{"model_type": "zamba", "hidden_size": 64, "layers_block_type":
                    ["mamba", "hybrid"]}"#,
                "`layers_block_type` holds \"mamba\" layers",
            ),
            (
                r#"{"model_type": "nemotron_h", "hidden_size": 64,
                    "hybrid_override_pattern": "M-M*-"}"#,
                "`hybrid_override_pattern` = \"M-M*-\": layers of state-space mixers (M)",
            ),
            (
                r#"{"model_type": "recurrent_gemma", "hidden_size": 64,
                    "block_types": ["recurrent", "recurrent", "attention"]}"#,
                "`block_types` holds \"recurrent\" layers",
            ),
            (
                r#"{"model_type": "xlstm", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_heads": 4, "vocab_size": 256}"#,
                "`model_type` \"xlstm\" is a recurrent model without attention layers",
            ),
            (
                r#"{"model_type": "hrm_text", "hidden_size": 64, "H_cycles": 2, "L_cycles": 3}"#,
                "`H_cycles` = 2: layers run several times a token",
            ),
            (
                r#"{"model_type": "minimax", "hidden_size": 64, "attn_type_list": [0, 0, 1]}"#,
                "`attn_type_list` gives layers linear (lightning) attention",
            ),
            (
                r#"{"model_type": "reformer", "hidden_size": 64,
                    "attn_layers": ["local", "lsh"]}"#,
                "`attn_layers` holds \"lsh\" layers",
            ),
            (
                r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                    "num_attention_heads": 4, "vocab_size": 256}"#,
                "none of `num_hidden_layers`, `n_layer`",
            ),
            (
                r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "vocab_size": 256}"#,
                "no feed-forward width",
            ),
            (
                r#"{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": -64}"#,
                "`hidden_size` = -64, not a positive integer",
            ),
            (
                r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 5, "num_key_value_heads": 2,
                    "vocab_size": 256}"#,
                "kv_heads 2 does not divide heads 5",
            ),
            (
                r#"{"d_model": 2048, "n_heads": 16, "n_layers": 24, "vocab_size": 100352,
                    "ffn_config": {"ffn_hidden_size": 3584, "moe_num_experts": 4}}"#,
                "`ffn_config.moe_num_experts` = 4: a mixture of experts",
            ),
            (
                r#"{"model_type": "t5", "d_model": 512, "num_layers": 6, "num_heads": 8,
                    "d_ff": 2048, "vocab_size": 32128, "is_encoder_decoder": true}"#,
                "encoder-decoder",
            ),
            (
                r#"{"model_type": "gpt2", "n_layer": 2, "n_embd": 18446744073709551615,
                    "n_head": 1, "vocab_size": 256}"#,
                "more than the planner accepts",
            ),
            ("[1, 2]", "not a JSON object"),
            ("{", "not valid JSON"),
        ];
        for (text, says) in refusals {
            let e = ModelSpec::from_hf_config(text, "m", None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
