"""Batch invariance of a mixture-of-experts model, asserted on float bits as for dense.

The dense suite's tests (`test_batch_invariance`) run again here on a Qwen3-MoE harness of the
same attention shapes (8 experts of width 256, top-2, both layers sparse): a token's logprob is
the same alone and among 7 / 64 sequences of other adapters and base rows, with tiny adapter
segments, in prefill + decode vs the training forward, after a cached prefix, with two threads.
The router GEMM and top-k are checked row-invariant directly, and fast mode is checked to NOT
be invariant here either, so these tests can fail.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from loraplex.engine.model.moe_dispatch import TokenRows, route
from loraplex.engine.model.moe_spec import ExpertSpec
from tests.engine.model.test_batch_invariance import (
    SPEC,
    Harness,
    crowd,
    decode,
    in_crowd,
    one_thread,
    random_tokens,
    test_invariance_holds_with_two_threads,
    test_logprobs_identical_alone_and_in_batches_of_7_and_64,
    test_prefill_and_decode_equal_the_training_forward,
    test_suffix_after_a_prefix_cached_by_an_earlier_request_equals_one_shot,
    test_tiny_adapter_segments_are_invariant,
)

MOE_SPEC = replace(SPEC, arch="qwen3_moe", experts=ExpertSpec(
    num_experts=8, top_k=2, expert_intermediate_size=256, norm_topk_prob=True,
    sparse_layers=(0, 1)))

__all__ = [  # the dense suite's tests, collected here against the MoE harness below
    "one_thread", "test_invariance_holds_with_two_threads",
    "test_logprobs_identical_alone_and_in_batches_of_7_and_64",
    "test_prefill_and_decode_equal_the_training_forward",
    "test_suffix_after_a_prefix_cached_by_an_earlier_request_equals_one_shot",
    "test_tiny_adapter_segments_are_invariant"]


@pytest.fixture(scope="module")
def harness() -> Harness:
    h = Harness(spec=MOE_SPEC)
    assert {"w1", "w2", "w3"} <= set(h.bank.get("r8").weights)  # experts are adapted
    return h


def test_harness_routes_tokens_to_every_expert(harness: Harness) -> None:
    """The invariance above is about a real MoE: crowds spread over all experts."""
    layer = harness.model.weights.layers[0].experts
    assert layer is not None
    seqs = crowd(20, 1)
    batch = harness.model.pack(seqs)
    h_R_D = harness.model.weights.embed[batch.tokens_R]
    routing = route(h_R_D, TokenRows.of(batch, None), layer.router_E_D, 8, 2, True)
    assert torch.bincount(routing.experts_N_K.reshape(-1), minlength=8).min().item() > 0


@pytest.mark.parametrize("threads", [1, 2])
def test_router_gemm_and_topk_are_row_invariant(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        router = torch.nn.functional.pad(torch.randn(8, 512, generator=gen), (0, 0, 0, 8))
        x = torch.randn(512, generator=gen)

        def routed(rows: int, at: int) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.randn(rows, 512, generator=gen)
            h[at] = x
            tokens = TokenRows(torch.arange(rows), torch.zeros(rows, dtype=torch.long), 0, rows)
            r = route(h, tokens, router, 8, 2, True)
            return r.experts_N_K[at], r.weights_N_K[at]

        reference = routed(16, 5)
        for rows in (16, 32, 48, 112, 256, 1024):
            for at in (0, rows // 2, rows - 1):
                experts, weights = routed(rows, at)
                assert torch.equal(experts, reference[0]) and torch.equal(weights, reference[1])
    finally:
        torch.set_num_threads(1)


def test_grouped_expert_gemm_rows_are_invariant_in_groups_of_multiples_of_16() -> None:
    """The assumption the expert layout rests on: in ``F.grouped_mm`` a row gets the same bits
    in any group of a multiple of 16 rows, wherever the group and the row are."""
    gen = torch.Generator().manual_seed(1)
    w_E_O_I = torch.randn(8, 512, 512, generator=gen)
    x = torch.randn(512, generator=gen)
    rows_16 = torch.cat([x[None], torch.randn(15, 512, generator=gen)])
    reference = torch.nn.functional.linear(rows_16, w_E_O_I[3])[0]
    for sizes in ([16] * 8, [32, 0, 64, 16, 0, 48, 16, 160], [0, 0, 0, 1024, 0, 0, 0, 16]):
        ends = torch.cumsum(torch.tensor(sizes), 0)
        rows = torch.randn(int(ends[-1]), 512, generator=gen)
        at = int(ends[2]) + sizes[3] // 2
        rows[at] = x
        out = torch.nn.functional.grouped_mm(rows, w_E_O_I.transpose(1, 2),
                                             offs=ends.to(torch.int32))
        assert torch.equal(out[at], reference)


def test_fast_mode_is_correct_but_not_invariant() -> None:
    fast = Harness(invariant=False, spec=MOE_SPEC)
    gen = torch.Generator().manual_seed(11)
    tokens = random_tokens(gen, 45)
    alone = fast.full(tokens, "r8")
    mixed = in_crowd(fast, tokens, "r8", crowd(63, 2), 31)
    assert torch.allclose(mixed, alone, atol=1e-4)
    decoded = decode(fast, [tokens[:8]], [tokens[8:]], ["r8"])[0]
    assert torch.allclose(decoded, alone[:-1], atol=1e-4)
    assert not torch.equal(decoded, alone[:-1]) or not torch.equal(mixed, alone)
