"""Batch invariance, asserted on the float bits (torch.equal on fp32 logprobs).

A token's logprob must not depend on what shares its batch (1 / 7 / 64 sequences, other
adapters, base rows, its position in the pack, tiny adapter segments), nor on how it was
computed (training full forward, prefill + decode at decode batch 1 or 7, or a suffix forwarded
after a prefix whose KV an earlier request wrote). Shapes are the ``small`` model's (hidden 512,
8 heads / 4 kv heads of 64, MLP 1536) with 2 layers, and vocab 2500: more than one `HEAD_CHUNK`,
so a small batch's chunked head GEMMs meet a large batch's single one. Every check runs with
base GEMMs on F.linear (MKL) and attention on the tiled torch kernel, and both on the C kernels
(`engine.kernels`), there with float32 and with bfloat16 weights (`engine.dtype=bfloat16` on
CPU). Fast mode is checked to NOT be invariant, so these tests can fail.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F

from loraplex.domain.lora import LoraConfig
from loraplex.engine.kernels.attention_kernel import AttentionKernel, attention_kernel
from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.kernels.packed_linear import GemmKernel
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import base_inner_dims
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.model.weight_storage import store_in
from loraplex.engine.model.weights import random_weights
from tests.engine.threads import one_thread  # noqa: F401  (autouse; 2 threads: see below)

SPEC = ModelSpec(arch="qwen3", vocab_size=2500, hidden_size=512, intermediate_size=1536,
                 num_layers=2, num_heads=8, num_kv_heads=4, head_dim=64, rms_norm_eps=1e-6,
                 rope=RopeSpec(1e6), tie_word_embeddings=False, max_position_embeddings=4096)
ADAPTERS = {"r1": LoraConfig(rank=1, seed=1), "r8": LoraConfig(rank=8, seed=2),
            "r16": LoraConfig(rank=16, seed=3, train_mlp=False),
            "r32": LoraConfig(rank=32, seed=4, train_attn=False)}


class Harness:
    def __init__(self, invariant: bool = True, spec: ModelSpec = SPEC,
                 gemm: GemmKernel | None = None, attention: AttentionKernel | None = None,
                 device: str = "cpu") -> None:
        weights = random_weights(spec, seed=0, std=0.05)
        if device != "cpu":  # bf16 on CUDA, as the engine loads it there
            weights = weights.to(device, torch.bfloat16)
        if gemm is not None and gemm.weight_dtype != torch.float32:
            store_in(weights, gemm.weight_dtype)  # engine.dtype=bfloat16 on CPU
        self.model = Transformer(spec, weights, ComputeOptions(
            batch_invariant=invariant, gemm=gemm, attention=attention))
        self.bank = AdapterBank(spec, device, max_rank=64)
        self.previous: LoraBatch | None = None
        gen = torch.Generator().manual_seed(7)
        for name, config in ADAPTERS.items():
            with torch.no_grad():
                for p in self.bank.create(name, config).parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)

    def logprobs(self, seqs: Sequence[SequenceInput], targets: Sequence[Sequence[int]],
                 kv: PagedKVCache | None = None) -> list[torch.Tensor]:
        batch = self.model.pack(seqs)
        lora = self.bank.stack(batch, rank_multiple=self.model.rank_multiple,
                               dtype=self.model.dtype, reuse=self.previous if kv else None)
        self.previous = lora  # decode steps reuse the stacked weights, as a sampler would
        targets_T = torch.tensor([t for ts in targets for t in ts], device=self.model.device)
        with torch.no_grad():
            hidden = self.model.forward(batch, lora, kv)
            lp_R = self.model.token_logprobs(hidden, batch.scatter_to_rows(targets_T), lora)
        lp_T = batch.gather_from_rows(lp_R)
        return list(lp_T.split(list(batch.seq_num_new)))

    def full(self, tokens: list[int], adapter: str | None) -> torch.Tensor:
        """Training-style full forward of one sequence alone."""
        return self.logprobs([SequenceInput(tokens, adapter)], [[*tokens[1:], 0]])[0]


#: ``LORAPLEX_TEST_DEVICE=cuda`` (scripts/gpu_check.sh) runs the suite on CUDA in bf16 too.
DEVICES = ["torch", "native", "native-bf16"] + (
    ["cuda"] if os.environ.get("LORAPLEX_TEST_DEVICE") == "cuda" else [])


@pytest.fixture(scope="module", params=DEVICES)
def harness(request: pytest.FixtureRequest) -> Harness:
    """Base GEMMs on F.linear (MKL) and attention on the tiled torch kernel; and both on the C
    kernels as the loader sets them up on this machine (skipped where they cannot be built),
    with float32 and with bfloat16 weights (``engine.dtype=bfloat16`` on CPU); and on CUDA
    when asked for."""
    if request.param == "torch":
        return Harness()
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("LORAPLEX_TEST_DEVICE=cuda without CUDA")
        return Harness(device="cuda")
    cpu = torch.device("cpu")
    weight_dtype = torch.bfloat16 if request.param == "native-bf16" else torch.float32
    gemm = gemm_kernel(base_inner_dims(SPEC), cpu, torch.float32, weight_dtype)
    attention = attention_kernel(cpu, torch.float32)
    if gemm is None or attention is None:
        pytest.skip("the C kernels are not available on this machine")
    harness = Harness(gemm=gemm, attention=attention)
    assert harness.model.packed_bytes() > 0  # the kernel really runs the base GEMMs
    return harness


def random_tokens(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, SPEC.vocab_size, (n,), generator=gen).tolist()


def crowd(n: int, seed: int) -> list[SequenceInput]:
    """Other tenants: mixed lengths (1..100), every adapter and base rows."""
    gen = torch.Generator().manual_seed(seed)
    names: list[str | None] = [None, *ADAPTERS]
    return [SequenceInput(random_tokens(gen, int(torch.randint(1, 100, (1,), generator=gen))),
                          names[i % len(names)]) for i in range(n)]


def in_crowd(h: Harness, tokens: list[int], adapter: str | None, others: list[SequenceInput],
             position: int) -> torch.Tensor:
    seqs = [*others[:position], SequenceInput(tokens, adapter), *others[position:]]
    targets = [[*s.tokens[1:], 0] for s in seqs]
    return h.logprobs(seqs, targets)[position]


@pytest.mark.parametrize("adapter", ["r8", "r32", None])
def test_logprobs_identical_alone_and_in_batches_of_7_and_64(harness: Harness,
                                                             adapter: str | None) -> None:
    gen = torch.Generator().manual_seed(11)
    tokens = random_tokens(gen, 45)
    alone = harness.full(tokens, adapter)
    for size, seed in ((7, 1), (64, 2)):
        others = crowd(size - 1, seed)
        for position in (0, size - 1) if size > 7 else (0, 3, size - 1):
            assert torch.equal(in_crowd(harness, tokens, adapter, others, position), alone)


@pytest.mark.parametrize("length", [1, 2, 3, 5, 7, 11])
def test_tiny_adapter_segments_are_invariant(harness: Harness, length: int) -> None:
    """The sequence is its adapter's only rows: a 1-11-row segment padded to 16."""
    tokens = random_tokens(torch.Generator().manual_seed(length), length)
    alone = harness.full(tokens, "r1")
    others = [s for s in crowd(20, 5) if s.adapter_id != "r1"]
    assert torch.equal(in_crowd(harness, tokens, "r1", others, 3), alone)


