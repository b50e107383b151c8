"""A model whose base GEMMs run on the packed kernel computes bit for bit what the F.linear
model computes: training logprobs, prefill and decode through the cache. LoRA gradients agree
to rounding (the backward need not be bitwise: the packed model runs gate and up as one GEMM,
so its input gradient sums their products in one GEMM instead of adding two)."""

from __future__ import annotations

import pytest
import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import base_inner_dims
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.model.weights import random_weights
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

SPEC = ModelSpec(arch="llama", vocab_size=700, hidden_size=192, intermediate_size=320,
                 num_layers=2, num_heads=6, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5,
                 rope=RopeSpec(1e4), tie_word_embeddings=True, max_position_embeddings=512)


def models() -> tuple[Transformer, Transformer, AdapterBank]:
    gemm = gemm_kernel(base_inner_dims(SPEC), torch.device("cpu"), torch.float32)
    if gemm is None:
        pytest.skip("the packed GEMM kernel is not available on this machine")
    plain = Transformer(SPEC, random_weights(SPEC, 0, std=0.1), ComputeOptions())
    packed = Transformer(SPEC, random_weights(SPEC, 0, std=0.1), ComputeOptions(gemm=gemm))
    # q/k/v, gate/up, o, down and the tied head: every base GEMM on the kernel
    assert packed.packed_bytes() == 4 * (sum(w.numel() for w in (
        *(t for layer in packed.weights.layers for t in (
            layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj, layer.gate_proj,
            layer.up_proj, layer.down_proj) if t is not None),)) + 704 * 192)
    assert plain.packed_bytes() == 0
    bank = AdapterBank(SPEC, "cpu", max_rank=16)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in bank.create("a", LoraConfig(rank=8, seed=1)).parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return plain, packed, bank


def test_training_logprobs_are_bitwise_equal_and_gradients_agree() -> None:
    plain, packed, bank = models()
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, SPEC.vocab_size, (n,), generator=gen).tolist() for n in (37, 90)]
    results = []
    for model in (plain, packed):
        batch = model.pack([SequenceInput(s[:-1], "a") for s in seqs])
        lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
        targets = batch.scatter_to_rows(torch.tensor([t for s in seqs for t in s[1:]]))
        logprobs = model.token_logprobs(model.forward(batch, lora), targets, lora)
        params = list(bank.get("a").parameters())
        grads = torch.autograd.grad(-logprobs.sum(), params)
        results.append((logprobs.detach(), grads))
    assert torch.equal(results[0][0], results[1][0])
    for want, got in zip(results[0][1], results[1][1], strict=True):
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_prefill_and_decode_are_bitwise_equal() -> None:
    plain, packed, bank = models()
    prompt = list(range(5, 75))
    outs = []
    for model in (plain, packed):
        cache = PagedKVCache.allocate(SPEC, 4, 64, model.device, model.dtype)
        steps = [[SequenceInput(prompt, "a", 0, [1, 2])]]
        steps += [[SequenceInput([7 + i], "a", len(prompt) + i, [1, 2])] for i in range(3)]
        logits = []
        with torch.no_grad():
            for seqs in steps:
                batch = model.pack(seqs)
                lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
                logits.append(model.logits(model.forward(batch, lora, cache), lora))
        outs.append(logits)
    for want, got in zip(*outs, strict=True):
        assert torch.equal(want, got)
