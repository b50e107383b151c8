"""PEFT export: cookbook key names and shapes, and `peft.PeftModel` on the same HF base gives our
logits (untied and tied heads; the head LoRA loaded by a plain `from_pretrained`)."""

from __future__ import annotations

import copy
import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.work import SaveWork
from loraplex.engine.executor import Engine
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.peft_export import PEFT_CONFIG, PEFT_WEIGHTS
from tests.engine.train_works import create_random_adapter

LOGIT_TOL = 1e-5


def export(engine: Engine, config: LoraConfig, directory: Path) -> None:
    create_random_adapter(engine, "a", config, seed=7)
    engine.save_adapter(SaveWork("a", str(directory), with_optimizer=False, peft_export=True))


def our_logits(engine: Engine, tokens: torch.Tensor) -> torch.Tensor:
    batch = engine.model.pack([SequenceInput(tokens.tolist(), "a")])
    lora = engine.bank.stack(batch, rank_multiple=engine.model.rank_multiple,
                             dtype=engine.model.dtype)
    with torch.no_grad():
        logits_R_V = engine.model.logits(engine.model.forward(batch, lora), lora)
    return logits_R_V[:len(tokens)]


def peft_logits(hf_model: Any, directory: Path, tokens: torch.Tensor, **kwargs: Any
                ) -> torch.Tensor:
    from peft import PeftModel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(copy.deepcopy(hf_model), str(directory), **kwargs)
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    assert not missing, missing
    with torch.no_grad():
        return model(input_ids=tokens[None]).logits[0]


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)],
                         ids=["untied", "tied"])
def test_peft_model_reproduces_our_logits(hf_model_factory, tmp_path: Path, arch: str,
                                          tied: bool) -> None:
    path, hf_model = hf_model_factory(arch, tied)
    engine = Engine(str(path), EngineConfig(batch_invariant=False))
    export(engine, LoraConfig(rank=8, alpha=16.0), tmp_path / "ckpt")
    tokens = torch.randint(0, engine.model.spec.vocab_size, (37,),
                           generator=torch.Generator().manual_seed(0))
    ours = our_logits(engine, tokens)
    theirs = peft_logits(hf_model, tmp_path / "ckpt", tokens)  # a plain from_pretrained
    base = hf_model(input_ids=tokens[None]).logits[0].detach()
    assert (ours - base).abs().max() > 100 * LOGIT_TOL  # the adapter does change the logits
    assert (ours - theirs).abs().max().item() <= LOGIT_TOL


def test_peft_loads_a_head_free_adapter_without_any_mapping(hf_model_factory,
                                                             tmp_path: Path) -> None:
    path, hf_model = hf_model_factory("llama", False)
    engine = Engine(str(path), EngineConfig(batch_invariant=False))
    export(engine, LoraConfig(rank=4, train_unembed=False), tmp_path / "ckpt")
    tokens = torch.randint(0, engine.model.spec.vocab_size, (21,),
                           generator=torch.Generator().manual_seed(1))
    theirs = peft_logits(hf_model, tmp_path / "ckpt", tokens)
    assert (our_logits(engine, tokens) - theirs).abs().max().item() <= LOGIT_TOL


def test_export_uses_the_cookbook_key_names_and_shapes(hf_model_factory, tmp_path: Path
                                                       ) -> None:
    path, _ = hf_model_factory("qwen3", True)
    engine = Engine(str(path), EngineConfig())
    export(engine, LoraConfig(rank=8, alpha=16.0), tmp_path / "ckpt")
    spec = engine.model.spec
    config = json.loads((tmp_path / "ckpt" / PEFT_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16.0
    assert config["base_model_name_or_path"] == str(path)
    assert sorted(config["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])
    tensors = load_file(tmp_path / "ckpt" / PEFT_WEIGHTS)
    prefix = "base_model.model.model"
    assert tensors[f"{prefix}.layers.1.self_attn.q_proj.lora_A.weight"].shape == (
        8, spec.hidden_size)
    assert tensors[f"{prefix}.layers.0.self_attn.k_proj.lora_B.weight"].shape == (
        spec.kv_size, 8)
    assert tensors[f"{prefix}.layers.1.mlp.down_proj.lora_A.weight"].shape == (
        8, spec.intermediate_size)
    assert tensors["base_model.model.lm_head.lora_B.weight"].shape == (spec.vocab_size, 8)
    assert len(tensors) == 2 * (7 * spec.num_layers + 1)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    a = engine.bank.get("a").weights["up_proj"]
    assert torch.equal(tensors[f"{prefix}.layers.1.mlp.up_proj.lora_B.weight"], a.b_L_O_Rk[1])


def test_cookbook_tools_take_the_export(hf_model_factory, tmp_path: Path) -> None:
    """tinker-cookbook 0.6.1's ``build_lora_adapter`` (its own venv, as its users run it)
    converts our export, head included; plain PEFT on its output gives our logits, and its
    ``build_hf_model`` merge gives them too."""
    from tests.engine.lora.test_expert_lora import COOKBOOK_WEIGHTS
    from tests.engine.test_moe_export import MERGE
    from tests.integration.venvs import ensure_venv

    path, hf_model = hf_model_factory("llama", False)
    engine = Engine(str(path), EngineConfig(batch_invariant=False))
    export(engine, LoraConfig(rank=4, alpha=8.0), tmp_path / "ckpt")
    python = ensure_venv("cookbook-weights", COOKBOOK_WEIGHTS, "import tinker_cookbook.weights")
    convert = ("import sys\nfrom tinker_cookbook import weights\n"
               "weights.build_lora_adapter(base_model=sys.argv[1], adapter_path=sys.argv[2], "
               "output_path=sys.argv[3])\n")
    for script, out in ((convert, "served"), (MERGE, "merged")):
        done = subprocess.run([python, "-c", script, str(path), str(tmp_path / "ckpt"),
                               str(tmp_path / out)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
    tokens = torch.randint(0, engine.model.spec.vocab_size, (29,),
                           generator=torch.Generator().manual_seed(2))
    ours = our_logits(engine, tokens)
    converted = json.loads((tmp_path / "served" / PEFT_CONFIG).read_text())
    assert "lm_head" in converted["target_modules"]
    assert (ours - peft_logits(hf_model, tmp_path / "served", tokens)).abs().max() <= LOGIT_TOL
    merged = load_model(tmp_path / "merged", EngineConfig(batch_invariant=False))
    with torch.no_grad():
        theirs = merged.logits(merged.forward(merged.pack([SequenceInput(tokens.tolist())])))
    # merged weights round W + s·BA once in fp32: the family export test's bar
    assert (ours - theirs[:len(tokens)]).abs().max().item() <= 10 * LOGIT_TOL
