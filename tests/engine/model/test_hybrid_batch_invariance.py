"""Batch invariance of a hybrid (Qwen3.5: gated-DeltaNet + gated attention) model, on the bits.

The models: the ``small`` Qwen3.5 built-in's shapes (hidden 512, three linear-attention layers
and one full-attention layer), vocab 2500; and its MoE twin (8 routed experts, top-2, a shared
expert) on the packed GEMM kernel. A token's logprob must not depend on what shares
its batch (alone / among 6 / among 63 other sequences of every adapter), nor on how it was
computed: a training full forward, a prefill then one-token decode steps (the linear layers'
`Carry` at every step, chunks of 16 positions crossed mid-decode), a prefill in pieces cut
inside a chunk, or the samples of one prompt forked from its state. Runs on F.linear and on the
packed GEMM kernel; fast mode is checked NOT to be invariant, so these tests can fail.
"""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.builtin.model import config_dict
from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import base_inner_dims
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec
from tests.engine.model.test_batch_invariance import ADAPTERS, Harness
from tests.engine.threads import one_thread  # noqa: F401  (autouse)


def small_spec(arch: str) -> ModelSpec:
    config = config_dict(arch, "small")
    config["text_config"].update(vocab_size=2500)
    return ModelSpec.from_config(config)


SPEC = small_spec("qwen3_5")
MOE_SPEC = small_spec("qwen3_5_moe")
NAMES: list[str | None] = [None, *ADAPTERS]


@pytest.fixture(scope="module", params=["torch", "native", "moe-native"])
def harness(request: pytest.FixtureRequest) -> Harness:
    if request.param == "torch":
        return Harness(spec=SPEC)
    spec = MOE_SPEC if request.param == "moe-native" else SPEC
    gemm = gemm_kernel(base_inner_dims(spec), torch.device("cpu"), torch.float32)
    if gemm is None:
        pytest.skip("the packed GEMM kernel is not available on this machine")
    h = Harness(spec=spec, gemm=gemm)
    assert h.model.packed_bytes() > 0
    return h


def tokens(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, SPEC.vocab_size, (n,), generator=gen).tolist()


def crowd(n: int, seed: int) -> list[SequenceInput]:
    gen = torch.Generator().manual_seed(seed)
    return [SequenceInput(tokens(gen, int(torch.randint(1, 100, (1,), generator=gen))),
                          NAMES[i % len(NAMES)]) for i in range(n)]


def full(h: Harness, seq: list[int], adapter: str | None) -> torch.Tensor:
    return h.logprobs([SequenceInput(seq, adapter)], [[*seq[1:], 0]])[0]


def test_the_models_are_hybrid() -> None:
    for spec in (SPEC, MOE_SPEC):
        assert spec.linear_layers == (0, 1, 2) and spec.attention_layers == (3,)
    assert MOE_SPEC.experts is not None and MOE_SPEC.experts.shared_intermediate_size


def test_logprobs_identical_alone_and_in_batches_of_7_and_64(harness: Harness) -> None:
    """(The crowd holds base-model rows and every other adapter.)"""
    seq, adapter = tokens(torch.Generator().manual_seed(1), 150), "r8"  # ten delta-rule chunks
    alone = full(harness, seq, adapter)
    for size, seed, positions in ((7, 2, (3,)), (64, 3, (0, 63))):
        others = crowd(size - 1, seed)
        for position in positions:
            seqs = [*others[:position], SequenceInput(seq, adapter), *others[position:]]
            got = harness.logprobs(seqs, [[*s.tokens[1:], 0] for s in seqs])[position]
            assert torch.equal(got, alone)


