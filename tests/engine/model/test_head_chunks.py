"""The windowed head (`head_chunks`): windows cut where the docstring says, and logprobs that are
the full ``[rows, vocab]`` path's bits, for packed batches of several adapters in both LoRA
layouts, with windows small enough that every batch is cut many times; gradients through the
checkpointed windows equal the full path's (the hidden states' bitwise)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.executor import Engine
from loraplex.engine.model.head_chunks import HeadWindows, rows_per_window, target_logprobs
from loraplex.engine.model.packed_batch import SequenceInput
from tests.engine.train_works import create_random_adapter, rel_err

VOCAB = 1024


def test_windows_cut_at_segment_starts_and_merge_small_segments() -> None:
    windows = HeadWindows.of(24, [(0, 3), (3, 6), (6, 20)], max_rows=8)
    # (0,3)+(3,6) share a window; the third segment is cut at 8 rows from its own start; the
    # base rows (20..24) start a window of their own.
    assert windows.bounds == ((0, 6), (6, 14), (14, 20), (20, 24))
    windows = HeadWindows.of(12, [(0, 2), (2, 4), (4, 5)], max_rows=8)
    assert windows.bounds == ((0, 5), (5, 12))


def test_windows_of_base_rows_only() -> None:
    assert HeadWindows.of(20, [], max_rows=8).bounds == ((0, 8), (8, 16), (16, 20))


def test_rows_per_window_is_a_row_multiple_within_the_budget() -> None:
    assert rows_per_window(49152, 8) == 336  # 64 MiB / (4 × 49152) = 341.3
    assert rows_per_window(151936, 8) == 104
    assert rows_per_window(10**9, 8) == 8  # at least one multiple


def _engine(model_dir: Path) -> Engine:
    engine = Engine(str(model_dir), EngineConfig())
    for i, (name, rank) in enumerate((("a", 8), ("b", 4), ("c", 16))):
        create_random_adapter(engine, name, LoraConfig(rank=rank, seed=i), seed=20 + i)
    return engine


@pytest.mark.parametrize("lengths", [[37, 5, 20, 64, 9], [1, 1, 1, 2, 1]],
                         ids=["in-place", "gathered"])
@pytest.mark.parametrize("max_rows", [8, 16, 4096])
def test_windowed_logprobs_are_the_full_heads_bits(tiny_model_dir: Path, lengths: list[int],
                                                   max_rows: int) -> None:
    engine = _engine(tiny_model_dir)
    model = engine.model
    gen = torch.Generator().manual_seed(0)
    adapters = ["a", "b", "a", "c", "b"]
    seqs = [SequenceInput(torch.randint(VOCAB, (n,), generator=gen).tolist(), a)
            for n, a in zip(lengths, adapters, strict=True)]
    batch = model.pack(seqs)
    assert (batch.lora_rows is not None
            and (batch.lora_rows.gather_P is None) == (lengths[0] > 1))
    lora = engine.bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    rows_T = batch.row_index()
    rows_N = torch.cat([rows_T, rows_T[::3]])  # repeated rows, as top-K targets have
    targets_N = torch.randint(VOCAB, (rows_N.numel(),), generator=gen)

    def full() -> tuple[torch.Tensor, torch.Tensor]:
        hidden = model.forward(batch, lora)
        logprobs = torch.log_softmax(model.logits(hidden, lora).float(), -1)
        return hidden, logprobs[rows_N, targets_N]

    def windowed() -> tuple[torch.Tensor, torch.Tensor]:
        hidden = model.forward(batch, lora)
        return hidden, target_logprobs(model, hidden, lora, rows_N, targets_N, max_rows)

    results = []
    for run in (full, windowed):
        hidden, picked = run()
        hidden.retain_grad()
        weights = torch.randn(picked.shape, generator=torch.Generator().manual_seed(1))
        params = [p for a in "abc" for p in engine.bank.get(a).parameters()]
        grads = torch.autograd.grad((picked * weights).sum(), [hidden, *params])
        results.append((picked.detach(), grads))
    (lp_full, g_full), (lp_win, g_win) = results
    assert torch.equal(lp_full, lp_win)
    assert torch.equal(g_full[0], g_win[0]), "the hidden states' gradient is row-local"
    for a, b in zip(g_full[1:], g_win[1:], strict=True):
        assert rel_err(a, b) <= 1e-5