def decode(h: Harness, prompts: list[list[int]], continuations: list[list[int]],
           adapters: list[str | None]) -> list[torch.Tensor]:
    """Prefill all prompts in one batch, then decode the continuations in lockstep."""
    cache = PagedKVCache.allocate(h.model.spec, 64, 64, h.model.device, h.model.dtype)
    tables = [[5 * i + j for j in range(4)][::-1] for i in range(len(prompts))]
    seqs = [SequenceInput(p, a, 0, t) for p, a, t in zip(prompts, adapters, tables, strict=True)]
    first_targets = [[*p[1:], c[0]] for p, c in zip(prompts, continuations, strict=True)]
    out = [[lp] for lp in h.logprobs(seqs, first_targets, cache)]
    for step in range(len(continuations[0]) - 1):
        seqs = [SequenceInput([c[step]], a, len(p) + step, t)
                for p, c, a, t in zip(prompts, continuations, adapters, tables, strict=True)]
        targets = [[c[step + 1]] for c in continuations]
        for i, lp in enumerate(h.logprobs(seqs, targets, cache)):
            out[i].append(lp)
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("decode_batch", [1, 7])
def test_prefill_and_decode_equal_the_training_forward(harness: Harness,
                                                       decode_batch: int) -> None:
    gen = torch.Generator().manual_seed(decode_batch)
    names: list[str | None] = ["r8", None, "r32", "r1", "r16", "r8", None]
    adapters = names[:decode_batch]
    prompts = [random_tokens(gen, n) for n in (9, 30, 17, 64, 3, 50, 21)[:decode_batch]]
    continuations = [random_tokens(gen, 40) for _ in range(decode_batch)]
    decoded = decode(harness, prompts, continuations, adapters)
    for p, c, a, lp in zip(prompts, continuations, adapters, decoded, strict=True):
        full = harness.full(p + c, a)[:-1]  # the last target is not part of the decode
        assert torch.equal(lp, full)


