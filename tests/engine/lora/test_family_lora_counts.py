"""Trainable LoRA parameters of the new families, counted against tinker-cookbook 0.6.1.

``hyperparam_utils.get_lora_param_count`` (run in its own venv, as its users would) is Tinker's
count per base model; ours, from the public config.json numbers of Qwen3.5-4B, -27B, -35B-A3B,
-397B-A17B, gpt-oss-20b, -120b and Qwen3-VL-30B-A3B-Instruct (no weights needed), must equal it for
ranks 1 and 32 and every target choice. What it pins down: a linear-attention layer adapts
``in_proj_q``, ``in_proj_k``, ``in_proj_v`` (three adapters on the slices of ``in_proj_qkv``),
``in_proj_z`` and ``out_proj``, never ``in_proj_b``/``in_proj_a``; a gated query projection is
adapted at its full (query + gate) width; a shared expert like a dense MLP, its gate never;
gpt-oss's sinks and router never; a vision tower never (Tinker adapts the language model only).
"""

from __future__ import annotations

import json
import math
import subprocess
from itertools import product
from typing import Any

import pytest

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.targets import target_shape, targets_of
from loraplex.engine.model.spec import ModelSpec
from tests.engine.lora.test_expert_lora import CHOICES, COOKBOOK_WEIGHTS, COUNT_SCRIPT, RANKS
from tests.integration.venvs import ensure_venv

_QWEN3_5: dict[str, Any] = dict(model_type="qwen3_5_text", vocab_size=248320, head_dim=256,
                                rms_norm_eps=1e-6, max_position_embeddings=262144,
                                linear_conv_kernel_dim=4, linear_key_head_dim=128,
                                linear_value_head_dim=128, linear_num_key_heads=16,
                                full_attention_interval=4, hidden_act="silu",
                                rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                 "partial_rotary_factor": 0.25})
#: The public config.json numbers (text_config) of the models Tinker serves.
CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3.5-4B": {**_QWEN3_5, "num_hidden_layers": 32, "hidden_size": 2560,
                        "num_attention_heads": 16, "num_key_value_heads": 4,
                        "intermediate_size": 9216, "linear_num_value_heads": 32,
                        "tie_word_embeddings": True},
    "Qwen/Qwen3.5-27B": {**_QWEN3_5, "num_hidden_layers": 64, "hidden_size": 5120,
                         "num_attention_heads": 24, "num_key_value_heads": 4,
                         "intermediate_size": 17408, "linear_num_value_heads": 48},
    "Qwen/Qwen3.5-35B-A3B": {**_QWEN3_5, "model_type": "qwen3_5_moe_text",
                             "num_hidden_layers": 40, "hidden_size": 2048,
                             "num_attention_heads": 16, "num_key_value_heads": 2,
                             "linear_num_value_heads": 32, "num_experts": 256,
                             "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                             "shared_expert_intermediate_size": 512},
    "Qwen/Qwen3.5-397B-A17B": {**_QWEN3_5, "model_type": "qwen3_5_moe_text",
                               "num_hidden_layers": 60, "hidden_size": 4096,
                               "num_attention_heads": 32, "num_key_value_heads": 2,
                               "linear_num_value_heads": 64, "num_experts": 512,
                               "num_experts_per_tok": 10, "moe_intermediate_size": 1024,
                               "shared_expert_intermediate_size": 1024},
    "openai/gpt-oss-20b": {"model_type": "gpt_oss", "num_hidden_layers": 24,
                           "hidden_size": 2880, "intermediate_size": 2880,
                           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                           "num_local_experts": 32, "num_experts_per_tok": 4,
                           "vocab_size": 201088, "sliding_window": 128,
                           "layer_types": ["sliding_attention", "full_attention"] * 12,
                           "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0,
                                               "factor": 32.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "truncate": False,
                                               "original_max_position_embeddings": 4096},
                           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                           "attention_bias": True},
}
#: Qwen3-VL-30B-A3B-Instruct's config.json layout: the text model under ``text_config``, the
#: vision tower (frozen, never adapted) under ``vision_config``.
CONFIGS["Qwen/Qwen3-VL-30B-A3B-Instruct"] = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    "image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {"model_type": "qwen3_vl_moe_text", "vocab_size": 151936,
                    "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                    "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu",
                    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                        "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": True}},
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "out_hidden_size": 2048,
                      "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]}}
