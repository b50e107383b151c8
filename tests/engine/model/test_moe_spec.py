"""Parsing a ``qwen3_moe`` config.json: experts, sparse layers, and refusals that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.engine.model.spec import ModelSpec
from loraplex.errors import UserError

QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
    "rope_theta": 1e6, "tie_word_embeddings": False, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": []}


def parse(**change: Any) -> ModelSpec:
    return ModelSpec.from_config({**QWEN3_MOE, **change})


def test_experts_and_sparse_layers_as_transformers_places_them() -> None:
    spec = parse()
    assert spec.arch == "qwen3_moe" and spec.has_qk_norm
    assert spec.experts is not None and spec.experts.sparse_layers == (0, 1, 2, 3, 4, 5)
    assert (spec.experts.num_experts, spec.experts.top_k) == (8, 2)
    # Qwen3MoeDecoderLayer: sparse iff not in mlp_only_layers and (i + 1) % step == 0.
    stepped = parse(decoder_sparse_step=2, mlp_only_layers=[3])
    assert stepped.experts is not None and stepped.experts.sparse_layers == (1, 5)
    assert stepped.dense_mlp_layers == (0, 2, 3, 4)
    assert parse(num_experts=None, num_local_experts=4).experts.num_experts == 4  # type: ignore[union-attr]
    assert parse(norm_topk_prob=False).experts.norm_topk_prob is False  # type: ignore[union-attr]


@pytest.mark.parametrize(("change", "key"), [
    ({"num_experts": 0}, "config.num_experts"),
    ({"num_experts_per_tok": 9}, "config.num_experts_per_tok"),
    ({"moe_intermediate_size": None}, "config.moe_intermediate_size"),
    ({"decoder_sparse_step": -1}, "config.decoder_sparse_step"),
    ({"shared_expert_intermediate_size": 64}, "config.shared_expert_intermediate_size"),
    ({"use_sliding_window": True}, "config.use_sliding_window"),
])
def test_bad_expert_configs_are_refused_naming_the_key(change: dict[str, Any], key: str) -> None:
    with pytest.raises(UserError) as info:
        parse(**change)
    assert info.value.field == key
