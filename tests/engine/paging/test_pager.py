"""Adapter paging through the Engine: 4× more training adapters than the budget holds, trained
alternately, end bitwise equal to a run without paging (host tier, disk tier, both); exact
accounting after every call; a call over budget still runs; saves of paged-out adapters;
deleting frees the host/disk copy; a save's adapter is never moved under it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.domain.work import LoadWork, SaveWork
from loraplex.engine.executor import Engine
from loraplex.errors import UserError
from tests.engine.paging.paging_rig import (
    VOCAB,
    assert_same_state,
    budgeted_engine,
    check_accounting,
    create_adapters,
    full_state,
    make_engine,
    outcome_bits,
    peak_bytes,
    train_alternately,
)
from tests.engine.train_works import ce_datum, work

NUM_FIT = 2
ADAPTERS = [f"t{i}" for i in range(4 * NUM_FIT)]
ROUNDS = 2


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[list[Any], dict[str, dict[str, torch.Tensor]]]:
    """The schedule without a budget: its outcomes and every adapter's final state."""
    engine = make_engine(tiny_model_dir)
    create_adapters(engine, ADAPTERS)
    outcomes, paged = train_alternately(engine, ADAPTERS, ROUNDS)
    assert not any(paged)
    assert engine.memory_stats().paging.page_outs == 0
    return outcomes, {a: full_state(engine, a) for a in ADAPTERS}


@pytest.mark.parametrize("host_budget", [None, 0, "one adapter"],
                         ids=["host-tier", "straight-to-disk", "host-then-disk"])
def test_alternate_training_of_4x_the_budget_is_bitwise_the_unpaged_run(
        tiny_model_dir: Path, tmp_path: Path, reference: tuple[list[Any], dict[str, Any]],
        host_budget: int | str | None) -> None:
    probe = make_engine(tiny_model_dir)
    if host_budget == "one adapter":
        host_budget = peak_bytes(probe)
    engine = budgeted_engine(tiny_model_dir, NUM_FIT, host_memory_budget=host_budget,
                             page_dir=str(tmp_path))
    create_adapters(engine, ADAPTERS)
    outcomes, paged_before_step = train_alternately(engine, ADAPTERS, ROUNDS,
                                                    after_call=lambda: check_accounting(engine))
    ref_outcomes, ref_states = reference
    assert outcomes == ref_outcomes  # losses, logprobs and optimizer metrics, bit for bit
    assert any(paged_before_step)  # gradients crossed a page-out before their optim_step
    for adapter_id in ADAPTERS:
        assert_same_state(full_state(engine, adapter_id), ref_states[adapter_id])
    stats = engine.memory_stats()
    assert stats.num_resident <= NUM_FIT and stats.paging.over_budget_calls == 0
    assert stats.paging.page_ins > 0 and stats.paging.seconds > 0
    assert (stats.paging.to_disk > 0) == (host_budget is not None)
    assert (stats.paging.from_disk > 0) == (host_budget is not None)
    if host_budget == 0:
        assert stats.num_host == 0 and stats.bytes_host == 0
    assert stats.paging.bytes_to_host == 0  # a CPU engine hands host copies over, no copy


def test_a_call_whose_adapters_exceed_the_budget_runs_over_budget_once(tiny_model_dir: Path
                                                                       ) -> None:
    engine = budgeted_engine(tiny_model_dir, 1)
    plain = make_engine(tiny_model_dir)
    ids = ["a", "b", "c"]
    results = []
    for e in (engine, plain):
        create_adapters(e, ids)
        gen = torch.Generator().manual_seed(1)
        works = [work(f"r-{a}", a, [ce_datum(gen, 8, VOCAB)]) for a in ids]
        results.append([outcome_bits(o) for o in e.forward_backward(works)])
    assert results[0] == results[1]
    stats = engine.memory_stats()
    assert stats.paging.over_budget_calls == 1
    assert stats.paging.max_over_budget_bytes == 2 * peak_bytes(engine)
    check_accounting(engine)  # back within the budget once the call is over
    for a in ids:
        assert_same_state(full_state(engine, a), full_state(plain, a))


def _saved_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("host_budget", [None, 0], ids=["host", "disk"])
def test_saving_a_paged_out_adapter_writes_the_bytes_of_a_resident_one(
        tiny_model_dir: Path, tmp_path: Path, host_budget: int | None) -> None:
    ids = ["a", "b", "c", "never-stepped"]
    engines = {"resident": make_engine(tiny_model_dir),
               "paged": budgeted_engine(tiny_model_dir, 1, host_memory_budget=host_budget)}
    for e in engines.values():
        create_adapters(e, ids)
        train_alternately(e, ids[:2], rounds=1)
        e.forward_backward([work("last", "c", [ce_datum(torch.Generator(), 6, VOCAB)])])
    paged = engines["paged"]
    for adapter_id in ("a", "never-stepped"):
        assert not paged.pager.is_resident(adapter_id)
        for name, e in engines.items():
            e.save_adapter(SaveWork(adapter_id, str(tmp_path / name / adapter_id),
                                    with_optimizer=True, peft_export=True))
        saved = [_saved_files(tmp_path / name / adapter_id) for name in engines]
        assert saved[0] == saved[1] and len(saved[0]) == 5
        assert not paged.pager.is_resident(adapter_id)  # saved from where it lay
    check_accounting(paged)


