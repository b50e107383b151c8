"""Recomputation (``engine.recompute``) changes memory and time, never a bit: training logprobs
and LoRA gradients are bitwise equal with every layer (and the head's windows) recomputed,
none, and ``auto`` keeping some; ``auto`` recomputes the layers whose activations do not fit
``activation_memory``, and the head's windows when they do not fit beside the layers kept."""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.layer_recompute import (
    activation_bytes_per_row,
    recomputed_layers,
    recomputes_head,
)
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.transformer import Transformer
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

SMOLLM2 = ModelSpec(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                    rope=RopeSpec(1e4), tie_word_embeddings=True, max_position_embeddings=8192)


def test_the_estimate_is_the_measured_bytes_per_row_within_2_percent() -> None:
    """benchmarks/memory.py measured 50,135 B of autograd's saved tensors per token and layer
    on SmolLM2-135M."""
    assert abs(activation_bytes_per_row(SMOLLM2, 4) / 50_135 - 1) < 0.02


def test_auto_recomputes_the_layers_that_do_not_fit() -> None:
    row = activation_bytes_per_row(SMOLLM2, 4)
    auto = ComputeOptions(recompute="auto", activation_memory=10 * row * 2048)
    assert recomputed_layers(auto, 30, row, 2048) == 20
    assert recomputed_layers(auto, 30, row, 512) == 0  # 40 layers' worth fit
    assert recomputed_layers(ComputeOptions(recompute="auto"), 30, row, 1) == 30  # budget 0
    assert recomputed_layers(ComputeOptions(recompute="layer"), 30, row, 1) == 30
    assert recomputed_layers(ComputeOptions(recompute="none"), 30, row, 10**6) == 0


def test_auto_keeps_the_head_windows_where_they_fit_beside_the_layers() -> None:
    row, head = activation_bytes_per_row(SMOLLM2, 4), 2 * 2048 * 49152 * 4
    fits = ComputeOptions(recompute="auto", activation_memory=30 * row * 2048 + head)
    assert not recomputes_head(fits, 30, row, 2048, 49152)
    tight = ComputeOptions(recompute="auto", activation_memory=30 * row * 2048 + head - 1)
    assert recomputes_head(tight, 30, row, 2048, 49152)
    assert recomputes_head(ComputeOptions(recompute="layer"), 30, row, 1, 49152)
    assert not recomputes_head(ComputeOptions(recompute="none"), 30, row, 10**6, 49152)


def train(model: Transformer, seqs: list[list[int]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    bank = AdapterBank(model.spec, "cpu", max_rank=16)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in bank.create("a", LoraConfig(rank=8, seed=1)).parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    batch = model.pack([SequenceInput(s[:-1], "a") for s in seqs])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    targets = batch.scatter_to_rows(torch.tensor([t for s in seqs for t in s[1:]]))
    logprobs = model.token_logprobs(model.forward(batch, lora), targets, lora)
    grads = torch.autograd.grad(-logprobs.sum(), list(bank.get("a").parameters()))
    return logprobs.detach(), list(grads)


def test_every_mode_gives_the_same_bits(tiny_model_dir: Path) -> None:
    keep_layers = 1  # of the tiny model's 2
    none = load_model(tiny_model_dir, EngineConfig(recompute="none"))
    rows = none.pack([SequenceInput(list(range(40)), "a"), SequenceInput(list(range(70)), "a")
                      ]).num_rows
    row_bytes = activation_bytes_per_row(none.spec, 4)
    partial = load_model(tiny_model_dir, EngineConfig(
        recompute="auto", activation_memory=keep_layers * row_bytes * rows))
    assert recomputed_layers(partial.options, none.spec.num_layers, row_bytes, rows) == (
        none.spec.num_layers - keep_layers) > 0
    layer = load_model(tiny_model_dir, EngineConfig(recompute="layer"))
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, none.spec.vocab_size, (n,), generator=gen).tolist()
            for n in (41, 71)]
    want_lp, want_grads = train(none, seqs)
    for model in (partial, layer):
        got_lp, got_grads = train(model, seqs)
        assert torch.equal(got_lp, want_lp)
        for want, got in zip(want_grads, got_grads, strict=True):
            assert torch.equal(got, want)
