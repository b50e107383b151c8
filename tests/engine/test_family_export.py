"""The new families' PEFT exports, merged by tinker-cookbook 0.6.1's ``weights.build_hf_model``
(run in its own venv, as its users would), give models whose logits equal ours with the adapter.

Qwen3.5 (the built-in's multimodal checkpoint layout, ``model.language_model.*``, as the
released models are): the cookbook fuses our separate ``in_proj_q/k/v`` adapters into
``in_proj_qkv`` and maps the head onto the tied embedding; Qwen3.5-MoE adds the routed experts'
3-D tensors and the shared expert; gpt-oss interleaves ``w1``/``w3`` into its fused
``gate_up_proj``. The merged directory is loaded by our own loader (no adapter) and its logits
compared with ours (base + adapter), both fp32. The tied built-in (as Qwen3.5-4B ties its
embeddings) exports without the head's LoRA: merged into a tied matrix it would move the input
embedding too (the cookbook maps ``unembed_tokens`` onto ``embed_tokens`` then), which no
merged checkpoint of a tied model can avoid.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.executor import Engine
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.peft_export import PEFT_CONFIG
from tests.engine.lora.test_expert_lora import COOKBOOK_WEIGHTS
from tests.engine.test_moe_export import MERGE
from tests.engine.test_peft_export import export, our_logits
from tests.integration.venvs import ensure_venv

LOGIT_TOL = 1e-4
RANK, ALPHA = 4, 8.0
#: built-in → targets the export must name.
BUILTINS = {"tiny-qwen35": {"in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z", "out_proj",
                            "q_proj", "gate_proj", "lm_head"},
            "tiny-qwen35-moe": {"in_proj_q", "out_proj", "q_proj", "w1", "w2", "w3",
                                "gate_proj", "lm_head"},
            "tiny-gptoss": {"q_proj", "o_proj", "w1", "w2", "w3", "lm_head"}}


@pytest.mark.parametrize("builtin", list(BUILTINS))
def test_cookbook_merge_gives_our_logits(builtin_model_dir, tmp_path: Path, builtin: str
                                         ) -> None:
    base = builtin_model_dir(builtin)
    engine = Engine(str(base), EngineConfig(batch_invariant=False))
    tied = engine.model.spec.tie_word_embeddings
    export(engine, LoraConfig(rank=RANK, alpha=ALPHA, train_unembed=not tied), tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / PEFT_CONFIG).read_text())
    assert BUILTINS[builtin] - ({"lm_head"} if tied else set()) <= set(config["target_modules"])
    python = ensure_venv("cookbook-weights", COOKBOOK_WEIGHTS, "import tinker_cookbook.weights")
    done = subprocess.run([python, "-c", MERGE, str(base), str(tmp_path / "ckpt"),
                           str(tmp_path / "merged")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    merged = load_model(tmp_path / "merged", EngineConfig(batch_invariant=False))
    tokens = torch.randint(0, engine.model.spec.vocab_size, (90,),
                           generator=torch.Generator().manual_seed(0))
    batch = merged.pack([SequenceInput(tokens.tolist())])
    with torch.no_grad():
        theirs = merged.logits(merged.forward(batch))[:len(tokens)]
        base_batch = engine.model.pack([SequenceInput(tokens.tolist())])
        plain = engine.model.logits(engine.model.forward(base_batch))[:len(tokens)]
    ours = our_logits(engine, tokens)
    assert (ours - plain).abs().max() > 100 * LOGIT_TOL  # the adapter does change the logits
    assert (ours - theirs).abs().max().item() <= LOGIT_TOL
