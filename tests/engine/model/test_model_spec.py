"""Parsing config.json into a ModelSpec: both transformers layouts, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loraplex.engine.model.spec import ModelSpec
from loraplex.errors import UserError

QWEN3_V4 = {  # the layout of Qwen/Qwen3-0.6B's config.json (transformers 4.x)
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "rope_scaling": None, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "attention_bias": False, "use_sliding_window": False, "torch_dtype": "bfloat16",
}
LLAMA_V4 = {  # Llama-3.2-1B style
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "max_position_embeddings": 131072, "vocab_size": 128256,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "mlp_bias": False, "attention_bias": False,
}


def test_qwen3_v4_layout() -> None:
    spec = ModelSpec.from_config(QWEN3_V4)
    assert spec.arch == "qwen3" and spec.has_qk_norm and spec.tie_word_embeddings
    assert spec.head_dim == 128 and spec.num_groups == 2
    assert spec.rope.kind == "default" and spec.rope.theta == 1e6
    assert spec.eos_token_ids == (151645,) and spec.bos_token_id == 151643
    # Published size of Qwen3-0.6B: 0.6B total, 0.44B non-embedding.
    assert 0.59e9 < spec.num_params() < 0.61e9
    assert 0.43e9 < spec.num_params() - spec.vocab_size * spec.hidden_size < 0.45e9


def test_llama_v4_layout_with_llama3_rope_and_head_dim_derived() -> None:
    spec = ModelSpec.from_config(LLAMA_V4, generation_config={"eos_token_id": [128001, 128009]})
    assert spec.arch == "llama" and not spec.has_qk_norm
    assert spec.head_dim == 64
    assert spec.rope.kind == "llama3" and spec.rope.factor == 32.0
    assert spec.rope.original_max_position == 8192
    assert spec.eos_token_ids == (128001, 128009, 128008)
    assert 1.23e9 < spec.num_params() < 1.24e9  # Llama-3.2-1B: 1.236B


def test_v5_rope_parameters_layout(tmp_path: Path) -> None:
    config = dict(QWEN3_V4)
    del config["rope_theta"], config["rope_scaling"]
    config["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    spec = ModelSpec.from_dir(tmp_path)
    assert spec.rope.theta == 5e5 and spec.eos_token_ids == (1, 2, 151645)


def test_model_info_caps_context() -> None:
    info = ModelSpec.from_config(QWEN3_V4).model_info(max_context=4096)
    assert info.max_context == 4096 and info.vocab_size == 151936
    card = info.card  # the cost model's card of this config: matmul params = blocks + head
    assert (card.num_layers, card.num_kv_heads, card.tie_word_embeddings) == (
        QWEN3_V4["num_hidden_layers"], QWEN3_V4["num_key_value_heads"],
        QWEN3_V4["tie_word_embeddings"])
    spec = ModelSpec.from_config(QWEN3_V4)
    norms = 2 * spec.hidden_size + 2 * spec.head_dim
    assert card.matmul_params == spec.num_layers * (spec.layer_params() - norms) + (
        spec.vocab_size * spec.hidden_size)


@pytest.mark.parametrize(("change", "field"), [
    ({"architectures": ["MistralForCausalLM"]}, "config.architectures"),
    ({"architectures": None, "model_type": "gpt2"}, "config.model_type"),
    ({"hidden_act": "gelu"}, "config.hidden_act"),
    ({"attention_bias": True}, "config.attention_bias"),
    ({"use_sliding_window": True}, "config.use_sliding_window"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
     "config.rope_parameters.rope_type"),
    ({"num_key_value_heads": 5}, "config.num_key_value_heads"),
])
def test_unsupported_configs_are_refused_naming_the_key(change: dict[str, Any],
                                                        field: str) -> None:
    with pytest.raises(UserError) as err:
        ModelSpec.from_config({**QWEN3_V4, **change})
    assert err.value.field == field


def test_missing_config_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"config\.json"):
        ModelSpec.from_dir(tmp_path)
