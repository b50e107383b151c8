"""K adapters packed in one batch == K separate single-adapter runs (logprobs and gradients)."""

from __future__ import annotations

import pytest
import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.model.weights import random_weights

SPEC = ModelSpec(arch="qwen3", vocab_size=128, hidden_size=64, intermediate_size=96,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
                 rope=RopeSpec(1e6), tie_word_embeddings=True, max_position_embeddings=512)
CONFIGS = {
    "a": LoraConfig(rank=2, alpha=4.0, seed=1),
    "b": LoraConfig(rank=8, seed=2, train_unembed=False),
    "c": LoraConfig(rank=16, alpha=8.0, seed=3, train_attn=False),
    "d": LoraConfig(rank=5, seed=4, train_mlp=False),
}
LENGTHS = {"a": [7, 70], "b": [1, 33], "c": [18], "d": [64, 3, 12], None: [9, 21]}
REL_TOL = 1e-5


def setup(invariant: bool) -> tuple[Transformer, AdapterBank, list[SequenceInput],
                                    list[torch.Tensor]]:
    model = Transformer(SPEC, random_weights(SPEC, seed=0, std=0.15),
                        ComputeOptions(batch_invariant=invariant))
    bank = AdapterBank(SPEC, "cpu", max_rank=32)
    gen = torch.Generator().manual_seed(0)
    for name, config in CONFIGS.items():
        with torch.no_grad():
            for p in bank.create(name, config).parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    seqs, weights = [], []
    for name, lengths in LENGTHS.items():
        for n in lengths:
            seqs.append(SequenceInput(torch.randint(0, 128, (n,), generator=gen).tolist(), name))
            weights.append(torch.randn(n, generator=gen))  # fractional and negative weights
    order = torch.randperm(len(seqs), generator=gen).tolist()  # interleave tenants
    return model, bank, [seqs[i] for i in order], [weights[i] for i in order]


def run(model: Transformer, bank: AdapterBank, seqs: list[SequenceInput],
        weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-sequence logprobs of next tokens; backward of Σ weight·logprob into the adapters."""
    batch = model.pack(seqs)
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    targets_T = torch.cat([torch.tensor([*s.tokens[1:], 0]) for s in seqs])
    lp_R = model.token_logprobs(model.forward(batch, lora), batch.scatter_to_rows(targets_T),
                                lora)
    lp_T = batch.gather_from_rows(lp_R)
    if lora is not None:  # a base-only batch has nothing to train
        (lp_T * torch.cat(weights)).sum().backward()
    return [lp.detach() for lp in lp_T.split(list(batch.seq_num_new))]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
def test_mixed_batch_equals_separate_single_adapter_runs(invariant: bool) -> None:
    model, bank, seqs, weights = setup(invariant)
    mixed = run(model, bank, seqs, weights)
    mixed_grads = {n: [p.grad.clone() for p in bank.get(n).parameters()] for n in CONFIGS}
    for name in CONFIGS:
        bank.get(name).free_grads()
    separate: list[torch.Tensor | None] = [None] * len(seqs)
    for name in [*CONFIGS, None]:
        idx = [i for i, s in enumerate(seqs) if s.adapter_id == name]
        out = run(model, bank, [seqs[i] for i in idx], [weights[i] for i in idx])
        for i, lp in zip(idx, out, strict=True):
            separate[i] = lp
    for lp, ref in zip(mixed, separate, strict=True):
        assert ref is not None
        assert rel_err(lp, ref) <= REL_TOL
        if invariant:
            assert torch.equal(lp, ref)
    for name in CONFIGS:
        params = bank.get(name).parameters()
        assert len(params) == len(mixed_grads[name])
        for p, g in zip(params, mixed_grads[name], strict=True):
            assert p.grad is not None and p.grad.abs().sum() > 0
            assert rel_err(g, p.grad) <= REL_TOL


def test_reference_loop_formulation_agrees_with_grouped_mm() -> None:
    """grouped_mm segment GEMMs == a per-segment Python loop (forward and gradients)."""
    from loraplex.engine.model.lora_batch import grouped_linear

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(80, 24, generator=gen, requires_grad=True)
    w = torch.randn(3, 10, 24, generator=gen, requires_grad=True)
    offsets = torch.tensor([16, 16, 80], dtype=torch.int32)  # includes an empty segment

    def loop() -> torch.Tensor:
        return torch.cat([x[:16] @ w[0].T, x[16:16] @ w[1].T, x[16:80] @ w[2].T])

    assert torch.equal(grouped_linear(x, w, offsets), loop())
    gy = torch.randn(80, 10, generator=gen)
    gx, gw = torch.autograd.grad(grouped_linear(x, w, offsets), (x, w), gy)
    lx, lw = torch.autograd.grad(loop(), (x, w), gy)
    assert torch.allclose(gx, lx, rtol=1e-6, atol=1e-6)
    assert torch.allclose(gw, lw, rtol=1e-6, atol=1e-6)
    grouped_linear(x, w, offsets).sum().backward()  # raw grouped_mm rejects this stride-0 grad
    assert x.grad is not None and w.grad is not None
    lx, lw = torch.autograd.grad(loop().sum(), (x, w))
    assert torch.allclose(x.grad, lx, rtol=1e-6, atol=1e-6)
    assert torch.allclose(w.grad, lw, rtol=1e-6, atol=1e-6)
