"""Token choice: greedy, temperature, top-k / top-p support, inverse-CDF frequencies, row
independence, and the counter-based random streams behind it."""

from __future__ import annotations

import math

import torch

from loraplex.engine.sampling.random_stream import stream_key, uniform
from loraplex.engine.sampling.token_sampler import RowParams, sample_tokens

CPU = torch.device("cpu")


def params(n: int, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
           uniforms: list[float] | None = None, topk: int = 0) -> RowParams:
    return RowParams.build([temperature] * n, [top_k] * n, [top_p] * n,
                           uniforms if uniforms is not None else [0.5] * n, [topk] * n, CPU)


def test_greedy_takes_the_argmax_and_reports_the_untempered_logprob() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    out = sample_tokens(logits, params(5, temperature=0.0))
    assert out.tokens_B.tolist() == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, out.tokens_B[:, None]).squeeze(1)
    assert torch.equal(out.logprobs_B, expected)


def test_logprobs_are_the_temperature_scaled_distribution_bitwise_at_t1() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    for temperature in (1.0, 0.6):
        out = sample_tokens(logits, params(3, temperature=temperature, uniforms=[0.1, 0.5, 0.9]))
        expected = torch.log_softmax(logits / temperature, -1)
        assert torch.equal(out.logprobs_B, expected.gather(1, out.tokens_B[:, None]).squeeze(1))


def test_inverse_cdf_frequencies_follow_the_probabilities() -> None:
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0, 0.125])
    n = 800
    grid = [(i + 0.5) / n for i in range(n)]
    out = sample_tokens(probs.log().expand(n, 5), params(n, uniforms=grid))
    counts = torch.bincount(out.tokens_B, minlength=5).tolist()
    assert counts == [400, 200, 100, 0, 100]


def test_top_k_then_top_p_restrict_the_support() -> None:
    probs = torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1])
    n = 400
    grid = [(i + 0.5) / n for i in range(n)]
    logits = probs.log().expand(n, 5)

    def support(**kw: float) -> set[int]:
        return set(sample_tokens(logits, params(n, uniforms=grid, **kw)).tokens_B.tolist())

    assert support(top_k=2) == {1, 2}
    assert support(top_p=0.7) == {1, 2}  # 0.4 + 0.3 reaches 0.7
    assert support(top_p=0.71) == {1, 2, 3}
    assert support(top_p=0.01) == {1}  # the most likely token always stays
    assert support(top_k=3, top_p=0.75) == {1, 2}  # renormalised: (0.4 + 0.3) / 0.85 ≥ 0.75
    assert support(top_k=3, top_p=0.9) == {1, 2, 3}


def test_a_rows_token_does_not_depend_on_the_other_rows() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 300, generator=gen)
    rows = RowParams.build([1.0, 0.0, 0.7, 1.3] * 16, [-1, 5, 0, 40] * 16,
                           [1.0, 1.0, 0.9, 0.5] * 16, torch.rand(64, generator=gen).tolist(),
                           [0, 3, 0, 2] * 16, CPU)
    together = sample_tokens(logits, rows)
    for i in (0, 1, 2, 3, 37, 63):
        alone = sample_tokens(logits[i:i + 1], RowParams(
            rows.temperature_B[i:i + 1], rows.top_k_B[i:i + 1], rows.top_p_B[i:i + 1],
            rows.uniform_B[i:i + 1], rows.topk_B[i:i + 1]))
        assert alone.tokens_B.item() == together.tokens_B[i].item()
        assert torch.equal(alone.logprobs_B, together.logprobs_B[i:i + 1])


def test_topk_alternatives_are_sorted_and_include_the_greedy_token() -> None:
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(3))
    out = sample_tokens(logits, params(2, temperature=0.0, topk=4))
    assert out.topk_ids_B_K is not None and out.topk_logprobs_B_K is not None
    assert out.topk_ids_B_K[:, 0].tolist() == out.tokens_B.tolist()
    assert torch.equal(out.topk_logprobs_B_K[:, 0], out.logprobs_B)
    assert (out.topk_logprobs_B_K.diff(dim=1) <= 0).all()


def test_random_streams_are_reproducible_distinct_and_uniform() -> None:
    key = stream_key(42, 0)
    assert key == stream_key(42, 0)
    assert key != stream_key(42, 1) and key != stream_key(43, 0)
    draws = [uniform(key, i) for i in range(20_000)]
    assert draws == [uniform(key, i) for i in range(20_000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    mean = sum(draws) / len(draws)
    assert abs(mean - 0.5) < 4 * math.sqrt(1 / 12 / len(draws))
    deciles = torch.histc(torch.tensor(draws), bins=10, min=0, max=1)
    assert ((deciles - 2000).abs() < 200).all()
    assert stream_key(None, 0) != stream_key(None, 0)  # a fresh seed each time


def test_tokens_match_the_flat_fp64_scan_for_plain_and_truncated_rows() -> None:
    gen = torch.Generator().manual_seed(5)
    vocab = 2500  # two full 1024-token blocks and a ragged one
    logits = torch.randn(24, vocab, generator=gen) * 4
    u = torch.rand(24, generator=gen, dtype=torch.float64)
    rows = RowParams.build([1.0, 0.8, 1.0] * 8, [-1, -1, 50] * 8, [1.0, 1.0, 0.9] * 8,
                           u.tolist(), [0] * 24, CPU)
    out = sample_tokens(logits, rows)
    for i in range(24):
        lp = torch.log_softmax(logits[i] / rows.temperature_B[i], -1)
        order = torch.arange(vocab)
        if i % 3 == 2:  # top-k 50, then top-p 0.9 of what is left, on the sorted distribution
            lp, order = lp.sort(descending=True, stable=True)
            probs = torch.where(torch.arange(vocab) < 50, lp.exp(), 0.0).double()
            cum = probs.cumsum(0)
            lp = torch.where(((cum - probs) / cum[-1] < 0.9) & (probs > 0), lp, -torch.inf)
        cum = lp.exp().double().cumsum(0)
        expected = order[torch.searchsorted(cum, u[i] * cum[-1], right=True)]
        assert out.tokens_B[i].item() == expected.item()
