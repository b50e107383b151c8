"""Decode steps shared between tenants (`StepShare`): the deficit round-robin over KV positions
on plain records, and in the sampler: a short sample beside a heavy sampler finishes in a few
cheap steps, with the same tokens and logprobs, bit for bit, as without sharing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from loraplex.engine.sampling.step_share import ROW_COST, SHARED_STEPS_PER_CALL, StepShare
from tests.engine.sampling.rig import NO_STOP, make_rig, ok, random_tokens, run, work


def seq(tenant: str, context: int) -> Any:
    """What `StepShare` reads of a sequence: its tenant, context length and last step."""
    return SimpleNamespace(request=SimpleNamespace(work=SimpleNamespace(tenant=tenant)),
                           num_computed=context, decoded_at=0)


def test_alone_every_sequence_decodes_every_step() -> None:
    share = StepShare(decode_kv_tokens=1000, prefill_tokens=16, linger_steps=4)
    heavy = [seq("h", 5000) for _ in range(6)]
    for _ in range(5):
        assert share.decode_set(heavy, []) == heavy
    assert not share.shared and share.deferred == 0


def test_beside_a_light_tenant_the_heavy_one_decodes_its_credit_round_robin() -> None:
    quantum = 2 * (1000 + ROW_COST)
    share = StepShare(decode_kv_tokens=quantum, prefill_tokens=16, linger_steps=4)
    heavy = [seq("h", 1000) for _ in range(6)]
    light = seq("l", 10)
    counts = {id(s): 0 for s in heavy}
    for _ in range(9):
        chosen = share.decode_set([*heavy, light], [])
        assert light in chosen, "the light tenant is under its credit: it decodes every step"
        mine = [s for s in chosen if s is not light]
        assert len(mine) == 2, "two heavy rows fit one step's credit"
        for s in mine:
            counts[id(s)] += 1
    assert sorted(counts.values()) == [3] * 6, "longest-waiting first: each heavy row in turn"
    assert share.shared and share.deferred == 9 * 4


def test_a_row_longer_than_one_steps_credit_decodes_once_credit_has_accumulated() -> None:
    share = StepShare(decode_kv_tokens=1000, prefill_tokens=16, linger_steps=4)
    long, light = seq("h", 2500), seq("l", 10)
    steps = [long in share.decode_set([long, light], []) for _ in range(9)]
    # cost 2564 against 1000 a step: decodes in every third step, credit carried over
    assert steps == [False, False, True] * 3


def test_a_step_never_decodes_nothing() -> None:
    """Alone but lingering (shared), with every row longer than a step's credit: the
    longest-waiting row decodes anyway, one a step."""
    share = StepShare(decode_kv_tokens=1000, prefill_tokens=16, linger_steps=8)
    share.decode_set([seq("l", 10), seq("h", 10)], [])
    heavy = [seq("h", 2500), seq("h", 2500)]
    chosen = [share.decode_set(heavy, []) for _ in range(6)]
    assert all(len(c) >= 1 for c in chosen)
    assert [c[0] is heavy[0] for c in chosen][:2] == [True, False], "in turn"
    assert [len(c) for c in chosen] == [1] * 6


def test_a_tenant_counts_as_sampling_for_linger_steps_after_it_left() -> None:
    share = StepShare(decode_kv_tokens=1000, prefill_tokens=16, linger_steps=3)
    heavy = [seq("h", 5000)]
    share.decode_set([*heavy, seq("l", 10)], [])
    assert share.shared
    flags = []
    for _ in range(5):
        share.decode_set(heavy, [])
        flags.append(share.shared)
    assert flags == [True, True, True, False, False]
    assert StepShare(0, 16, 3).refresh([*heavy, seq("l", 10)], []) is False  # 0: off


def test_a_short_sample_beside_long_prompts_finishes_first_with_the_same_bits(
        tiny_model_dir: Path) -> None:
    """A heavy tenant's long prompts being prefilled and decoded, a light tenant's 8-token
    sample admitted beside them: with sharing the light one is back after a few steps, each
    of which prefilled at most ``sample_shared_prefill_tokens``; without it its steps carry
    the full prefill budget. Every request's tokens and logprobs are the same either way."""
    gen = torch.Generator().manual_seed(3)
    heavy = [work(f"heavy{i}", random_tokens(gen, 1200), None, max_tokens=12, seed=i,
                  stop=NO_STOP, tenant="h") for i in range(4)]
    light = work("light", random_tokens(gen, 8), None, max_tokens=8, seed=9, stop=NO_STOP,
                 tenant="l")
    results, prefilled = {}, {}
    for name, kv in (("shared", 2000), ("unshared", 0)):
        sampler = make_rig(tiny_model_dir, kv_cache_blocks=512,
                           sample_shared_decode_kv_tokens=kv,
                           sample_shared_prefill_tokens=32).sampler()
        out = dict(sampler.step(heavy[:2], 1))  # two heavy requests running
        before = sampler.stats.prefill_tokens
        calls = 0
        while "light" not in out:
            out.update(sampler.step([light, *heavy[2:]] if calls == 0 else [], 8))
            calls += 1
        prefilled[name] = sampler.stats.prefill_tokens - before
        if name == "shared":
            assert calls <= 8 // SHARED_STEPS_PER_CALL + 1
            assert prefilled[name] <= 32 * (8 + calls) + len(light.prompt)
        out.update(run(sampler, []))
        results[name] = out
    assert prefilled["unshared"] > 4 * prefilled["shared"]
    for rid in ["light", *(w.request_id for w in heavy)]:
        a, b = ok(results["shared"][rid]), ok(results["unshared"][rid])
        assert a.sequences[0].tokens == b.sequences[0].tokens, rid
        assert a.sequences[0].logprobs == b.sequences[0].logprobs, rid


def test_short_prompts_of_several_tenants_past_a_spent_budget_all_finish(
        tiny_model_dir: Path) -> None:
    """Prompts longer than a shared step's prefill budget but short enough to pass it (≤ 512
    tokens), from several tenants at once, beside a running sequence: each is prefilled
    whole or in the one piece in progress, and every request comes back (a second piece once
    replaced the one in progress, whose request then never finished)."""
    gen = torch.Generator().manual_seed(4)
    sampler = make_rig(tiny_model_dir, sample_shared_decode_kv_tokens=2000,
                       sample_shared_prefill_tokens=32).sampler()
    running = work("running", random_tokens(gen, 8), None, max_tokens=30, seed=1,
                   stop=NO_STOP, tenant="r")
    assert sampler.step([running], 1) == []
    shorts = [work(f"short{i}", random_tokens(gen, 100 + 7 * i), None, max_tokens=3, seed=i,
                   stop=NO_STOP, tenant=f"t{i}") for i in range(4)]
    out = dict(sampler.step(shorts, 2))
    for _ in range(200):
        if len(out) == 5:
            break
        out.update(sampler.step([], 2))
    assert sorted(out) == sorted(["running", *(w.request_id for w in shorts)])
    alone = run(make_rig(tiny_model_dir).sampler(), shorts)
    for w in shorts:
        assert ok(out[w.request_id]).sequences[0].tokens == \
            ok(alone[w.request_id]).sequences[0].tokens