CONFIGS["openai/gpt-oss-120b"] = {**CONFIGS["openai/gpt-oss-20b"], "num_hidden_layers": 36,
                                  "num_local_experts": 128,
                                  "layer_types": ["sliding_attention", "full_attention"] * 18}


def served_spec(name: str) -> ModelSpec:
    return ModelSpec.from_config(CONFIGS[name])


def our_count(spec: ModelSpec, rank: int, mlp: bool, attn: bool, unembed: bool) -> int:
    config = LoraConfig(rank=rank, train_mlp=mlp, train_attn=attn, train_unembed=unembed)
    return sum(math.prod(shape.a_shape(rank)) + math.prod(shape.b_shape(rank))
               for shape in (target_shape(spec, t) for t in targets_of(config, spec)))


@pytest.fixture(scope="module")
def cookbook_counts() -> dict[str, int]:
    python = ensure_venv("cookbook-weights", COOKBOOK_WEIGHTS,
                         "import tinker_cookbook.weights, tinker_cookbook.hyperparam_utils")
    args = json.dumps([list(CONFIGS), CHOICES, RANKS])
    out = subprocess.run([python, "-c", COUNT_SCRIPT, args], check=True, capture_output=True,
                         text=True, timeout=120)
    counts: dict[str, int] = json.loads(out.stdout)
    return counts


def test_the_configs_are_the_families_they_name() -> None:
    assert {served_spec(n).arch for n in CONFIGS} == {"qwen3_5", "qwen3_5_moe", "gpt_oss",
                                                      "qwen3_vl_moe"}
    spec = served_spec("Qwen/Qwen3.5-27B")
    assert len(spec.linear_layers) == 48 and len(spec.attention_layers) == 16


@pytest.mark.parametrize("name", list(CONFIGS))
def test_trainable_parameters_equal_the_cookbooks_count(cookbook_counts: dict[str, int],
                                                        name: str) -> None:
    spec = served_spec(name)
    for rank, (mlp, attn, unembed) in product(RANKS, CHOICES):
        key = f"{name}|{rank}|{mlp}{attn}{unembed}"
        assert our_count(spec, rank, mlp, attn, unembed) == cookbook_counts[key], key


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_cost_card_counts_the_same(cookbook_counts: dict[str, int], name: str) -> None:
    from loraplex.cost.cards.models import MODEL_CARDS

    card = MODEL_CARDS[name]
    for rank, (mlp, attn, unembed) in product(RANKS, CHOICES):
        assert card.lora_params(rank, mlp=mlp, attn=attn, unembed=unembed) == \
            cookbook_counts[f"{name}|{rank}|{mlp}{attn}{unembed}"]


def test_a_real_qwen3_5_adapter_holds_that_many_parameters(cookbook_counts: dict[str, int]
                                                            ) -> None:
    """Allocated, not just counted: Qwen3.5-4B at rank 1 (2.28M values)."""
    name = "Qwen/Qwen3.5-4B"
    adapter = LoraAdapter.create(served_spec(name), LoraConfig(rank=1, seed=0), "cpu")
    assert adapter.num_params == cookbook_counts[f"{name}|1|TrueTrueTrue"]
    assert adapter.weights["in_proj_q"].a_L_Rk_I.shape == (24, 1, 2560)
    assert adapter.weights["q_proj"].b_L_O_Rk.shape == (8, 16 * 256 * 2, 1)  # query + gate
    assert "in_proj_b" not in adapter.weights and "in_proj_a" not in adapter.weights
