"""A Qwen3-MoE adapter's PEFT export, and tinker-cookbook 0.6.1's merge of it.

The export carries Tinker's 3-D expert tensors (``mlp.experts.w1/w3`` with a shared ``A``
``(1, r, d)`` and per-expert ``B`` ``(E, f, r)``, ``w2`` the other way round) beside the usual
2-D keys of attention, the dense-only layer's MLP and the head. The cookbook's
``weights.build_hf_model`` (run in its own venv, as its users would) merges it into a model that
transformers loads, whose every adapted expert weight equals ``base + (alpha/r)·B·A`` with the
shared factor broadcast, whose router is untouched, and whose logits equal ours. (That is the
default shard-by-shard merge, which keeps the fp32 dtype on disk; the cookbook's
``merge_strategy="full"`` writes wrong ``gate_up_proj`` values for this model with transformers
5.24, while its ``down_proj`` and every 2-D weight are right.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.executor import Engine
from loraplex.engine.peft_export import PEFT_CONFIG, PEFT_WEIGHTS
from tests.engine.lora.test_expert_lora import COOKBOOK_WEIGHTS
from tests.engine.test_peft_export import export, our_logits
from tests.integration.venvs import ensure_venv

LOGIT_TOL = 1e-4
RANK, ALPHA = 4, 8.0
LAYERS = dict(num_hidden_layers=3, mlp_only_layers=[1])  # layers 0 and 2 sparse, 1 dense
PREFIX = "base_model.model.model.layers"
MERGE = """
import sys
from tinker_cookbook import weights
weights.build_hf_model(base_model=sys.argv[1], adapter_path=sys.argv[2], output_path=sys.argv[3])
"""


def test_export_has_tinkers_3d_expert_tensors(hf_model_factory, tmp_path: Path) -> None:
    path, _ = hf_model_factory("qwen3_moe", False, **LAYERS)
    engine = Engine(str(path), EngineConfig())
    export(engine, LoraConfig(rank=RANK, alpha=ALPHA), tmp_path / "ckpt")
    tensors = load_file(tmp_path / "ckpt" / PEFT_WEIGHTS)
    config = json.loads((tmp_path / "ckpt" / PEFT_CONFIG).read_text())
    assert {"w1", "w2", "w3", "gate_proj", "q_proj", "lm_head"} <= set(config["target_modules"])
    d, f, e = 64, 32, 8
    for layer in (0, 2):
        experts = f"{PREFIX}.{layer}.mlp.experts"
        for w in ("w1", "w3"):
            assert tensors[f"{experts}.{w}.lora_A.weight"].shape == (1, RANK, d)
            assert tensors[f"{experts}.{w}.lora_B.weight"].shape == (e, f, RANK)
        assert tensors[f"{experts}.w2.lora_A.weight"].shape == (e, RANK, f)
        assert tensors[f"{experts}.w2.lora_B.weight"].shape == (1, d, RANK)
        assert f"{PREFIX}.{layer}.mlp.gate_proj.lora_A.weight" not in tensors
    assert tensors[f"{PREFIX}.1.mlp.gate_proj.lora_A.weight"].shape == (RANK, d)
    assert not any(".mlp.gate." in k for k in tensors)  # the router is not adapted
    # 3 layers × 4 attention + 2 sparse × 3 experts + 1 dense × 3 MLP, + head; A and B each.
    assert len(tensors) == 2 * (12 + 6 + 3 + 1)


def test_cookbook_merge_equals_base_plus_scaled_product(hf_model_factory, tmp_path: Path
                                                        ) -> None:
    from transformers import AutoModelForCausalLM

    path, hf_model = hf_model_factory("qwen3_moe", False, **LAYERS)
    engine = Engine(str(path), EngineConfig(batch_invariant=False))
    export(engine, LoraConfig(rank=RANK, alpha=ALPHA), tmp_path / "ckpt")
    python = ensure_venv("cookbook-weights", COOKBOOK_WEIGHTS, "import tinker_cookbook.weights")
    subprocess.run([python, "-c", MERGE, str(path), str(tmp_path / "ckpt"),
                    str(tmp_path / "merged")], check=True, capture_output=True, timeout=300)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    after = dict(merged.named_parameters())
    before = dict(hf_model.named_parameters())
    adapter = load_file(tmp_path / "ckpt" / PEFT_WEIGHTS)
    s = ALPHA / RANK

    def delta(layer: int, w: str) -> torch.Tensor:
        key = f"{PREFIX}.{layer}.mlp.experts.{w}"
        return s * adapter[f"{key}.lora_B.weight"] @ adapter[f"{key}.lora_A.weight"]

    with torch.no_grad():
        for layer in (0, 2):
            name = f"model.layers.{layer}.mlp.experts"
            gate_up = before[f"{name}.gate_up_proj"] + torch.cat([delta(layer, "w1"),
                                                                  delta(layer, "w3")], dim=1)
            torch.testing.assert_close(after[f"{name}.gate_up_proj"], gate_up,
                                       rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(after[f"{name}.down_proj"],
                                       before[f"{name}.down_proj"] + delta(layer, "w2"),
                                       rtol=1e-6, atol=1e-6)
            router = f"model.layers.{layer}.mlp.gate.weight"
            assert torch.equal(after[router], before[router])
        tokens = torch.randint(0, 320, (29,), generator=torch.Generator().manual_seed(0))
        theirs = merged(tokens[None]).logits[0]
        base = hf_model(tokens[None]).logits[0]
    ours = our_logits(engine, tokens)
    assert (ours - base).abs().max() > 100 * LOGIT_TOL  # the adapter does change the logits
    assert (ours - theirs).abs().max().item() <= LOGIT_TOL
