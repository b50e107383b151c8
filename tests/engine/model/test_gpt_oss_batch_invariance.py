"""Batch invariance of gpt-oss (attention sinks, 48-key sliding windows, biased experts), on the
bits: the ``small`` gpt-oss built-in's shapes with vocab 2500. A token's logprob is the same
alone and among 63 other sequences, and in a training forward and a prefill + one-token decode
(past the window, across KV blocks), with the samples of one prompt decoding over its shared
pages; fast mode is checked NOT to be invariant, so these tests can fail."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.builtin.model import config_dict
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec
from tests.engine.model.test_batch_invariance import ADAPTERS, Harness
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

SPEC = ModelSpec.from_config({**config_dict("gpt_oss", "small"), "vocab_size": 2500})
NAMES: list[str | None] = [None, *ADAPTERS]


@pytest.fixture(scope="module")
def harness() -> Harness:
    return Harness(spec=SPEC)


def tokens(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, SPEC.vocab_size, (n,), generator=gen).tolist()


def crowd(n: int, seed: int) -> list[SequenceInput]:
    gen = torch.Generator().manual_seed(seed)
    return [SequenceInput(tokens(gen, int(torch.randint(1, 150, (1,), generator=gen))),
                          NAMES[i % len(NAMES)]) for i in range(n)]


def full(h: Harness, seq: list[int], adapter: str | None) -> torch.Tensor:
    return h.logprobs([SequenceInput(seq, adapter)], [[*seq[1:], 0]])[0]


def test_the_model_has_sinks_windows_and_biased_experts(harness: Harness) -> None:
    assert SPEC.sliding_window == 48 and "sliding_attention" in SPEC.layer_types
    assert SPEC.family.attention_sinks and SPEC.experts is not None and SPEC.experts.biases
    assert all(b.name == "tiled" for b in harness.model._backends.values())


def test_logprobs_identical_alone_and_in_a_batch_of_64(harness: Harness) -> None:
    seq = tokens(torch.Generator().manual_seed(1), 140)
    alone = full(harness, seq, "r8")
    others = crowd(63, 2)
    for position in (0, 63):
        seqs = [*others[:position], SequenceInput(seq, "r8"), *others[position:]]
        got = harness.logprobs(seqs, [[*s.tokens[1:], 0] for s in seqs])[position]
        assert torch.equal(got, alone)


def test_samples_decoding_over_a_shared_prompt_equal_the_training_forward(harness: Harness
                                                                         ) -> None:
    """A 100-token prompt prefilled once; three samples share its full page and each own a
    copy of its partial one, decoding 60 tokens (past the window, into a third block)."""
    gen = torch.Generator().manual_seed(31)
    cache = PagedKVCache.allocate(SPEC, 32, 64, harness.model.device, harness.model.dtype)
    prompt = tokens(gen, 100)
    harness.logprobs([SequenceInput(prompt, "r16", 0, [2, 9])], [[*prompt[1:], 0]], cache)
    tables = [[2, 12 + 3 * i, 13 + 3 * i] for i in range(3)]
    for t in tables:
        for pages in cache.paged:
            pages[t[1]] = pages[9]
    samples = [tokens(gen, 60) for _ in range(3)]
    got: list[list[torch.Tensor]] = [[] for _ in range(3)]
    for step in range(len(samples[0]) - 1):
        seqs = [SequenceInput([c[step]], "r16", 100 + step, t)
                for c, t in zip(samples, tables, strict=True)]
        for i, lp in enumerate(harness.logprobs(seqs, [[c[step + 1]] for c in samples], cache)):
            got[i].append(lp)
    for c, lps in zip(samples, got, strict=True):
        assert torch.equal(torch.cat(lps), full(harness, prompt + c, "r16")[100:-1])


def test_fast_mode_is_correct_but_not_invariant() -> None:
    fast = Harness(invariant=False, spec=SPEC)
    seq = tokens(torch.Generator().manual_seed(11), 140)
    alone = full(fast, seq, "r8")
    others = crowd(63, 2)
    seqs = [*others[:31], SequenceInput(seq, "r8"), *others[31:]]
    mixed = fast.logprobs(seqs, [[*s.tokens[1:], 0] for s in seqs])[31]
    assert torch.allclose(mixed, alone, atol=1e-4)
    assert not torch.equal(mixed, alone)
