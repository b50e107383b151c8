"""The loader's check of the GEMM row padding (`row_quantum`), against this machine's MKL.

The default row multiple (8) rests on a measured fact: MKL's sgemm gives a row the same bits at
every row count that is a multiple of 4 at one and two threads, and other bits at 1–3 rows
(5–7 and 9–11 too at two threads). These tests pin that fact, so a machine where it stops
holding shows up here, and check that the loader raises a multiple that fails.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.engine.model.loader import inner_dims, load_model
from loraplex.engine.model.row_quantum import row_quantum, rows_keep_bits
from loraplex.engine.model.spec import ModelSpec
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

CPU, FP32 = torch.device("cpu"), torch.float32
DIMS = (16, 32, 512, 576, 1536)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_default_multiple_keeps_row_bits(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        assert rows_keep_bits(DIMS, EngineConfig().row_multiple, CPU, FP32)
        assert rows_keep_bits(DIMS, 16, CPU, FP32)
    finally:
        torch.set_num_threads(1)


def test_unpadded_rows_change_bits() -> None:
    """The check can fail: one row at a time takes MKL's small-M path."""
    assert not rows_keep_bits(DIMS, 1, CPU, FP32)


def test_a_failing_multiple_is_doubled_until_one_passes(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    with caplog.at_level(logging.WARNING, logger="loraplex.engine.model.row_quantum"):
        multiple = row_quantum(1, DIMS, CPU, FP32)
    assert multiple == 4  # 1 and 2 rows fail, 4 passes (see the module docstring)
    assert "pads to 4" in caplog.text
    assert row_quantum(8, DIMS, CPU, FP32) == 8


def test_the_loader_raises_a_failing_multiple(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, EngineConfig(row_multiple=1))
    assert model.options.row_multiple == 4
    assert load_model(tiny_model_dir, EngineConfig()).options.row_multiple == 8
    fast = load_model(tiny_model_dir, EngineConfig(batch_invariant=False, row_multiple=1))
    assert fast.options.row_multiple == 1  # fast mode pads nothing, so checks nothing


def test_inner_dims_name_every_reduction_of_the_model(tiny_model_dir: Path) -> None:
    spec = ModelSpec.from_dir(tiny_model_dir)
    dims = inner_dims(spec)
    assert {spec.hidden_size, spec.intermediate_size, spec.num_heads * spec.head_dim, 16,
            32} == set(dims)  # LoRA ranks pad to RANK_MULTIPLE, not to the row multiple
