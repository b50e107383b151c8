"""`inverse_cdf`: one token per row from log-weights and one uniform, in two levels.

A flat fp64 running sum over the whole vocabulary is a serial scan of ``[rows, vocab]`` plus an
fp64 copy of it (tens of ms per decode step at vocab 49k). Here the vocabulary is cut into
blocks of `BLOCK` tokens (a ragged vocab padded with zero weights): the weights
``exp(logweight)`` (fp32, computed once) and the fp64 masses of all blocks (one reduction, a
slice of rows at a time), their running sum (a few dozen values per row) picks the
block where ``u · total`` falls, and the fp64 running sum inside that one block picks the token.

Guarantees, each per row and independent of the other rows (every step is row-local):

- The token is a non-decreasing function of ``u``, and the width of each token's interval of
  ``u`` is its weight / total up to fp64 rounding (relative error ~1e-13, as for the flat scan):
  an exact inverse CDF.
- A zero-weight token is never chosen while the row has positive mass: a zero-mass block's
  running sum equals its predecessor's so it is never the first to exceed the target, and
  inside the block likewise; the target (and the residual inside the block, which rounding
  can push past the block's own running total) is capped just below the running total, so
  some entry always exceeds it.
- Against the flat scan (``cumsum`` + ``searchsorted``), the token differs only when ``u ·
  total`` lies within fp64 rounding of a boundary between two tokens.
"""

from __future__ import annotations

import torch

#: Tokens per block: the first level reads every weight once, the second scans one block.
BLOCK = 1024
#: Weights exponentiated and reduced per slice of rows (their fp32 and fp64 temporaries stay in
#: cache instead of round-tripping a full fp64 copy of ``[rows, vocab]`` through memory).
CHUNK_ELEMENTS = 1 << 17


def inverse_cdf(logweights_N_V: torch.Tensor, uniform_N: torch.Tensor,
                block: int = BLOCK) -> torch.Tensor:
    """Per row, the first index whose running weight ``exp(logweight)`` exceeds ``u · total``
    (``[N]`` long).

    Args:
        logweights_N_V: fp32 log-weights (log-probabilities; unnormalised is fine; -inf: zero).
        uniform_N: fp64 uniforms in [0, 1).
        block: tokens per first-level block.
    """
    return inverse_cdf_draws(logweights_N_V, uniform_N[:, None], block).squeeze(1)


def inverse_cdf_draws(logweights_N_V: torch.Tensor, uniform_N_M: torch.Tensor,
                      block: int = BLOCK) -> torch.Tensor:
    """`inverse_cdf` for M uniforms per row (``[N, M]`` long): the weights and block masses
    are computed once per row, and each draw is the token `inverse_cdf` gives its uniform."""
    vocab = logweights_N_V.shape[1]
    num_draws = uniform_N_M.shape[1]
    weights_N_K_b, mass_N_K = _weights_and_block_masses(logweights_N_V, block)
    cum_N_K = mass_N_K.cumsum(-1)
    total_N_M = cum_N_K[:, -1:].expand(-1, num_draws)
    target_N_M = _below(uniform_N_M.to(torch.float64) * total_N_M, total_N_M)
    chosen_N_M = torch.searchsorted(cum_N_K, target_N_M, right=True)
    cum_before_N_K = torch.cat([cum_N_K.new_zeros(cum_N_K.shape[0], 1), cum_N_K[:, :-1]], 1)
    residual = (target_N_M - cum_before_N_K.gather(1, chosen_N_M)).reshape(-1)  # ≥ 0
    num_rows, num_blocks = mass_N_K.shape
    row_N_M = torch.arange(num_rows, device=chosen_N_M.device)[:, None].expand(-1, num_draws)
    flat_chosen = (row_N_M * num_blocks + chosen_N_M).reshape(-1)
    in_block_NM_b = weights_N_K_b.view(-1, block).index_select(0, flat_chosen)
    cum_NM_b = in_block_NM_b.to(torch.float64).cumsum(-1)
    residual = _below(residual, cum_NM_b[:, -1])
    offset = torch.searchsorted(cum_NM_b, residual[:, None], right=True).squeeze(1)
    return (chosen_N_M * block + offset.view(num_rows, num_draws)).clamp(0, vocab - 1)


def _below(value_N: torch.Tensor, total_N: torch.Tensor) -> torch.Tensor:
    """``value`` capped just below ``total``, so that a running sum ending at ``total`` has an
    entry that exceeds it: one whose own weight is positive (a zero weight repeats its
    predecessor's running sum). ``u < 1`` already gives ``u · total < total`` for the blocks;
    inside the chosen block the residual can pass the block's running total by rounding (its
    mass was reduced in another order), and then the block's first token whose running sum
    reaches that total gets the rounding-sized excess."""
    return torch.minimum(value_N, torch.nextafter(total_N, torch.zeros_like(total_N)))


def _weights_and_block_masses(logweights_N_V: torch.Tensor, block: int
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights ``exp(logweight)`` as blocks ``[N, K, block]`` (K = ceil(V / block); a
    ragged vocab is padded with zero weights) and each block's fp64 sum ``[N, K]``.

    Computed a slice of rows at a time (elementwise ``exp`` and per-block reductions: a row's
    bits do not depend on which slice, or which other rows, it comes with).
    """
    num_rows, vocab = logweights_N_V.shape
    num_blocks = -(-vocab // block)
    weights = logweights_N_V.new_empty(num_rows, num_blocks * block)
    weights[:, vocab:] = 0.0
    masses = weights.new_empty(num_rows, num_blocks, dtype=torch.float64)
    step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    for first in range(0, num_rows, step):
        rows = weights[first:first + step]
        torch.exp(logweights_N_V[first:first + step], out=rows[:, :vocab])
        torch.sum(rows.view(-1, num_blocks, block), -1, dtype=torch.float64,
                  out=masses[first:first + step])
    return weights.view(num_rows, num_blocks, block), masses