def test_suffix_after_a_prefix_cached_by_an_earlier_request_equals_one_shot(
        harness: Harness) -> None:
    gen = torch.Generator().manual_seed(21)
    prefix, suffix = random_tokens(gen, 70), random_tokens(gen, 50)  # crosses a KV block
    tokens = prefix + suffix
    one_shot = harness.full(tokens, "r16")
    cache = PagedKVCache.allocate(harness.model.spec, 16, 64, harness.model.device,
                                  harness.model.dtype)
    table = [9, 3]
    # An earlier request with other sequences writes the prefix's KV (cache miss)...
    others = [SequenceInput(s.tokens, s.adapter_id, 0, [10 + 3 * i, 11 + 3 * i, 12 + 3 * i])
              for i, s in enumerate(crowd(2, 9))]
    earlier = [*others, SequenceInput(prefix, "r16", 0, table)]
    missed = harness.logprobs(earlier, [[*s.tokens[1:], 0] for s in earlier], cache)[-1]
    assert torch.equal(missed[:-1], one_shot[:69])
    # ... and a later request forwards only the suffix against it (cache hit).
    hit = harness.logprobs([SequenceInput(suffix, "r16", 70, table)], [[*suffix[1:], 0]], cache)
    assert torch.equal(hit[0], one_shot[70:])


def test_decode_over_shared_prefix_pages_equals_the_training_forward(harness: Harness) -> None:
    """G samples whose tables share a prompt's full pages (one tile per shared page), each with
    a private copy of the partial last page, decoded in lockstep beside sequences with pages of
    their own, across two block boundaries: every logprob equals the training forward's."""
    gen = torch.Generator().manual_seed(31)
    cache = PagedKVCache.allocate(harness.model.spec, 32, 64, harness.model.device,
                                  harness.model.dtype)
    prompt = random_tokens(gen, 120)  # page 0 full, page 1 partial
    prompt_lp = harness.logprobs([SequenceInput(prompt, "r8", 0, [2, 9])],
                                 [[*prompt[1:], 0]], cache)[0]
    samples = [random_tokens(gen, 80) for _ in range(3)]  # positions 120..199: blocks 1, 2, 3
    tables = [[2, 12 + 3 * i, 13 + 3 * i, 14 + 3 * i] for i in range(3)]
    for t in tables:  # copy-on-write of the partial page, as KVPool.copy_partial_pages does
        for pages in (*cache.k, *cache.v):
            pages[t[1]] = pages[9]
    own = [(random_tokens(gen, 70), None, [25, 26, 29]), (random_tokens(gen, 5), "r32", [27, 28])]
    own_lp = harness.logprobs([SequenceInput(p, a, 0, t) for p, a, t in own],
                              [[*p[1:], 0] for p, _, _ in own], cache)
    got: list[list[torch.Tensor]] = [[] for _ in range(5)]
    for step in range(len(samples[0]) - 1):
        seqs = [SequenceInput([c[step]], "r8", 120 + step, t)
                for c, t in zip(samples, tables, strict=True)]
        seqs += [SequenceInput([1], a, len(p) + step, t) for p, a, t in own]
        targets = [[c[step + 1]] for c in samples] + [[1], [1]]
        for i, lp in enumerate(harness.logprobs(seqs, targets, cache)):
            got[i].append(lp)
    for c, lps in zip(samples, got[:3], strict=True):
        full = harness.full(prompt + c, "r8")
        assert torch.equal(torch.cat(lps), full[120:-1])
        assert torch.equal(prompt_lp[:-1], full[:119])
    for (p, a, _), lp0, lps in zip(own, own_lp, got[3:], strict=True):
        tokens = p + [1] * len(samples[0])
        full = harness.full(tokens, a)
        assert torch.equal(lp0[:-1], full[:len(p) - 1])
        assert torch.equal(torch.cat(lps), full[len(p):-1])


