"""The two-level inverse CDF against a flat fp64 ``cumsum`` + ``searchsorted`` reference: the same
index except within fp64 rounding of a boundary, zero-weight tokens never chosen (zeros at block
edges, zero-mass blocks, extreme uniforms), ragged vocabularies, exact frequencies on a grid,
a chi-square test on random draws, monotonicity in ``u``, and row-local bits."""

from __future__ import annotations

import torch

from loraplex.engine.sampling.inverse_cdf import _weights_and_block_masses, inverse_cdf
from loraplex.engine.sampling.random_stream import stream_key, uniform

#: The largest double below 1 (the largest uniform `random_stream` can return).
U_MAX = 1.0 - 2.0 ** -53


def reference(logweights_N_V: torch.Tensor, uniform_N: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flat scan: index, fp64 running sums and target of each row."""
    cum = logweights_N_V.exp().to(torch.float64).cumsum(-1)
    target = uniform_N * cum[:, -1]
    index = torch.searchsorted(cum, target[:, None], right=True).squeeze(1)
    return index.clamp_max(cum.shape[1] - 1), cum, target


def rounding_bound(vocab: int, total: torch.Tensor) -> torch.Tensor:
    """How far two fp64 summation orders of ``vocab`` non-negative terms, plus the target's own
    product and subtraction, can put a prefix sum apart: (vocab + 2) units of 2^-53 of the total
    per side (a first-order bound on each; twice it covers both)."""
    return 2 * (vocab + 2) * 2.0 ** -53 * total


def random_logweights(rows: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[torch.rand(rows, vocab, generator=gen) < 0.2] = -torch.inf  # zero weights anywhere
    return torch.log_softmax(logits, -1)


def test_matches_the_flat_scan_except_within_rounding_of_a_boundary() -> None:
    vocab, block, rows, draws = 3000, 256, 32, 64  # 11 full blocks and a ragged one of 184
    logw = random_logweights(rows, vocab, 0)
    gen = torch.Generator().manual_seed(1)
    num_random_ambiguous = 0
    for d in range(draws):
        u = torch.rand(rows, generator=gen, dtype=torch.float64)
        if d % 4 == 0:  # aim exactly at a reference boundary: ambiguous by construction
            cum = logw.exp().to(torch.float64).cumsum(-1)
            at = torch.randint(0, vocab - 1, (rows,), generator=gen)
            u = (cum.gather(1, at[:, None]).squeeze(1) / cum[:, -1]).clamp_max(U_MAX)
        ref, cum, target = reference(logw, u)
        got = inverse_cdf(logw, u, block)
        tol = rounding_bound(vocab, cum[:, -1])
        lower = torch.where(ref > 0, cum.gather(1, (ref - 1).clamp_min(0)[:, None]).squeeze(1),
                            0.0)
        upper = cum.gather(1, ref[:, None]).squeeze(1)
        ambiguous = ((target - lower) <= tol) | ((upper - target) <= tol)
        assert torch.equal(got[~ambiguous], ref[~ambiguous])
        # Near a boundary, the token is one of the two positive tokens on either side of it.
        positive = logw > -torch.inf
        for row in ambiguous.nonzero().squeeze(1).tolist():
            near = positive[row].nonzero().squeeze(1)
            spot = int(torch.searchsorted(near, ref[row]))
            neighbours = set(near[max(0, spot - 1):spot + 2].tolist())
            assert int(got[row]) in neighbours
        if d % 4:
            num_random_ambiguous += int(ambiguous.sum())
    assert num_random_ambiguous == 0  # random uniforms: ~1e-12 odds each; all checked exactly


def test_a_zero_weight_token_is_never_chosen_even_at_block_edges() -> None:
    vocab, block = 10 * 64 + 40, 64
    gen = torch.Generator().manual_seed(2)
    logw = torch.log_softmax(torch.randn(8, vocab, generator=gen), -1)
    for edge in range(0, vocab, block):  # zeros on both sides of every block edge
        logw[:, edge] = -torch.inf
        logw[:, max(0, edge - 1)] = -torch.inf
    logw[:, -1] = -torch.inf
    logw[1, :block] = -torch.inf  # a zero-mass first block
    logw[2, -40:] = -torch.inf  # a zero-mass ragged last block
    logw[3, 3 * block:6 * block] = -torch.inf  # zero-mass blocks in the middle
    logw[4, :] = -torch.inf
    logw[4, 5 * block + 7] = 0.0  # a single positive token
    blocks, masses = _weights_and_block_masses(logw, block)
    weights = blocks.flatten(1)
    cum_blocks = masses.cumsum(-1)
    uniforms = [0.0, U_MAX, 0.5, 1e-300, 1.0]  # 1.0 is outside [0, 1): the cap still holds
    # Targets exactly at every block boundary (and just either side of it) of every row.
    for j in range(cum_blocks.shape[1]):
        at = (cum_blocks[:, j] / cum_blocks[:, -1]).clamp_max(U_MAX)
        uniforms_j = [at, torch.nextafter(at, torch.zeros_like(at)),
                      torch.nextafter(at, torch.ones_like(at)).clamp_max(U_MAX)]
        for u in uniforms_j:
            chosen = inverse_cdf(logw, u, block)
            assert (weights.gather(1, chosen[:, None]) > 0).all()
    for value in uniforms:
        chosen = inverse_cdf(logw, torch.full((8,), value, dtype=torch.float64), block)
        assert (weights.gather(1, chosen[:, None]) > 0).all()
    assert inverse_cdf(logw[4:5], torch.tensor([U_MAX], dtype=torch.float64), block).item() \
        == 5 * block + 7


def test_rounding_past_a_blocks_running_total_still_takes_a_positive_token() -> None:
    # One weight 1 and 1021 weights e^-38 ≈ 3e-17, then zeros: the block's fp64 reduction keeps
    # their mass (1 + 3e-14), the running sum inside the block loses every one of them (1 + 3e-17
    # rounds to 1), so a target near the total lies past the block's own running total.
    logw = torch.full((1, 2048), -torch.inf)
    logw[0, 0] = 0.0
    logw[0, 1:1023] = -38.0
    blocks, masses = _weights_and_block_masses(logw, 1024)
    assert masses[0, 0] > blocks[0, 0].double().cumsum(-1)[-1]  # the case is constructed
    for value in (U_MAX, 1.0 - 1e-14, 0.5, 0.0):
        chosen = inverse_cdf(logw, torch.tensor([value], dtype=torch.float64), 1024).item()
        assert chosen == 0  # the token whose running sum reaches the block's total


def test_exact_frequencies_on_a_uniform_grid_across_blocks() -> None:
    probs = torch.tensor([0.25, 0.0, 0.125, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 0.375])
    n = 256
    grid = torch.tensor([(i + 0.5) / n for i in range(n)], dtype=torch.float64)
    for block in (1, 2, 4, 5, 8, 16):  # ragged (11 = 2·5 + 1 ...) and whole-vocab blocks
        chosen = inverse_cdf(probs.log().expand(n, -1), grid, block)
        counts = torch.bincount(chosen, minlength=11)
        assert torch.equal(counts, (probs * n).long()), block
        assert (chosen.diff() >= 0).all()  # an inverse CDF: non-decreasing in u


def test_random_draws_pass_a_chi_square_test() -> None:
    vocab, block, n = 50, 8, 20_000
    gen = torch.Generator().manual_seed(3)
    logw = torch.log_softmax(torch.randn(vocab, generator=gen), -1)
    key = stream_key(7, 0)
    u = torch.tensor([uniform(key, i) for i in range(n)], dtype=torch.float64)
    counts = torch.bincount(inverse_cdf(logw.expand(n, -1), u, block), minlength=vocab)
    expected = logw.double().exp() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 93.0  # χ²(49) at p = 1e-4; 49 on average


def test_a_rows_bits_do_not_depend_on_the_other_rows() -> None:
    for vocab in (4096, 3000, 40_000):  # 32, 43 and 3 rows per slice; ragged slices
        logw = random_logweights(40, vocab, vocab)
        weights, masses = _weights_and_block_masses(logw, 256)
        u = torch.rand(40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        together = inverse_cdf(logw, u, 256)
        for row in (0, 1, 17, 39):
            alone_w, alone_m = _weights_and_block_masses(logw[row:row + 1], 256)
            assert torch.equal(alone_w, weights[row:row + 1])
            assert torch.equal(alone_m, masses[row:row + 1])
            assert inverse_cdf(logw[row:row + 1], u[row:row + 1], 256).item() == together[row]


def test_vocab_smaller_than_one_block_and_no_rows() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.5]])
    assert inverse_cdf(probs.log(), torch.tensor([0.75], dtype=torch.float64)).item() == 2
    empty = inverse_cdf(torch.zeros(0, 5), torch.zeros(0, dtype=torch.float64), 2)
    assert empty.shape == (0,)
