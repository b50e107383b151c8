"""Sampler behaviour: Tinker's sampling parameters, stops, scores, validation, continuous
batching, prefix sharing and adapter lifecycle, on the built-in tiny model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from tokenizers import Tokenizer

from loraplex.domain.sampling import StopCondition
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.sequence import TOPK_SENTINEL
from loraplex.errors import NotFoundError, UserError
from tests.engine.sampling.rig import NO_STOP, Rig, make_rig, ok, random_tokens, run, work

PROMPT = list(range(40, 110))  # 70 tokens: one full page + a partial one


def next_token_logits(rig: Rig, tokens: list[int], adapter: str | None) -> torch.Tensor:
    """Training-path logits ``[len(tokens), vocab]`` of a full forward."""
    batch = rig.model.pack([SequenceInput(tokens, adapter)])
    lora = rig.bank.stack(batch, rank_multiple=rig.model.rank_multiple, dtype=torch.float32)
    with torch.no_grad():
        return batch.gather_from_rows(rig.model.logits(rig.model.forward(batch, lora), lora))


def greedy(rig: Rig, n: int, adapter: str | None = "a", prompt: list[int] = PROMPT) -> list[int]:
    result = ok(run(rig.sampler(), [work("g", prompt, adapter, max_tokens=n, temperature=0.0,
                                         stop=NO_STOP)])["g"])
    return list(result.sequences[0].tokens)


# ---- sampling parameters -----------------------------------------------------------------


def test_same_seed_same_tokens_and_the_samples_of_a_request_differ(rig: Rig) -> None:
    first = ok(run(rig.sampler(), [work("r", PROMPT, "a", 4, max_tokens=12, seed=5,
                                        stop=NO_STOP)])["r"])
    again = ok(run(rig.sampler(), [work("r", PROMPT, "a", 4, max_tokens=12, seed=5,
                                        stop=NO_STOP)])["r"])
    other = ok(run(rig.sampler(), [work("r", PROMPT, "a", 4, max_tokens=12, seed=6,
                                        stop=NO_STOP)])["r"])
    tokens = [list(s.tokens) for s in first.sequences]
    assert tokens == [list(s.tokens) for s in again.sequences]
    assert tokens != [list(s.tokens) for s in other.sequences]
    assert len({tuple(t) for t in tokens}) == 4


def test_greedy_follows_the_argmax_of_the_training_forward(rig: Rig) -> None:
    tokens = greedy(rig, 10)
    logits = next_token_logits(rig, PROMPT + tokens, "a")[len(PROMPT) - 1:-1]
    assert logits.argmax(-1).tolist() == tokens


def test_temperature_scales_the_reported_logprobs(rig: Rig) -> None:
    """Tinker reports log p_T = log_softmax(logits / T) of the sampled token."""
    logits = next_token_logits(rig, PROMPT, "a")[-1]
    for temperature in (0.5, 1.7):
        result = ok(run(rig.sampler(), [work("t", PROMPT, "a", 8, max_tokens=1, seed=1,
                                             temperature=temperature)])["t"])
        expected = torch.log_softmax(logits / temperature, dim=-1)
        for seq in result.sequences:
            assert seq.logprobs[0] == pytest.approx(float(expected[seq.tokens[0]]), abs=1e-5)


def test_top_k_and_top_p_restrict_the_support(rig: Rig) -> None:
    logits = next_token_logits(rig, PROMPT, None)[-1]
    probs = torch.softmax(logits / 3.0, dim=-1)  # a hot temperature spreads the mass
    order = probs.argsort(descending=True).tolist()
    nucleus = order[:int((probs[order].cumsum(0) < 0.3).sum()) + 1]
    top3 = set(order[:3])
    top_k = ok(run(rig.sampler(), [work("k", PROMPT, None, 64, max_tokens=1, seed=2,
                                        temperature=3.0, top_k=3)])["k"])
    top_p = ok(run(rig.sampler(), [work("p", PROMPT, None, 64, max_tokens=1, seed=2,
                                        temperature=3.0, top_p=0.3)])["p"])
    plain = ok(run(rig.sampler(), [work("n", PROMPT, None, 64, max_tokens=1, seed=2,
                                        temperature=3.0)])["n"])
    assert {s.tokens[0] for s in top_k.sequences} <= top3
    assert {s.tokens[0] for s in top_p.sequences} <= set(nucleus)
    assert not {s.tokens[0] for s in plain.sequences} <= top3 | set(nucleus)


# ---- stops -------------------------------------------------------------------------------


def test_stop_token_ids_end_the_completion_and_are_kept(rig: Rig) -> None:
    tokens = greedy(rig, 12)
    stop_at = next(i for i in range(3, 12) if tokens[i] not in tokens[:i])
    result = ok(run(rig.sampler(), [work("s", PROMPT, "a", max_tokens=12, temperature=0.0,
                                         stop=StopCondition(token_ids=(tokens[stop_at],)))])["s"])
    seq = result.sequences[0]
    assert list(seq.tokens) == tokens[:stop_at + 1]
    assert seq.stop_reason == "stop"
    assert len(seq.logprobs) == stop_at + 1


def test_eos_stops_by_default_and_an_empty_stop_list_samples_past_it(rig: Rig) -> None:
    tokens = greedy(rig, 12)
    eos = next(t for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    spec = replace(rig.model.spec, eos_token_ids=(eos,))
    rig.model = Transformer(spec, rig.model.weights, rig.model.options)
    stopped = ok(run(rig.sampler(), [work("e", PROMPT, "a", max_tokens=12,
                                          temperature=0.0)])["e"]).sequences[0]
    assert list(stopped.tokens) == tokens[:tokens.index(eos) + 1]
    assert stopped.stop_reason == "stop"
    past = ok(run(rig.sampler(), [work("e", PROMPT, "a", max_tokens=12, temperature=0.0,
                                       stop=NO_STOP)])["e"]).sequences[0]
    assert list(past.tokens) == tokens and past.stop_reason == "length"


def test_stop_strings_keep_the_tokens_through_the_one_that_completes_them(rig: Rig) -> None:
    tokenizer = Tokenizer.from_file(str(rig.model_dir / "tokenizer.json"))
    tokens = greedy(rig, 16)
    texts = [tokenizer.decode(tokens[:i + 1], skip_special_tokens=False) for i in range(16)]
    end = next(i for i in range(4, 16) if len(texts[i]) > len(texts[i - 1]) + 1
               and texts[i][-2:] not in texts[i - 1])
    stop = texts[end][-2:]  # two characters the end-th token completes
    result = ok(run(rig.sampler(), [work("s", PROMPT, "a", max_tokens=16, temperature=0.0,
                                         stop=StopCondition(strings=(stop,)))])["s"])
    seq = result.sequences[0]
    first = next(i for i, t in enumerate(texts) if stop in t)
    assert list(seq.tokens) == tokens[:first + 1] and seq.stop_reason == "stop"


def test_max_tokens_none_runs_to_the_context_limit(tiny_model_dir) -> None:
    rig = make_rig(tiny_model_dir, max_context=80)
    result = ok(run(rig.sampler(), [work("c", PROMPT, "b", 2, stop=NO_STOP)])["c"])
    assert [len(s.tokens) for s in result.sequences] == [10, 10]
    assert {s.stop_reason for s in result.sequences} == {"length"}


# ---- scores ------------------------------------------------------------------------------


def test_prompt_logprobs_last_n_and_topk_prompt_logprobs(rig: Rig) -> None:
    full = rig.training_logprobs(PROMPT, "b")
    result = ok(run(rig.sampler(), [work("p", PROMPT, "b", max_tokens=1, prompt_logprobs=True,
                                         prompt_logprobs_last_n=6,
                                         topk_prompt_logprobs=3)])["p"])
    assert result.prompt_logprobs is not None and result.topk_prompt_logprobs is not None
    got = list(result.prompt_logprobs)
    assert len(got) == len(PROMPT)
    assert all(math.isnan(x) for x in got[:-6])
    assert got[-6:] == full[-6:].tolist()
    topk = result.topk_prompt_logprobs
    assert (topk.k, topk.length) == (3, len(PROMPT))
    ids, lps = list(topk.token_ids), list(topk.logprobs)
    assert ids[:3 * (len(PROMPT) - 6)] == [TOPK_SENTINEL[0]] * (3 * (len(PROMPT) - 6))
    assert lps[:3] == [TOPK_SENTINEL[1]] * 3
    last = ids[-3:]
    assert PROMPT[-1] not in last or lps[-3 + last.index(PROMPT[-1])] == pytest.approx(got[-1])
    assert lps[-3] >= lps[-2] >= lps[-1] >= got[-1] or PROMPT[-1] in last


def test_topk_sample_logprobs_hold_the_greedy_token_first(rig: Rig) -> None:
    result = ok(run(rig.sampler(), [work("k", PROMPT, "a", max_tokens=5, temperature=0.0,
                                         stop=NO_STOP, topk_sample_logprobs=4)])["k"])
    seq = result.sequences[0]
    assert seq.topk_logprobs is not None and (seq.topk_logprobs.k, seq.topk_logprobs.length) \
        == (4, 5)
    ids, lps = list(seq.topk_logprobs.token_ids), list(seq.topk_logprobs.logprobs)
    assert ids[::4] == list(seq.tokens)
    assert lps[::4] == list(seq.logprobs)


def test_max_tokens_zero_returns_scores_and_empty_completions(rig: Rig) -> None:
    result = ok(run(rig.sampler(), [work("z", PROMPT, None, 2, max_tokens=0,
                                         prompt_logprobs=True)])["z"])
    assert [list(s.tokens) for s in result.sequences] == [[], []]
    assert {s.stop_reason for s in result.sequences} == {"length"}
    assert result.prompt_logprobs is not None
    assert list(result.prompt_logprobs)[1:] == rig.training_logprobs(PROMPT, None).tolist()


# ---- validation and failures -------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(prompt=[]), "prompt"),
    (dict(prompt=[5] * 9000), "prompt"),  # the tiny model's context is 8192
    (dict(prompt=[1, 2, 5000]), "prompt[2]"),
    (dict(max_tokens=-1), "sampling_params.max_tokens"),
    (dict(top_p=0.0), "sampling_params.top_p"),
    (dict(top_p=1.5), "sampling_params.top_p"),
    (dict(temperature=-1.0), "sampling_params.temperature"),
    (dict(top_k=-2), "sampling_params.top_k"),
    (dict(num_samples=0), "num_samples"),
    (dict(topk_sample_logprobs=100_000), "topk_sample_logprobs"),
    (dict(topk_prompt_logprobs=-1), "topk_prompt_logprobs"),
    (dict(prompt_logprobs_last_n=3), "prompt_logprobs_last_n"),
    (dict(stop=StopCondition(token_ids=(1, 99_999))), "sampling_params.stop[1]"),
    (dict(stop=StopCondition(strings=("",))), "sampling_params.stop"),
    (dict(num_samples=1000), "num_samples"),  # prompt + tails exceed the 256-page cache
])
def test_invalid_requests_fail_alone_naming_the_field(rig: Rig, kwargs: dict,
                                                      field: str) -> None:
    prompt = kwargs.pop("prompt", PROMPT)
    num_samples = kwargs.pop("num_samples", 1)
    bad = work("bad", prompt, "a", num_samples, **kwargs)
    outcomes = run(rig.sampler(), [bad, work("good", PROMPT, "a", max_tokens=3)])
    error = outcomes["bad"]
    assert isinstance(error, UserError) and error.field == field, error
    assert len(ok(outcomes["good"]).sequences[0].tokens) <= 3


def test_a_request_whose_adapter_is_not_resident_fails_alone(rig: Rig) -> None:
    # Neither the sampler nor `Engine.sample_step` loads adapters: the scheduler installs them
    outcomes = run(rig.sampler(), [work("x", PROMPT, "missing", adapter_dir="/ckpt/x"),
                                   work("y", PROMPT, "a", max_tokens=2)])
    assert isinstance(outcomes["x"], NotFoundError)
    ok(outcomes["y"])


def test_an_adapter_deleted_while_sampling_fails_only_its_requests(rig: Rig) -> None:
    sampler = rig.sampler()
    assert sampler.step([work("c", PROMPT, "c", 2, max_tokens=50, stop=NO_STOP),
                         work("a", PROMPT, "a", max_tokens=50, stop=NO_STOP)], 2) == []
    rig.bank.delete("c")
    outcomes = run(sampler, [])
    assert isinstance(outcomes["c"], NotFoundError)
    assert len(ok(outcomes["a"]).sequences[0].tokens) == 50
    assert sampler.pool.num_free == 256  # the failed request's pages came back


# ---- continuous batching, sharing, caching -----------------------------------------------


def test_requests_join_and_leave_the_running_batch_between_steps(rig: Rig) -> None:
    sampler = rig.sampler()
    assert sampler.step([work("long", PROMPT, "a", max_tokens=30, stop=NO_STOP)], 4) == []
    assert sampler.num_running() == 1
    done = sampler.step([work("short", PROMPT[:20], "b", max_tokens=3, stop=NO_STOP)], 4)
    assert [rid for rid, _ in done] == ["short"]
    assert sampler.num_running() == 1
    outcomes = run(sampler, [])
    assert len(ok(outcomes["long"]).sequences[0].tokens) == 30


@pytest.mark.parametrize("prompt_len", [70, 64])
def test_the_samples_of_a_request_compute_the_prompt_once(rig: Rig, prompt_len: int) -> None:
    prompt = PROMPT[:prompt_len]
    sampler = rig.sampler()
    sampler.step([work("g", prompt, "a", 8, max_tokens=40, stop=NO_STOP, seed=3)], 0)
    assert sampler.stats.prefill_tokens == prompt_len
    refs = sorted(b.ref_count for b in sampler.pool.blocks.blocks if b.ref_count)
    if prompt_len % 64:  # a shared full page, and a private copy of the partial page each
        assert refs == [1] * 8 + [8]
    else:  # the prompt fills its page: all share it, each takes a new page to continue
        assert refs == [8]
    result = ok(run(sampler, [])["g"])
    for seq in result.sequences:  # sharing is exact: each sample equals the training forward
        full = rig.training_logprobs(prompt + list(seq.tokens), "a")[prompt_len - 1:]
        assert torch.equal(torch.tensor(list(seq.logprobs)), full)


def test_same_step_requests_with_the_same_prompt_fork_from_one_prefill(rig: Rig) -> None:
    sampler = rig.sampler()
    outcomes = run(sampler, [work(f"r{i}", PROMPT, "b", max_tokens=4, seed=i) for i in range(4)])
    assert sampler.stats.prefill_tokens == len(PROMPT)
    assert [ok(outcomes[f"r{i}"]).prompt_cache_hit_tokens for i in range(4)] == [0, 70, 70, 70]
    solo = ok(run(rig.sampler(), [work("r2", PROMPT, "b", max_tokens=4, seed=2)])["r2"])
    assert list(solo.sequences[0].tokens) == list(ok(outcomes["r2"]).sequences[0].tokens)


def test_a_request_can_fork_from_a_scoring_request_that_samples_nothing(rig: Rig) -> None:
    sampler = rig.sampler()
    outcomes = run(sampler, [work("score", PROMPT, "c", max_tokens=0, prompt_logprobs=True),
                             work("gen", PROMPT, "c", 2, max_tokens=5, seed=1)])
    assert sampler.stats.prefill_tokens == len(PROMPT)
    assert [list(s.tokens) for s in ok(outcomes["score"]).sequences] == [[]]
    assert ok(outcomes["gen"]).prompt_cache_hit_tokens == len(PROMPT)
    solo = ok(run(rig.sampler(), [work("gen", PROMPT, "c", 2, max_tokens=5, seed=1)])["gen"])
    assert [list(s.tokens) for s in solo.sequences] == \
        [list(s.tokens) for s in ok(outcomes["gen"]).sequences]


def test_base_model_and_adapter_versions_never_share_cached_pages(rig: Rig) -> None:
    sampler = rig.sampler()

    def hits(adapter: str | None) -> int:
        return ok(run(sampler, [work("h", PROMPT, adapter, max_tokens=1)])["h"]
                  ).prompt_cache_hit_tokens

    assert [hits(None), hits("a"), hits("b"), hits("a"), hits(None)] == [0, 0, 0, 64, 64]
    sampler.invalidate_adapter("a")  # e.g. an optim_step changed a live adapter in place
    assert [hits("a"), hits("b")] == [0, 64]
    adapter = rig.bank.get("b")
    rig.bank.delete("b")
    rig.bank.put("b", adapter.frozen_copy())  # same id, another object: another version
    assert hits("b") == 0


def test_a_full_cache_makes_admission_wait_without_corrupting_running_sequences(
        tiny_model_dir) -> None:
    rig = make_rig(tiny_model_dir, kv_cache_blocks=8)
    gen = torch.Generator().manual_seed(1)
    works = [work(f"w{i}", random_tokens(gen, 60 + i), "abc"[i % 3] if i % 4 else None, 2,
                  max_tokens=70, seed=i, stop=NO_STOP) for i in range(6)]
    sampler = rig.sampler()
    assert sampler.step(works, 1) == []
    assert sampler.num_running() == 6
    tight = run(sampler, [])
    roomy = run(make_rig(tiny_model_dir).sampler(), works)
    for request_id, outcome in roomy.items():
        assert [list(s.tokens) for s in ok(tight[request_id]).sequences] == \
            [list(s.tokens) for s in ok(outcome).sequences]
    assert sampler.pool.num_free == 8


def test_in_place_weight_changes_reach_running_sequences_only_after_invalidate(
        rig: Rig) -> None:
    """Stacked LoRA tensors are reused across decode steps; the engine's `invalidate_adapter`
    (after an optim_step on a live id) is what makes new weights visible."""
    request = [work("r", PROMPT, "a", max_tokens=12, temperature=0.0, stop=NO_STOP)]
    reference = greedy(rig, 12)

    def run_with_edit(invalidate: bool) -> list[int]:
        sampler = rig.sampler()
        assert sampler.step(request, 3) == []
        original = {t: w.b_L_O_Rk.detach().clone() for t, w in rig.bank.get("a").weights.items()}
        with torch.no_grad():
            for w in rig.bank.get("a").weights.values():
                w.b_L_O_Rk.mul_(-20.0)
        if invalidate:
            sampler.invalidate_adapter("a")
        tokens = list(ok(run(sampler, [])["r"]).sequences[0].tokens)
        with torch.no_grad():
            for t, w in rig.bank.get("a").weights.items():
                w.b_L_O_Rk.copy_(original[t])
        return tokens

    assert run_with_edit(invalidate=False) == reference
    changed = run_with_edit(invalidate=True)
    assert changed[:4] == reference[:4] and changed != reference


def test_a_bug_during_a_step_drops_everything_and_the_sampler_keeps_working(rig: Rig) -> None:
    sampler = rig.sampler()
    assert sampler.step([work("ok", PROMPT, "a", max_tokens=20, stop=NO_STOP)], 1) == []
    forward = rig.model.forward

    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("bug")

    rig.model.forward = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        sampler.step([work("doomed", PROMPT[:66], "a", max_tokens=3)], 1)
    rig.model.forward = forward  # type: ignore[method-assign]
    assert sampler.num_running() == 0 and sampler.pool.num_free == 256
    again = ok(run(sampler, [work("again", PROMPT[:66], "a", max_tokens=3)])["again"])
    assert again.prompt_cache_hit_tokens == 0  # pages registered before the bug are forgotten


# ---- streaming and cancellation ---------------------------------------------------------


def test_streamed_deltas_rebuild_the_result_through_preemption(tiny_model_dir) -> None:
    """Deltas of a streamed request only append, and joined they are the finished request's
    tokens, logprobs and top-k, bitwise, even when its sequences are preempted (a cache of 8
    pages) and recomputed; requests that do not stream report nothing."""
    rig = make_rig(tiny_model_dir, kv_cache_blocks=8)
    gen = torch.Generator().manual_seed(1)
    works = [work(f"w{i}", random_tokens(gen, 60 + i), "abc"[i % 3] if i % 4 else None, 2,
                  max_tokens=70, seed=i, stop=NO_STOP, topk_sample_logprobs=2, stream=i != 3)
             for i in range(6)]
    sampler = rig.sampler()
    got: dict[tuple[str, int], tuple[list[int], list[float], list[int]]] = {}
    finished = {}
    pending = works
    while pending or sampler.num_running():
        finished.update(sampler.step(pending, 1 if pending else 3))
        pending = []
        for delta in sampler.progress():
            tokens, logprobs, topk = got.setdefault((delta.request_id, delta.index), ([], [], []))
            assert delta.start == len(tokens)
            tokens += delta.tokens
            logprobs += delta.logprobs
            assert delta.topk_logprobs is not None and delta.topk_logprobs.k == 2
            topk += delta.topk_logprobs.token_ids
    assert sampler.stats.preempted > 0
    assert {rid for rid, _ in got} == {"w0", "w1", "w2", "w4", "w5"}
    for (rid, index), (tokens, logprobs, topk) in got.items():
        seq = ok(finished[rid]).sequences[index]
        n = len(tokens)
        assert 0 < n <= len(seq.tokens)
        assert tokens == list(seq.tokens[:n]) and logprobs == list(seq.logprobs[:n])
        assert seq.topk_logprobs is not None
        assert topk == list(seq.topk_logprobs.token_ids[:2 * n])


def test_cancelling_a_running_request_frees_its_pages_at_once(rig: Rig) -> None:
    """After the cancel the pool is as if only the other request had ever run."""
    other = work("other", PROMPT[:30], "b", max_tokens=20, seed=4, stop=NO_STOP)
    alone = rig.sampler()
    assert alone.step([other], 3) == []
    sampler = rig.sampler()
    long = work("long", PROMPT, "a", 2, max_tokens=200, stop=NO_STOP, stream=True)
    assert sampler.step([long, other], 3) == []
    assert sampler.pool.num_free < alone.pool.num_free
    error = UserError("cancelled")
    assert sampler.cancel(["long", "unknown"], error) == [("long", error)]
    assert sampler.pool.num_free == alone.pool.num_free
    assert sampler.num_running() == 1 and sampler.progress() == []
    outcomes = run(sampler, [])
    assert list(outcomes) == ["other"]
    assert ok(outcomes["other"]).sequences[0].tokens == \
        ok(run(alone, [])["other"]).sequences[0].tokens


def test_a_short_prompt_passes_a_long_one_waiting_for_pages(tiny_model_dir) -> None:
    """With the cache full, a long prompt waits for pages and the long prompts behind it keep
    their order, but a short request admitted after them runs now, with the same tokens as
    alone."""
    rig = make_rig(tiny_model_dir, kv_cache_blocks=12)
    gen = torch.Generator().manual_seed(5)
    running = work("running", random_tokens(gen, 500), None, max_tokens=60, seed=1,
                   stop=NO_STOP)
    sampler = rig.sampler()
    assert sampler.step([running], 1) == []
    longs = [work(f"long{i}", random_tokens(gen, 600), None, max_tokens=4, seed=i,
                  stop=NO_STOP) for i in range(2)]
    short = work("short", PROMPT[:20], None, max_tokens=3, seed=2, stop=NO_STOP)
    done = dict(sampler.step([*longs, short], 4))
    assert list(done) == ["short"], "the short one passed the long ones waiting for pages"
    alone = ok(run(make_rig(tiny_model_dir).sampler(), [short])["short"])
    assert ok(done["short"]).sequences[0].tokens == alone.sequences[0].tokens
    order = [rid for rid in run(sampler, []) if rid.startswith("long")]
    assert order == ["long0", "long1"]


def test_while_sequences_decode_a_long_prompt_is_prefilled_a_budget_per_step(
        tiny_model_dir) -> None:
    """With sequences decoding, a step prefills at most ``sample_prefill_tokens_per_step``
    tokens of a long prompt (a short prompt admitted beside it is not held back), and the
    pieces give the tokens and prompt logprobs of an unbounded prefill, bitwise."""
    gen = torch.Generator().manual_seed(9)
    running = work("running", PROMPT, "a", max_tokens=40, seed=1, stop=NO_STOP)
    long = work("long", random_tokens(gen, 3000), "b", max_tokens=5, seed=2, stop=NO_STOP,
                prompt_logprobs=True)
    short = work("short", PROMPT[:12], None, max_tokens=2, seed=3, stop=NO_STOP)
    bounded = make_rig(tiny_model_dir, sample_prefill_tokens_per_step=1000).sampler()
    assert bounded.step([running], 1) == []
    before = bounded.stats.prefill_tokens
    done = dict(bounded.step([long, short], 1))
    assert bounded.stats.prefill_tokens - before <= 1000 + len(short.prompt)
    assert list(done) == ["short"], "the short prompt went past the long one's pieces"
    outcomes = {**done, **run(bounded, [], decode_steps=1)}
    free = run(make_rig(tiny_model_dir).sampler(), [running, long, short])
    for rid in ("running", "long", "short"):
        assert ok(outcomes[rid]).sequences[0].tokens == ok(free[rid]).sequences[0].tokens
    assert list(ok(outcomes["long"]).prompt_logprobs)[1:] == \
        list(ok(free["long"]).prompt_logprobs)[1:]