def decode(h: Harness, prompts: list[list[int]], continuations: list[list[int]],
           adapters: list[str | None], piece: int | None = None) -> list[torch.Tensor]:
    """Prefill the prompts (in two pieces cut at ``piece`` when given), then decode the
    continuations in lockstep, each sequence keyed in the cache's `LinearStates`."""
    cache = PagedKVCache.allocate(h.model.spec, 64, 64, h.model.device, h.model.dtype)
    tables = [[5 * i + j for j in range(5)][::-1] for i in range(len(prompts))]
    out: list[list[torch.Tensor]] = [[] for _ in prompts]
    cuts = [(0, piece), (piece, None)] if piece else [(0, None)]
    for lo, hi in cuts:
        seqs = [SequenceInput(p[lo:hi], a, lo, t, state_key=i)
                for i, (p, a, t) in enumerate(zip(prompts, adapters, tables, strict=True))]
        targets = [[*p[lo + 1:hi + 1 if hi else None], *([] if hi else [c[0]])]
                   for p, c in zip(prompts, continuations, strict=True)]
        for i, lp in enumerate(h.logprobs(seqs, targets, cache)):
            out[i].append(lp)
    for step in range(len(continuations[0]) - 1):
        seqs = [SequenceInput([c[step]], a, len(p) + step, t, state_key=i)
                for i, (p, c, a, t) in enumerate(zip(prompts, continuations, adapters, tables,
                                                      strict=True))]
        for i, lp in enumerate(h.logprobs(seqs, [[c[step + 1]] for c in continuations],
                                          cache)):
            out[i].append(lp)
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("decode_batch", [1, 7])
def test_prefill_and_decode_equal_the_training_forward(harness: Harness,
                                                       decode_batch: int) -> None:
    gen = torch.Generator().manual_seed(decode_batch)
    adapters = ["r8", None, "r32", "r1", "r16", "r8", None][:decode_batch]
    prompts = [tokens(gen, n) for n in (9, 60, 17, 64, 3, 50, 127)[:decode_batch]]
    continuations = [tokens(gen, 80) for _ in range(decode_batch)]  # crosses a chunk
    decoded = decode(harness, prompts, continuations, adapters)
    for p, c, a, lp in zip(prompts, continuations, adapters, decoded, strict=True):
        assert torch.equal(lp, full(harness, p + c, a)[:-1])


def test_a_prefill_in_pieces_cut_inside_a_chunk_equals_one_shot(harness: Harness) -> None:
    gen = torch.Generator().manual_seed(21)
    prompt, cont = tokens(gen, 170), tokens(gen, 12)
    decoded = decode(harness, [prompt], [cont], ["r16"], piece=97)[0]
    assert torch.equal(decoded, full(harness, prompt + cont, "r16")[:-1])


def test_forked_samples_continue_from_the_parents_state(harness: Harness) -> None:
    """One prompt prefilled once; three samples start from copies of its state (as
    `KVPool.copy_partial_pages` copies them) and decode different tokens beside a sequence of
    their own: each equals its own training forward."""
    gen = torch.Generator().manual_seed(31)
    cache = PagedKVCache.allocate(harness.model.spec, 32, 64, harness.model.device,
                                  harness.model.dtype)
    assert cache.linear is not None
    prompt = tokens(gen, 100)
    harness.logprobs([SequenceInput(prompt, "r8", 0, [2, 9], state_key="parent")],
                     [[*prompt[1:], 0]], cache)
    tables = [[2, 12 + 3 * i, 13 + 3 * i] for i in range(3)]
    for i, t in enumerate(tables):
        cache.linear.copy("parent", i)
        for pages in cache.paged:  # the partial page, copy-on-write
            pages[t[1]] = pages[9]
    samples = [tokens(gen, 40) for _ in range(3)]
    got: list[list[torch.Tensor]] = [[] for _ in range(3)]
    for step in range(len(samples[0]) - 1):
        seqs = [SequenceInput([c[step]], "r8", 100 + step, t, state_key=i)
                for i, (c, t) in enumerate(zip(samples, tables, strict=True))]
        for i, lp in enumerate(harness.logprobs(seqs, [[c[step + 1]] for c in samples], cache)):
            got[i].append(lp)
    for c, lps in zip(samples, got, strict=True):
        assert torch.equal(torch.cat(lps), full(harness, prompt + c, "r8")[100:-1])


def test_fast_mode_is_correct_but_not_invariant() -> None:
    fast = Harness(invariant=False, spec=SPEC)
    seq = tokens(torch.Generator().manual_seed(11), 150)
    alone = full(fast, seq, "r8")
    others = crowd(63, 2)
    seqs = [*others[:31], SequenceInput(seq, "r8"), *others[31:]]
    mixed = fast.logprobs(seqs, [[*s.tokens[1:], 0] for s in seqs])[31]
    assert torch.allclose(mixed, alone, atol=1e-4)
    assert not torch.equal(mixed, alone)
