"""Paging on CUDA, where device and host memory differ: a page-out really frees device memory
and copies exactly the state's bytes, page-in restores every bit, and under a budget a read
checkpoint waits in host memory until used."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.domain.optim import AdamParams
from loraplex.domain.work import LoadWork, OptimStepWork, SaveWork
from loraplex.engine.builtin.model import create_builtin_model
from tests.engine.paging.paging_rig import (
    VOCAB,
    assert_same_state,
    check_accounting,
    create_adapters,
    full_state,
    make_engine,
    peak_bytes,
)
from tests.engine.train_works import ce_datum, work

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_builtin_model(tmp_path_factory.mktemp("gpu") / "tiny", "qwen3", "tiny", seed=0)


@pytest.mark.parametrize("host_budget", [None, 0], ids=["host", "disk"])
def test_a_page_out_frees_device_memory_and_a_page_in_restores_every_bit(
        model_dir: Path, host_budget: int | None) -> None:
    engine = make_engine(model_dir, device="cuda", dtype="float32", adapter_memory_budget=0,
                         host_memory_budget=host_budget)  # everything pages out after a call
    create_adapters(engine, ["a"])
    gen = torch.Generator().manual_seed(0)
    engine.forward_backward([work("r", "a", [ce_datum(gen, 8, VOCAB)])])
    engine.optim_step([OptimStepWork("o", "a", AdamParams())])
    engine.forward_backward([work("r", "a", [ce_datum(gen, 8, VOCAB)])])  # grads + moments
    assert not engine.pager.is_resident("a")
    lease = engine.pager.acquire(["a"])
    before = full_state(engine, "a")  # still pinned by the lease: stays resident
    state_bytes = engine.pager.bytes_resident()
    moved = engine.memory_stats().paging.bytes_to_host
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    engine.pager.release(lease)
    torch.cuda.synchronize()
    assert not engine.pager.is_resident("a")
    assert allocated - torch.cuda.memory_allocated() >= state_bytes  # really freed
    if host_budget is None:
        assert engine.memory_stats().paging.bytes_to_host - moved == state_bytes
    assert_same_state(full_state(engine, "a"), before)
    check_accounting(engine)


def test_under_a_budget_a_read_checkpoint_waits_in_host_memory(model_dir: Path,
                                                                tmp_path: Path) -> None:
    probe = make_engine(model_dir, device="cuda", dtype="float32")
    engine = make_engine(model_dir, device="cuda", dtype="float32",
                         adapter_memory_budget=peak_bytes(probe))
    create_adapters(engine, ["a"])
    engine.save_adapter(SaveWork("a", str(tmp_path / "a"), with_optimizer=True))
    prepared = engine.read_checkpoint(LoadWork("b", str(tmp_path / "a"), with_optimizer=True))
    assert prepared.adapter.parameters()[0].device.type == "cpu"
    engine.install_adapter("b", prepared)
    assert not engine.pager.is_resident("b") and engine.memory_stats().num_host >= 1
    outcome = engine.forward_backward([work("r", "b", [ce_datum(torch.Generator(), 8,
                                                                VOCAB)])])[0]
    assert not isinstance(outcome, Exception)
    assert engine.pager.is_resident("b")
    assert engine.bank.get("b").parameters()[0].device.type == "cuda"
    check_accounting(engine)
