"""LoRA on routed experts as Tinker parameterises it, counted against tinker-cookbook 0.6.1.

The cookbook's ``hyperparam_utils.get_lora_param_count`` (run in its own venv, as its users
would) is Tinker's count of trainable adapter parameters per base model; ours, for the served
architectures Qwen3-30B-A3B and Qwen3-235B-A22B (config.json numbers, no weights needed), must
be the same for every rank and every target choice. The cost model's card counts the same, and
the router is never adapted.
"""

from __future__ import annotations

import json
import math
import subprocess
from itertools import product
from typing import Any

import pytest
import torch

from loraplex.cost.cards.models import MODEL_CARDS
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.targets import target_shape, targets_of
from loraplex.engine.model.spec import ModelSpec
from tests.integration.venvs import ensure_venv

#: The public config.json numbers of the two Qwen3-MoE models Tinker serves.
QWEN3_MOE: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-30B-A3B": dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32,
                               num_key_value_heads=4, intermediate_size=6144,
                               moe_intermediate_size=768),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": dict(
        num_hidden_layers=94, hidden_size=4096, num_attention_heads=64, num_key_value_heads=4,
        intermediate_size=12288, moe_intermediate_size=1536),
}
CHOICES = [c for c in product((True, False), repeat=3) if any(c)]  # (mlp, attn, unembed)
RANKS = (1, 32)
COOKBOOK_WEIGHTS = (("--no-deps", "tinker-cookbook==0.6.1"),)
COUNT_SCRIPT = """
import json, sys
from tinker_cookbook.hyperparam_utils import get_lora_param_count
names, choices, ranks = json.loads(sys.argv[1])
print(json.dumps({f"{n}|{r}|{m}{a}{u}": get_lora_param_count(n, lora_rank=r, train_mlp=m,
                  train_attn=a, train_unembed=u)
                  for n in names for r in ranks for m, a, u in choices}))
"""


def served_spec(name: str) -> ModelSpec:
    return ModelSpec.from_config({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": 151936, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "max_position_embeddings": 40960, "tie_word_embeddings": False, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "hidden_act": "silu", **QWEN3_MOE[name]})


def our_count(spec: ModelSpec, rank: int, mlp: bool, attn: bool, unembed: bool) -> int:
    config = LoraConfig(rank=rank, train_mlp=mlp, train_attn=attn, train_unembed=unembed)
    return sum(math.prod(shape.a_shape(rank)) + math.prod(shape.b_shape(rank))
               for shape in (target_shape(spec, t) for t in targets_of(config, spec)))


@pytest.fixture(scope="module")
def cookbook_counts() -> dict[str, int]:
    python = ensure_venv("cookbook-weights", COOKBOOK_WEIGHTS,
                         "import tinker_cookbook.weights, tinker_cookbook.hyperparam_utils")
    args = json.dumps([list(QWEN3_MOE), CHOICES, RANKS])
    out = subprocess.run([python, "-c", COUNT_SCRIPT, args], check=True, capture_output=True,
                         text=True, timeout=120)
    counts: dict[str, int] = json.loads(out.stdout)
    return counts


def test_trainable_parameters_equal_the_cookbooks_count(cookbook_counts: dict[str, int]
                                                        ) -> None:
    for name, rank, (mlp, attn, unembed) in product(QWEN3_MOE, RANKS, CHOICES):
        key = f"{name}|{rank}|{mlp}{attn}{unembed}"
        assert our_count(served_spec(name), rank, mlp, attn, unembed) == cookbook_counts[key], key


def test_a_real_adapter_holds_that_many_parameters_and_bytes(cookbook_counts: dict[str, int]
                                                             ) -> None:
    """Allocated, not just counted: the rank-1 adapter of Qwen3-30B-A3B (15.4M fp32 values)."""
    name = "Qwen/Qwen3-30B-A3B"
    adapter = LoraAdapter.create(served_spec(name), LoraConfig(rank=1, seed=0), "cpu")
    expected = cookbook_counts[f"{name}|1|TrueTrueTrue"]
    assert adapter.num_params == expected
    assert adapter.nbytes() == 4 * expected
    w1 = adapter.weights["w1"]
    assert w1.a_L_Rk_I.shape == (48, 1, 1, 2048) and w1.b_L_O_Rk.shape == (48, 128, 768, 1)
    assert adapter.weights["w2"].a_L_Rk_I.shape == (48, 128, 1, 768)
    assert not any("gate" in t and t != "gate_proj" for t in adapter.weights)  # no router


def test_the_cost_card_counts_the_same(cookbook_counts: dict[str, int]) -> None:
    card = MODEL_CARDS["Qwen/Qwen3-30B-A3B"]
    for rank, (mlp, attn, unembed) in product(RANKS, CHOICES):
        assert card.lora_params(rank, mlp=mlp, attn=attn, unembed=unembed) == \
            cookbook_counts[f"Qwen/Qwen3-30B-A3B|{rank}|{mlp}{attn}{unembed}"]


def test_router_stays_frozen(hf_model_factory) -> None:
    from loraplex.engine.lora.bank import AdapterBank
    from loraplex.engine.model.loader import load_model
    from loraplex.engine.model.packed_batch import SequenceInput

    path, _ = hf_model_factory("qwen3_moe", False)
    model = load_model(path)
    bank = AdapterBank(model.spec, "cpu", max_rank=8)
    adapter = bank.create("a", LoraConfig(rank=4, seed=0))
    router = model.weights.layers[0].experts
    assert router is not None and not router.router_E_D.requires_grad
    batch = model.pack([SequenceInput(list(range(30)), "a")])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    model.logits(model.forward(batch, lora), lora).sum().backward()
    assert router.router_E_D.grad is None
    assert all(p.grad is not None for p in adapter.parameters())
    assert torch.count_nonzero(adapter.weights["w2"].b_L_O_Rk.grad) > 0
