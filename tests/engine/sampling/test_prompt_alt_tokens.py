"""`prompt_alt_tokens_k`: k draws at every prompt position after the first, from the
distribution the sampler draws from, on counter streams of their own.

Checked on bits: the draws' logprobs are the training forward's log-softmax (T = 1) or the
sampler's tempered one; the same seed gives the same draws whatever else is batched, however
the prompt is cut into prefill pieces and head windows, and whether or not other outputs are
asked; a different seed gives others; and the draws never move a completion's tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from loraplex.engine.sampling.random_stream import PROMPT_ALT_STREAM, stream_key, uniform
from loraplex.engine.sampling.token_sampler import draw_alternatives
from loraplex.errors import UserError
from tests.engine.sampling.rig import NO_STOP, Rig, ok, random_tokens, run, work
from tests.engine.sampling.test_sampler import next_token_logits
from tests.engine.sampling.test_sampler_invariance import crowd

PROMPT = random_tokens(torch.Generator().manual_seed(21), 70)
K = 4


def alt(result) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws ``[len(prompt) - 1, k]`` (tokens, logprobs)."""
    a = result.prompt_alt_tokens
    assert a is not None and (a.rows, a.k) == (len(PROMPT) - 1, K)
    return (torch.tensor(list(a.tokens)).view(a.rows, a.k),
            torch.tensor(list(a.logprobs)).view(a.rows, a.k))


def alt_work(request_id: str = "alt", **kwargs):
    kwargs.setdefault("seed", 5)
    kwargs.setdefault("max_tokens", 4)
    return work(request_id, PROMPT, kwargs.pop("adapter", "a"), prompt_alt_tokens_k=K,
                stop=NO_STOP, **kwargs)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_draws_and_logprobs_are_the_samplers_distribution_at_every_position(
        rig: Rig, temperature: float) -> None:
    """Row i's logprobs are log_softmax(logits / T) at position i (the training forward's bits
    at T = 1) of the drawn tokens, and each draw is the token the sampler's inverse CDF gives
    that row's uniform from the request's alternative stream."""
    tokens, logprobs = alt(ok(run(rig.sampler(), [alt_work(temperature=temperature)])["alt"]))
    logits = next_token_logits(rig, PROMPT, "a")[:-1]
    scaled = logits if temperature == 1 else logits / torch.full((len(logits), 1), temperature)
    expected_V = torch.log_softmax(scaled.float(), dim=-1)
    assert torch.equal(logprobs, expected_V.gather(1, tokens))
    key = stream_key(5, PROMPT_ALT_STREAM)
    u = torch.tensor([[uniform(key, p * K + j) for j in range(K)] for p in range(len(logits))],
                     dtype=torch.float64)
    assert torch.equal(tokens, draw_alternatives(logits, temperature, u)[0])
    assert len(set(tokens.flatten().tolist())) > K, "draws spread over the vocabulary"


def test_greedy_requests_repeat_the_argmax_with_its_untempered_logprob(rig: Rig) -> None:
    tokens, logprobs = alt(ok(run(rig.sampler(), [alt_work(temperature=0.0)])["alt"]))
    logprobs_V = torch.log_softmax(next_token_logits(rig, PROMPT, "a")[:-1].float(), -1)
    assert torch.equal(tokens, logprobs_V.argmax(-1, keepdim=True).expand(-1, K))
    assert torch.equal(logprobs, logprobs_V.max(-1, keepdim=True).values.expand(-1, K))


