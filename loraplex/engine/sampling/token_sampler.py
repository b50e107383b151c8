"""Choosing next tokens from a batch of logits rows, each row with its own parameters.

Every operation is row-local (log_softmax, sort, block sums and running sums, argmax over one
row), and each row's randomness is one uniform from its own counter stream (`random_stream`),
drawn by inverse CDF (`inverse_cdf`: a zero-probability token is never chosen), so a row's
token never depends on the other rows. Logprobs are Tinker's: the log-probability
of the token under the temperature-scaled distribution ``log_softmax(logits / T)`` before top-k
/ top-p truncation (at T = 1 exactly the training forward's logprob, bit for bit; greedy rows
report T = 1). Knows nothing about sequences, stops or the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.sampling.inverse_cdf import inverse_cdf, inverse_cdf_draws


@dataclass(frozen=True)
class RowParams:
    """Sampling parameters of each row (all ``[B]``).

    Attributes:
        temperature_B: 0 → greedy (argmax).
        top_k_B: keep the k most likely tokens; ≤ 0 or ≥ vocab: off.
        top_p_B: keep the smallest most-likely set with mass ≥ p; 1: off.
        uniform_B: fp64 uniforms in [0, 1), one per row (ignored for greedy rows).
        topk_B: how many alternatives to report per row (0: none).
    """

    temperature_B: torch.Tensor
    top_k_B: torch.Tensor
    top_p_B: torch.Tensor
    uniform_B: torch.Tensor
    topk_B: torch.Tensor

    @staticmethod
    def build(temperature: list[float], top_k: list[int], top_p: list[float],
              uniforms: list[float], topk: list[int], device: torch.device) -> RowParams:
        return RowParams(torch.tensor(temperature, dtype=torch.float32, device=device),
                         torch.tensor(top_k, dtype=torch.long, device=device),
                         torch.tensor(top_p, dtype=torch.float64, device=device),
                         torch.tensor(uniforms, dtype=torch.float64, device=device),
                         torch.tensor(topk, dtype=torch.long, device=device))


@dataclass(frozen=True)
class SampledTokens:
    """Per row: the token, its logprob, and the top alternatives (``[B, K]``, K = max k asked;
    a row asking for fewer uses its first k columns)."""

    tokens_B: torch.Tensor
    logprobs_B: torch.Tensor
    topk_ids_B_K: torch.Tensor | None
    topk_logprobs_B_K: torch.Tensor | None


def sample_tokens(logits_B_V: torch.Tensor, params: RowParams) -> SampledTokens:
    """Draw one token per row (the algorithm; reads top to bottom)."""
    logits = logits_B_V.to(torch.float32)
    num_rows, vocab = logits.shape
    is_greedy = params.temperature_B == 0
    temperature = torch.where(is_greedy, 1.0, params.temperature_B)
    # x / 1.0 == x exactly, so T = 1 rows are bitwise the training forward's log_softmax.
    scaled = logits if bool((temperature == 1).all()) else logits / temperature[:, None]
    logprobs_B_V = torch.log_softmax(scaled, dim=-1)

    tokens = torch.zeros(num_rows, dtype=torch.long, device=logits.device)
    greedy = is_greedy.nonzero().squeeze(1)
    if greedy.numel() == num_rows:
        tokens = torch.argmax(logits, dim=-1)
    elif greedy.numel():
        tokens[greedy] = torch.argmax(logits.index_select(0, greedy), dim=-1)
    is_truncated = ((params.top_k_B > 0) & (params.top_k_B < vocab)) | (params.top_p_B < 1)
    is_plain = ~is_greedy & ~is_truncated
    if bool(is_plain.all()):  # the RL case: no row copies
        tokens = inverse_cdf(logprobs_B_V, params.uniform_B)
    elif bool(is_plain.any()):
        plain = is_plain.nonzero().squeeze(1)
        tokens[plain] = inverse_cdf(logprobs_B_V.index_select(0, plain), params.uniform_B[plain])
    truncated = (~is_greedy & is_truncated).nonzero().squeeze(1)
    if truncated.numel():
        tokens[truncated] = _sample_truncated(
            logprobs_B_V.index_select(0, truncated), params.top_k_B[truncated],
            params.top_p_B[truncated], params.uniform_B[truncated])

    chosen = logprobs_B_V.gather(1, tokens[:, None]).squeeze(1)
    k = int(params.topk_B.max()) if num_rows else 0
    if k == 0:
        return SampledTokens(tokens, chosen, None, None)
    top_lp, top_ids = logprobs_B_V.topk(k, dim=-1)
    return SampledTokens(tokens, chosen, top_ids, top_lp)


def draw_alternatives(logits_N_V: torch.Tensor, temperature: float, uniform_N_M: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """M independent draws per row (with replacement) and their logprobs, both ``[N, M]``:
    from ``log_softmax(logits / T)`` with `sample_tokens`'s arithmetic, top-k / top-p not
    applied; at T = 0 every draw is the argmax, with its T = 1 logprob (as a greedy row
    reports)."""
    logits = logits_N_V.to(torch.float32)
    scaled = logits if temperature in (0.0, 1.0) else logits / torch.full(
        (logits.shape[0], 1), temperature, dtype=torch.float32, device=logits.device)
    logprobs_N_V = torch.log_softmax(scaled, dim=-1)
    if temperature == 0:
        tokens_N_M = torch.argmax(logits, dim=-1, keepdim=True).expand(-1, uniform_N_M.shape[1])
    else:
        tokens_N_M = inverse_cdf_draws(logprobs_N_V, uniform_N_M)
    return tokens_N_M, logprobs_N_V.gather(1, tokens_N_M)


def _sample_truncated(logprobs_N_V: torch.Tensor, top_k_N: torch.Tensor, top_p_N: torch.Tensor,
                      uniform_N: torch.Tensor) -> torch.Tensor:
    """Top-k, then top-p on the renormalised top-k distribution (vLLM's order), on the
    descending-sorted distribution; then inverse CDF over what is kept. The most likely token
    is always kept."""
    vocab = logprobs_N_V.shape[1]
    sorted_lp, order = logprobs_N_V.sort(dim=-1, descending=True, stable=True)
    probs = sorted_lp.exp()
    rank = torch.arange(vocab, device=probs.device)
    k = torch.where(top_k_N > 0, top_k_N, vocab)
    keep = rank[None, :] < k[:, None]
    probs = torch.where(keep, probs, 0.0)
    probs64 = probs.to(torch.float64)
    cum = probs64.cumsum(-1)
    mass_before = (cum - probs64) / cum[:, -1:]
    keep &= mass_before < top_p_N[:, None]
    kept_lp = torch.where(keep, sorted_lp, -torch.inf)  # exp(-inf) = 0: never chosen
    return order.gather(1, inverse_cdf(kept_lp, uniform_N)[:, None]).squeeze(1)