def test_invariance_holds_with_two_threads(harness: Harness) -> None:
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(13)
        tokens = random_tokens(gen, 27)
        alone = harness.full(tokens, "r8")
        assert torch.equal(in_crowd(harness, tokens, "r8", crowd(40, 3), 17), alone)
        decoded = decode(harness, [tokens[:5], tokens[:9]], [tokens[5:17], tokens[9:21]],
                         ["r8", "r32"])
        assert torch.equal(decoded[0], alone[:16])
    finally:
        torch.set_num_threads(1)


def test_fast_mode_is_correct_but_not_invariant() -> None:
    """The same checks fail without padding and tiling: the tests above can fail."""
    fast = Harness(invariant=False)
    gen = torch.Generator().manual_seed(11)
    tokens = random_tokens(gen, 45)
    alone = fast.full(tokens, "r8")
    mixed = in_crowd(fast, tokens, "r8", crowd(63, 2), 31)
    assert torch.allclose(mixed, alone, atol=1e-4)
    prompts, conts = [tokens[:8]], [tokens[8:]]
    decoded = decode(fast, prompts, conts, ["r8"])[0]
    assert torch.allclose(decoded, alone[:-1], atol=1e-4)
    assert not torch.equal(decoded, alone[:-1]) or not torch.equal(mixed, alone)


@pytest.mark.parametrize(("k", "n"), [(512, 512), (512, 1536), (1536, 512), (512, 2048)])
def test_blas_rows_are_invariant_for_row_counts_multiple_of_16(k: int, n: int) -> None:
    """The environment assumption the design rests on; fails loudly on a BLAS/ISA change."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(n, k, generator=gen), torch.randn(1, k, generator=gen)
    reference = F.linear(torch.cat([x, torch.randn(15, k, generator=gen)]), w)[0]
    for m in (16, 32, 48, 112, 256, 1024):
        rows = torch.randn(m, k, generator=gen)
        rows[m // 3] = x[0]
        assert torch.equal(F.linear(rows, w)[m // 3], reference)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_blas_rows_are_invariant_in_attention_tiles_of_any_multiple_of_4_rows(
        threads: int, head_dim: int) -> None:
    """The tile plan's assumption: a query row (or probability row) gives the same bits in
    every ``[rows, head_dim] × [head_dim, 64]`` (and ``[rows, 64] × [64, head_dim]``) matmul
    with rows a multiple of 4, at any row, in a batch of any size."""
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(head_dim)
        keys, values = torch.randn(64, head_dim, generator=gen), torch.randn(64, head_dim,
                                                                             generator=gen)
        q, p = torch.randn(head_dim, generator=gen), torch.randn(64, generator=gen)

        def product(rows: int, at: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
            q_t = torch.randn(count, rows, head_dim, generator=gen)
            p_t = torch.randn(count, rows, 64, generator=gen)
            q_t[count // 2, at], p_t[count // 2, at] = q, p
            k_t = keys.expand(count, 64, head_dim).contiguous()
            v_t = values.expand(count, 64, head_dim).contiguous()
            return (torch.matmul(q_t, k_t.transpose(-1, -2))[count // 2, at],
                    torch.matmul(p_t, v_t)[count // 2, at])

        reference = product(128, 77, 3)
        for rows in (4, 8, 12, 16, 64, 128, 256):
            for at in {0, rows // 2, rows - 1}:
                for count in (1, 2, 33):
                    s, o = product(rows, at, count)
                    assert torch.equal(s, reference[0]) and torch.equal(o, reference[1])
    finally:
        torch.set_num_threads(1)