def test_same_seed_same_draws_alone_among_64_sequences_and_with_other_outputs(
        rig: Rig) -> None:
    """Bitwise the same draws alone, among 61 other sequences, with 3 samples, with
    prompt_logprobs_last_n and top-k prompt logprobs beside them; the completions are the
    ones sampled without any draws; another seed draws differently."""
    plain = ok(run(rig.sampler(), [work("alt", PROMPT, "a", num_samples=3, max_tokens=4,
                                        seed=5, stop=NO_STOP)])["alt"])
    alone = ok(run(rig.sampler(), [alt_work(num_samples=3)])["alt"])
    others = crowd(31, seed=1)
    mixed = ok(run(rig.sampler(), [*others[:17], alt_work(num_samples=3, prompt_logprobs=True,
                                                          prompt_logprobs_last_n=5,
                                                          topk_prompt_logprobs=2),
                                   *others[17:]], decode_steps=3)["alt"])
    assert alone.prompt_alt_tokens == mixed.prompt_alt_tokens
    assert [list(s.tokens) for s in plain.sequences] == \
        [list(s.tokens) for s in alone.sequences] == [list(s.tokens) for s in mixed.sequences]
    assert mixed.prompt_logprobs is not None
    scored = list(mixed.prompt_logprobs)
    assert all(math.isnan(x) for x in scored[:-5])
    tokens, logprobs = alt(mixed)
    for p in range(len(PROMPT) - 6, len(PROMPT) - 1):  # a draw of the prompt's own token
        for j in range(K):
            if tokens[p, j] == PROMPT[p + 1]:
                assert logprobs[p, j].item() == scored[p + 1]
    other = ok(run(rig.sampler(), [alt_work(seed=6)])["alt"])
    assert not torch.equal(alt(other)[0], alt(alone)[0])


def test_a_prompt_prefilled_in_pieces_and_head_windows_draws_the_same_bits(
        rig: Rig, monkeypatch) -> None:
    from loraplex.engine.sampling import prefill, prefill_planner

    whole = ok(run(rig.sampler(), [alt_work()])["alt"])
    monkeypatch.setattr(prefill_planner, "MAX_PREFILL_TOKENS", 32)
    monkeypatch.setattr(prefill_planner, "MIN_PREFILL_PIECE", 16)
    monkeypatch.setattr(prefill, "rows_per_window", lambda *_: 7)
    pieces = ok(run(rig.sampler(), [alt_work()])["alt"])
    assert whole.prompt_alt_tokens == pieces.prompt_alt_tokens
    assert [list(s.tokens) for s in whole.sequences] == [list(s.tokens) for s in pieces.sequences]


def test_a_scoring_only_request_returns_draws_and_a_one_token_prompt_returns_none(
        rig: Rig) -> None:
    scored = ok(run(rig.sampler(), [alt_work(max_tokens=0)])["alt"])
    assert [list(s.tokens) for s in scored.sequences] == [[]]
    assert alt(scored)[0].shape == (len(PROMPT) - 1, K)
    one = ok(run(rig.sampler(), [work("one", PROMPT[:1], None, prompt_alt_tokens_k=K)])["one"])
    assert one.prompt_alt_tokens is not None and (one.prompt_alt_tokens.rows,
                                                  len(one.prompt_alt_tokens.tokens)) == (0, 0)


@pytest.mark.parametrize("k", [-1, 129])
def test_a_k_out_of_range_fails_alone_naming_the_field(rig: Rig, k: int) -> None:
    results = run(rig.sampler(), [work("bad", PROMPT, "a", prompt_alt_tokens_k=k),
                                  work("good", PROMPT, "a", max_tokens=2, seed=1,
                                       stop=NO_STOP)])
    assert isinstance(results["bad"], UserError)
    assert "prompt_alt_tokens_k" in str(results["bad"])
    assert len(ok(results["good"]).sequences[0].tokens) == 2


def test_draw_frequencies_follow_the_tempered_probabilities() -> None:
    """20,000 draws per row: every token's frequency within 4.5 standard errors of its
    probability under log_softmax(logits / T); a zero-probability token is never drawn."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -math.inf, 0.5], [3.0, 0.0, 0.0, 0.0, 1.0]])
    n = 20_000
    u = torch.rand(2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for temperature in (1.0, 0.5, 2.0):
        tokens, logprobs = draw_alternatives(logits, temperature, u)
        probs = torch.softmax(logits / temperature, -1)
        for row in range(2):
            counts = torch.bincount(tokens[row], minlength=5).double() / n
            err = (probs[row] * (1 - probs[row]) / n).sqrt()
            assert ((counts - probs[row]).abs() <= 4.5 * err + 1e-12).all(), (temperature, row)
        assert torch.equal(logprobs, torch.log_softmax(logits / temperature, -1).gather(1, tokens))