@pytest.mark.parametrize("host_budget", [None, 0], ids=["host", "disk"])
def test_deleting_a_paged_out_adapter_frees_its_host_or_disk_copy(
        tiny_model_dir: Path, tmp_path: Path, host_budget: int | None) -> None:
    engine = budgeted_engine(tiny_model_dir, 1, host_memory_budget=host_budget,
                             page_dir=str(tmp_path))
    create_adapters(engine, ["a", "b", "c"])
    train_alternately(engine, ["a", "b"], rounds=1)
    before = engine.memory_stats()
    assert not engine.pager.is_resident("a")
    engine.delete_adapter("a")
    after = engine.memory_stats()
    page_files = list(tmp_path.rglob("*.safetensors"))
    if host_budget is None:
        assert (before.num_host, after.num_host) == (2, 1)
        assert after.bytes_host < before.bytes_host and not page_files
    else:
        assert (before.num_disk, after.num_disk) == (2, 1)
        assert after.bytes_disk < before.bytes_disk and len(page_files) == 1
    engine.close()
    assert not list(tmp_path.iterdir())  # the private page directory is gone


def test_an_adapter_being_saved_is_pinned_and_never_paged_out(tiny_model_dir: Path) -> None:
    engine = budgeted_engine(tiny_model_dir, 1)
    create_adapters(engine, ["a", "b"])
    train_alternately(engine, ["a", "b"], rounds=1)
    engine.pager.release(engine.pager.acquire(["a"]))
    overflows = engine.memory_stats().paging.over_budget_calls  # the packed (a, b) call's
    with engine.pager.reading("a"):  # as save_adapter holds it on an IO thread
        engine.forward_backward([work("r", "b", [ce_datum(torch.Generator(), 6, VOCAB)])])
        assert engine.pager.is_resident("a")
        assert engine.memory_stats().paging.over_budget_calls == overflows + 1
    engine.forward_backward([work("r", "b", [ce_datum(torch.Generator(), 6, VOCAB)])])
    assert not engine.pager.is_resident("a")
    check_accounting(engine)


def test_saves_on_another_thread_beside_paging_write_the_reference_bytes(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    engine: Engine = budgeted_engine(tiny_model_dir, 1, host_memory_budget=0)
    create_adapters(engine, ["a", "b", "c"])
    train_alternately(engine, ["a", "b"], rounds=1)
    engine.save_adapter(SaveWork("a", str(tmp_path / "ref"), with_optimizer=True))
    errors: list[BaseException] = []

    def saves() -> None:
        try:
            for i in range(6):
                engine.save_adapter(SaveWork("a", str(tmp_path / f"s{i}"), with_optimizer=True))
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=saves)
    thread.start()
    gen = torch.Generator().manual_seed(2)
    while thread.is_alive():
        for adapter_id in ("b", "c"):
            engine.forward_backward([work("r", adapter_id, [ce_datum(gen, 6, VOCAB)])])
    thread.join()
    assert not errors
    reference = _saved_files(tmp_path / "ref")
    for i in range(6):
        assert _saved_files(tmp_path / f"s{i}") == reference


def test_loading_over_a_paged_out_adapter_replaces_its_disk_copy_and_trains_on_bitwise(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    states = []
    for name, e in {"plain": make_engine(tiny_model_dir),
                    "paged": budgeted_engine(tiny_model_dir, 1, host_memory_budget=0,
                                             page_dir=str(tmp_path / "pages"))}.items():
        create_adapters(e, ["a", "b"])
        train_alternately(e, ["a", "b"], rounds=1)
        e.save_adapter(SaveWork("b", str(tmp_path / name), with_optimizer=True))
        if name == "paged":
            assert not e.pager.is_resident("a") and e.memory_stats().num_disk == 1
        e.load_adapter(LoadWork("a", str(tmp_path / name), with_optimizer=True))
        train_alternately(e, ["a", "b"], rounds=1)
        states.append({a: full_state(e, a) for a in ("a", "b")})
        check_accounting(e)
    for adapter_id in ("a", "b"):
        assert_same_state(states[0][adapter_id], states[1][adapter_id])
    assert len(list((tmp_path / "pages").rglob("*.safetensors"))) == 1  # one paged out now


def test_without_a_budget_nothing_pages_and_adapter_memory_reports_the_stats(
        tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    create_adapters(engine, ["a", "b", "c"])
    train_alternately(engine, ["a", "b"], rounds=1)
    check_accounting(engine)
    stats, memory = engine.memory_stats(), engine.adapter_memory()
    assert stats.num_resident == memory.resident_adapters == 3
    assert stats.paging.page_outs == memory.page_outs == memory.paged_adapters == 0
    assert memory.bytes_resident == stats.bytes_resident > 0 and memory.budget_bytes is None
    paged = budgeted_engine(tiny_model_dir, 1)  # 4 fresh adapters (leaves only) fit, not 5
    create_adapters(paged, ["a", "b", "c", "d", "e"])
    memory = paged.adapter_memory()
    assert memory.budget_bytes == peak_bytes(paged) and memory.resident_adapters == 4
    assert memory.paged_adapters == memory.page_outs == 1 and not paged.pager.is_resident("a")
    assert memory.bytes_host == paged.memory_stats().bytes_host > 0


def test_a_negative_budget_is_refused_naming_the_field(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError) as err:
        make_engine(tiny_model_dir, host_memory_budget=-1)
    assert err.value.field == "host_memory_budget"
