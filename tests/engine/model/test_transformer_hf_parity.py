"""Our packed transformer against transformers' Qwen3 / Llama on tiny random configs (fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer

TOL = 1e-4
LENGTHS = [5, 70, 17, 1, 130, 64]


def random_sequences(vocab: int, lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def packed_logits(model: Transformer, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    batch = model.pack([SequenceInput(s.tolist()) for s in seqs])
    with torch.no_grad():
        logits = model.logits(model.forward(batch))
    return [logits[batch.seq_row_start[i]:batch.seq_row_start[i] + len(s)]
            for i, s in enumerate(seqs)]


def hf_logits(hf_model: object, seq: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(seq[None]).logits[0]  # type: ignore[operator]


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_packed_forward_matches_each_sequence_alone_in_transformers(
        hf_model_factory, arch: str, tie: bool, invariant: bool) -> None:
    path, hf_model = hf_model_factory(arch, tie)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    assert model.spec.num_heads != model.spec.num_kv_heads  # GQA exercised
    assert (model.weights.lm_head is model.weights.embed) == tie
    seqs = random_sequences(model.spec.vocab_size, LENGTHS)
    for seq, ours in zip(seqs, packed_logits(model, seqs), strict=True):
        assert (ours - hf_logits(hf_model, seq)).abs().max().item() <= TOL


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_prefill_then_cached_suffix_matches_transformers(hf_model_factory, arch: str,
                                                         invariant: bool) -> None:
    path, hf_model = hf_model_factory(arch, False)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    seq = random_sequences(model.spec.vocab_size, [150], seed=3)[0]
    cache = PagedKVCache.allocate(model.spec, 8, 64, model.device, model.dtype)
    table = [6, 2, 4]  # deliberately out of order
    pieces = [(0, 70), (70, 71), (71, 150)]  # prefix, one decode step, the rest
    outs = []
    with torch.no_grad():
        for start, end in pieces:
            batch = model.pack([SequenceInput(seq[start:end].tolist(), None, start, table)])
            outs.append(model.logits(model.forward(batch, kv=cache))[:end - start])
    assert (torch.cat(outs) - hf_logits(hf_model, seq)).abs().max().item() <= TOL


def test_long_positions_exercise_llama3_rope_scaling(hf_model_factory) -> None:
    """original_max_position_embeddings=64, so positions up to 300 depend on the scaling."""
    path, hf_model = hf_model_factory("llama", True)
    model = load_model(path)
    assert model.spec.rope.kind == "llama3"
    seq = random_sequences(model.spec.vocab_size, [300], seed=5)[0]
    (ours,) = packed_logits(model, [seq])
    assert (ours - hf_logits(hf_model, seq)).abs().max().item() <= TOL


def test_sharded_checkpoint_loads(hf_model_factory, tmp_path: Path) -> None:
    _, hf_model = hf_model_factory("qwen3", False)
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = load_model(tmp_path)
    seqs = random_sequences(model.spec.vocab_size, [33])
    (ours,) = packed_logits(model, seqs)
    assert (ours - hf_logits(hf_model, seqs[0])).abs().max().item() <= TOL


def test_bf16_checkpoint_loads_into_fp32_compute(hf_model_factory, tmp_path: Path) -> None:
    _, hf_model = hf_model_factory("llama", False)
    import copy

    bf16 = copy.deepcopy(hf_model).to(torch.bfloat16)
    bf16.save_pretrained(tmp_path)
    model = load_model(tmp_path, EngineConfig(dtype="float32"))
    assert model.dtype == torch.float32
    from transformers import AutoModelForCausalLM

    # The same bf16-rounded weights computed in fp32 (rotary buffers recomputed, not rounded).
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    seqs = random_sequences(model.spec.vocab_size, [40])
    (ours,) = packed_logits(model, seqs)
    assert (ours - hf_logits(reference, seqs[0])).abs().max().item() <= TOL


def test_model_info_counts_match_transformers(hf_model_factory) -> None:
    for tie in (True, False):
        path, hf_model = hf_model_factory("llama", tie)
        info = load_model(path).model_info()
        assert info.num_params == sum(p.numel() for p in hf_model.parameters())
        assert info.arch == "llama" and info.card.num_kv_heads == 2 and info.max_context == 1024
        assert info.card.tie_word_embeddings == tie


def test_yarn_rope_matches_transformers(tmp_path: Path) -> None:
    """Qwen3 with YaRN scaling (its long-context recipe: factor 4 over 256 original positions
    here, sequences past them), as transformers computes the frequencies and cos/sin factor."""
    from transformers import Qwen3Config

    from tests.engine.conftest import build_hf_model

    config = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=1024,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                          "original_max_position_embeddings": 256})
    hf_model = build_hf_model(config)
    hf_model.save_pretrained(tmp_path)
    model = load_model(tmp_path, EngineConfig())
    assert model.spec.rope.kind == "yarn" and model.spec.rope.attention_factor > 1
    seqs = random_sequences(model.spec.vocab_size, [300, 40], seed=9)
    for seq, ours in zip(seqs, packed_logits(model, seqs), strict=True):
        assert (ours - hf_logits(hf_model, seq)).abs().max().item() <= TOL
