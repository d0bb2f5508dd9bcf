"""`polychip plan --model DIR` on the configs transformers itself writes:
every default config of the dense architectures the planner's reader
lists plans on the three-vendor example cluster, and the mixtures of
experts, the encoder-decoder and the attention-free model are refused,
each naming what it cannot take (docs/planner.md, "The model")."""

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
REFUSED = {"MixtralConfig": "a mixture of experts", "Qwen2MoeConfig": "a mixture of experts",
           "DbrxConfig": "`ffn_config.moe_num_experts`", "JambaConfig": "a mixture of experts",
           "T5Config": "encoder-decoder", "MambaConfig": "`num_attention_heads`"}


def plan(directory):
    return subprocess.run([POLYCHIP, "plan", "--cluster", CLUSTER, "--model", str(directory),
                           "--global-batch", "64", "--json"],
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


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_config_the_planner_cannot_model_is_refused_by_name(tmp_path, name):
    r = plan(written(tmp_path, name))
    assert r.returncode == 2, r.stdout
    assert "config.json" in r.stderr and REFUSED[name] in r.stderr, r.stderr
