"""Batch invariance of the sampler, asserted on float bits (``torch.equal`` / exact lists).

A sampled token's logprob (temperature 1) must be identical (a) whatever else shares the
batch (alone vs 64 sequences of other adapters and base rows), (b) to the training path's full
forward over the same sequence packed with other sequences, (c) across prefix-cache hit and
miss, and under preemption and recompute. Fast mode is checked to stay close (not equal).
Every check runs with float32 weights and with bfloat16 ones (``engine.dtype=bfloat16``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.engine.model.packed_batch import SequenceInput
from tests.engine.sampling.rig import NO_STOP, Rig, make_rig, ok, random_tokens, run, work


@pytest.fixture(params=["float32", "bfloat16"])
def rig(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Rig:
    rig = make_rig(tiny_model_dir, dtype=request.param)
    label = rig.model.options.label(rig.model.device, rig.model.dtype)
    assert ("/bf16" in label) == (request.param == "bfloat16"), label
    return rig


def crowd(n: int, seed: int) -> list:
    """Other tenants: every adapter and the base model, mixed lengths, G and parameters."""
    gen = torch.Generator().manual_seed(seed)
    names = [None, "a", "b", "c"]
    return [work(f"crowd{i}", random_tokens(gen, 1 + 7 * i % 90), names[i % 4],
                 num_samples=1 + i % 3, max_tokens=5 + i % 40, seed=i,
                 temperature=[1.0, 0.7, 0.0][i % 3], top_p=[1.0, 0.9][i % 2])
            for i in range(n)]


def target(adapter: str | None, **kwargs) -> list:
    gen = torch.Generator().manual_seed(99)
    return [work("target", random_tokens(gen, 77), adapter, num_samples=3, max_tokens=40,
                 seed=7, stop=NO_STOP, **kwargs)]


def test_sampled_logprobs_identical_alone_and_among_64_sequences(rig: Rig) -> None:
    for adapter in ("a", None):
        alone = ok(run(rig.sampler(), target(adapter))["target"])
        others = crowd(31, seed=1)  # 31 requests, 61 sequences
        mixed = ok(run(rig.sampler(), [*others[:17], *target(adapter), *others[17:]],
                       decode_steps=3)["target"])
        assert sum(w.num_samples for w in others) + 3 == 64
        for a, m in zip(alone.sequences, mixed.sequences, strict=True):
            assert list(a.tokens) == list(m.tokens)
            assert a.logprobs.tobytes() == m.logprobs.tobytes()


def test_sampled_logprobs_equal_the_training_forward(rig: Rig) -> None:
    gen = torch.Generator().manual_seed(3)
    others = [SequenceInput(random_tokens(gen, n), a)
              for n, a in ((30, "b"), (5, None), (64, "a"), (11, "c"))]
    for adapter in ("a", "b", None):
        [request] = target(adapter)
        result = ok(run(rig.sampler(), [request])["target"])
        prompt = list(request.prompt)
        for seq in result.sequences:
            full = rig.training_logprobs(prompt + list(seq.tokens), adapter, others)
            expected = full[len(prompt) - 1:]
            assert torch.equal(torch.tensor(list(seq.logprobs)), expected)


def test_prefix_cache_hit_and_miss_give_identical_samples(rig: Rig) -> None:
    sampler = rig.sampler()
    [first] = target("b", prompt_logprobs=True, prompt_logprobs_last_n=5)
    miss = ok(run(sampler, [first])["target"])
    hit = ok(run(sampler, [first])["target"])
    assert miss.prompt_cache_hit_tokens == 0
    assert hit.prompt_cache_hit_tokens == 64  # one full page of the 77-token prompt
    assert hit.prompt_logprobs is not None and miss.prompt_logprobs is not None
    assert hit.prompt_logprobs.tobytes() == miss.prompt_logprobs.tobytes()
    for m, h in zip(miss.sequences, hit.sequences, strict=True):
        assert list(m.tokens) == list(h.tokens)
        assert m.logprobs.tobytes() == h.logprobs.tobytes()


def test_preemption_and_recompute_change_nothing(rig: Rig) -> None:
    gen = torch.Generator().manual_seed(8)
    works = [work("long", random_tokens(gen, 10), "a", num_samples=4, max_tokens=150, seed=1,
                  stop=NO_STOP), *crowd(3, seed=4)]
    roomy = run(rig.sampler(), works)
    tight_sampler = rig.sampler(kv_cache_blocks=6)  # "long" alone needs 4 × 3 pages
    tight = run(tight_sampler, works, decode_steps=16)
    for request_id, outcome in roomy.items():
        for r, t in zip(ok(outcome).sequences, ok(tight[request_id]).sequences, strict=True):
            assert list(r.tokens) == list(t.tokens)
            assert r.logprobs.tobytes() == t.logprobs.tobytes()
    assert tight_sampler.stats.preempted > 0


def test_prompt_logprobs_equal_the_training_forward(rig: Rig) -> None:
    gen = torch.Generator().manual_seed(5)
    prompt = random_tokens(gen, 90)
    result = ok(run(rig.sampler(), [work("p", prompt, "c", max_tokens=1,
                                         prompt_logprobs=True)])["p"])
    assert result.prompt_logprobs is not None
    got = torch.tensor(list(result.prompt_logprobs))
    assert torch.isnan(got[0])
    assert torch.equal(got[1:], rig.training_logprobs(prompt, "c"))


def test_fast_mode_is_close_to_the_training_forward(rig: Rig) -> None:
    [request] = target("a")
    result = ok(run(rig.sampler(batch_invariant=False), [request])["target"])
    prompt = list(request.prompt)
    for seq in result.sequences:
        full = rig.training_logprobs(prompt + list(seq.tokens), "a")[len(prompt) - 1:]
        assert torch.allclose(torch.tensor(list(seq.logprobs)), full, atol=1e-4)


def test_a_long_prompt_prefilled_in_pieces_scores_as_the_training_forward(
        rig: Rig, monkeypatch) -> None:
    """A prompt longer than a prefill forward's budget runs in pieces, its head rows in
    windows; its prompt logprobs (and top-2), first tokens and completions are the training
    forward's bits, beside a short request of the same step."""
    from loraplex.engine.sampling import prefill, prefill_planner

    monkeypatch.setattr(prefill_planner, "MAX_PREFILL_TOKENS", 256)
    monkeypatch.setattr(prefill_planner, "MIN_PREFILL_PIECE", 64)
    monkeypatch.setattr(prefill, "rows_per_window", lambda *_: 96)
    gen = torch.Generator().manual_seed(5)
    long_prompt = random_tokens(gen, 900)
    works = [work("short", random_tokens(gen, 40), "b", max_tokens=6, seed=2, stop=NO_STOP),
             work("long", long_prompt, "a", num_samples=2, max_tokens=6, seed=3, stop=NO_STOP,
                  prompt_logprobs=True, topk_prompt_logprobs=2)]
    s = rig.sampler()
    results = run(s, works)
    assert s.stats.prefill_tokens == 940  # 40 + the long prompt once, in four pieces
    long = ok(results["long"])
    expected = rig.training_logprobs(long_prompt, "a")
    assert long.prompt_logprobs is not None and long.topk_prompt_logprobs is not None
    assert torch.equal(torch.tensor(list(long.prompt_logprobs))[1:], expected)
    batch = rig.model.pack([SequenceInput(long_prompt, "a")])
    lora = rig.bank.stack(batch, rank_multiple=rig.model.rank_multiple, dtype=rig.model.dtype)
    with torch.no_grad():
        logits = rig.model.logits(rig.model.forward(batch, lora), lora)
    top = torch.log_softmax(logits.float(), -1)[:len(long_prompt) - 1].topk(2, dim=-1)
    assert list(long.topk_prompt_logprobs.logprobs)[2:] == top.values.flatten().tolist()
    assert list(long.topk_prompt_logprobs.token_ids)[2:] == top.indices.flatten().tolist()
    for seq in long.sequences:
        full = rig.training_logprobs(long_prompt + list(seq.tokens), "a")
        assert torch.equal(torch.tensor(list(seq.logprobs)), full[len(long_prompt) - 1:])
