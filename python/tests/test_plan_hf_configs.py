"""`polychip plan --model DIR` on the configs transformers itself writes:
every default config of the dense architectures the planner's reader
lists, and of the mixtures of experts, plans on
the three-vendor example cluster (the mixtures with and without expert
parallelism, those whose first layers are dense and those of latent
attention among them; DeepSeek-V3's on an H100 cluster of its size); the
mixtures with dense layers elsewhere among the expert ones, with
zero-computation experts or with a size for each modality, those of
linear attention, hybrid layers or hyper-connections, the hybrids of
attention and state-space or recurrent layers (Bamba, Falcon-H1, Zamba,
RecurrentGemma), the recurrent models (Mamba, xLSTM, HRM's cycles),
Reformer's hashed attention, a config without its top-k and the
encoder-decoder model are refused,
each naming what it cannot take (docs/planner.md, "The model"); and
attention over a window given in another field than `sliding_window`
(GPT-Neo's, ModernBERT's, Longformer's), block-sparse (BigBird's) or
approximated (Nyströmformer, YOSO, MRA) plans with a note."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import PROFILE_DIR

transformers = pytest.importorskip("transformers")

POLYCHIP = str(PROFILE_DIR / "polychip")
CLUSTER = str(Path(__file__).resolve().parents[2] / "examples" / "clusters"
              / "china-mobile-3-vendor.toml")

DENSE = ["LlamaConfig", "MistralConfig", "Qwen2Config", "Qwen3Config", "GemmaConfig",
         "Gemma2Config", "PhiConfig", "Phi3Config", "OlmoConfig", "CohereConfig",
         "StableLmConfig", "Starcoder2Config", "NemotronConfig", "GPT2Config",
         "GPTBigCodeConfig", "GPTNeoConfig", "GPTNeoXConfig", "GPTJConfig", "CodeGenConfig",
         "OPTConfig", "BloomConfig", "FalconConfig", "MptConfig", "BertConfig"]
MOE = ["MixtralConfig", "Qwen2MoeConfig", "Qwen3MoeConfig", "OlmoeConfig", "PhimoeConfig",
       "GraniteMoeConfig", "GptOssConfig", "Llama4TextConfig",
       # Their first layers dense (`first_k_dense_replace`, `moe_layer_start_index`,
       # `num_dense_layers`), and GLM-4.7-Flash's latent attention.
       "Glm4MoeConfig", "Ernie4_5_MoeConfig", "Glm4MoeLiteConfig", "Lfm2MoeConfig",
       "AfmoeConfig",
       # ... by a kind a layer (`mlp_layer_types`).
       "MiMoV2FlashConfig", "Step3p7TextConfig"]
REFUSED = {"DbrxConfig": "`ffn_config.moe_num_experts`", "JambaConfig": "`mamba_d_state`: state-space",
           "LongcatFlashConfig": "`zero_expert_num`", "DeepseekV4Config": "`hc_mult`",
           "InklingTextConfig": "\"hybrid_sliding\" layers",
           "Ernie4_5_VLMoeTextConfig": "`moe_intermediate_size` = [1536,512]: a size for each",
           "DeepseekV2Config": "64 experts but not how many a token runs",
           "Qwen3NextConfig": "linear_attention", "T5Config": "encoder-decoder",
           "MambaConfig": "`state_size`: state-space (Mamba) mixers",
           # Hybrids of attention and state-space or recurrent layers, and
           # other sequence mixers than attention.
           "BambaConfig": "state-space (Mamba) mixers", "FalconH1Config": "`mamba_d_state`",
           "ZambaConfig": "`layers_block_type` holds", "RecurrentGemmaConfig": "`block_types`",
           "xLSTMConfig": "\"xlstm\" is a recurrent model", "ReformerConfig": "\"lsh\" layers",
           "HrmTextConfig": "layers run several times a token"}


def plan(directory, *extra):
    return subprocess.run([POLYCHIP, "plan", "--cluster", CLUSTER, "--model", str(directory),
                           "--global-batch", "64", "--json", *extra],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def written(tmp_path, name):
    directory = tmp_path / name
    directory.mkdir()
    getattr(transformers, name)().to_json_file(str(directory / "config.json"))
    return directory


@pytest.mark.parametrize("name", DENSE)
def test_a_dense_architectures_default_config_plans(tmp_path, name):
    r = plan(written(tmp_path, name))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["plan"]["model"] == name
    assert report["plan"]["step_time_simulated"] > 0


@pytest.mark.parametrize("name", MOE)
def test_a_mixture_of_experts_default_config_plans_with_and_without_expert_parallelism(
        tmp_path, name):
    directory = written(tmp_path, name)
    for ep in (1, 2):
        r = plan(directory, "--expert-parallel", str(ep))
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        # The plan is priced at the degree asked for (1, the default, is
        # left out of the report), in groups of it.
        assert report["settings"].get("expert_parallel", 1) == ep
        assert report["plan"]["dp"] % ep == 0
        assert report["plan"]["tokens_per_s"] > 0


def test_deepseek_v3s_default_config_plans_on_an_h100_cluster(tmp_path):
    """Latent attention and dense first layers at DeepSeek-V3's size (671 B
    parameters): on 1,024 H100s with 8-way expert parallelism, full
    recomputation and the optimizer state sharded (without them no
    pipeline of its 61 layers holds a 1F1B warm-up's activations)."""
    h100 = (Path(__file__).resolve().parents[2] / "planner" / "tests" / "data" / "outside"
            / "megatron-bridge-h100" / "dgx-h100.toml")
    directory = written(tmp_path, "DeepseekV3Config")

    def deepseek(*extra):
        return subprocess.run([POLYCHIP, "plan", "--cluster", str(h100), "--model",
                               str(directory), "--global-batch", "512",
                               "--expert-parallel", "8", "--recompute", "full",
                               "--shard-optimizer", "--json", *extra],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ))
    r = deepseek()
    assert r.returncode == 0, r.stderr
    assert "multi-token-prediction layer" in r.stderr and "--mtp-layers 1" in r.stderr
    report = json.loads(r.stdout)
    assert report["plan"]["tokens_per_s"] > 0 and report["plan"]["dp"] % 8 == 0
    assert report["settings"]["expert_parallel"] == 8
    # Its multi-token-prediction layer, trained as Megatron-LM trains it,
    # runs on the last stage.
    r = deepseek("--mtp-layers", "1")
    assert r.returncode == 0, r.stderr
    stages = json.loads(r.stdout)["plan"]["replicas"][0]["stages"]
    assert stages[-1]["mtp_layers"] == 1
    assert all("mtp_layers" not in s for s in stages[:-1])


@pytest.mark.parametrize("name,fields", [
    ("Llama4TextConfig", {"interleave_moe_layer_step": 2}),   # Llama 4 Maverick's
    ("Qwen2MoeConfig", {"decoder_sparse_step": 2}),
    ("DeepseekV3Config", {"moe_layer_freq": 2}),
])
def test_a_mixture_whose_expert_layers_alternate_with_dense_ones_plans(tmp_path, name, fields):
    """Transformers' own config with its dense layers between its expert
    ones plans, where it was refused before stop 57."""
    directory = tmp_path / name
    directory.mkdir()
    getattr(transformers, name)(**fields).to_json_file(str(directory / "config.json"))
    extra = ("--recompute", "full", "--shard-optimizer") if name.startswith("Deepseek") else ()
    r = plan(directory, "--expert-parallel", "2", *extra)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["step_time_simulated"] > 0


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_config_the_planner_cannot_model_is_refused_by_name(tmp_path, name):
    r = plan(written(tmp_path, name))
    assert r.returncode == 2, r.stdout
    assert "config.json" in r.stderr and REFUSED[name] in r.stderr, r.stderr


@pytest.mark.parametrize("name,note", [
    # GPT-Neo's local layers and the encoders' windows around each token.
    ("GPTNeoConfig", "12 layers' attention a window of 256 tokens (window_size, attention_layers)"),
    ("ModernBertConfig", "a window of 128 tokens around each token (local_attention"),
    ("ModernBertDecoderConfig", "a window of 64 tokens (sliding_window)"),
    ("LongformerConfig", "a window of 512 tokens around each token (attention_window)"),
    # BigBird's block-sparse attention, priced by its mean keys; attention
    # approximated otherwise, priced as full attention.
    ("BigBirdConfig", "by the keys a query attends on the mean"),
    ("NystromformerConfig", "landmarks"),
    ("YosoConfig", "hashing"),
    ("MraConfig", "multi-resolution"),
])
def test_attention_over_a_window_or_approximated_is_priced_or_noted(tmp_path, name, note):
    """Transformers' own configs whose attention is not full plan, the
    window read from the fields each architecture gives it in (until stop
    58 GPT-Neo's, ModernBERT's and Longformer's were priced over the whole
    sequence, only ModernBERT's with a note), and the approximations the
    planner does not price said."""
    r = plan(written(tmp_path, name))
    assert r.returncode == 0, r.stderr
    assert note in r.stderr, r.stderr
    assert json.loads(r.stdout)["plan"]["step_time_simulated"] > 0
