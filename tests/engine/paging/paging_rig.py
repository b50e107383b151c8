"""Builders for the paging tests: engines with an adapter budget counted in adapters, the
alternating training schedule, bitwise snapshots of an adapter's whole state, and an
accounting check computed from tensor sizes independently of the pager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.optim import AdamParams
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.domain.work import OptimStepWork
from loraplex.engine.executor import Engine
from loraplex.engine.lora.adapter import LoraAdapter
from tests.engine.train_works import ce_datum, work

VOCAB = 1024  # the built-in tiny model's
LORA = LoraConfig(rank=4)


def peak_bytes(engine: Engine, config: LoraConfig = LORA) -> int:
    """One training adapter's full state: fp32 leaves, gradients, two moments, the step."""
    params = LoraAdapter.create(engine.model.spec, config).num_params
    return 4 * (4 * params) + 4


def make_engine(model_dir: Path, **config: Any) -> Engine:
    return Engine(str(model_dir), EngineConfig(**config))


def budgeted_engine(model_dir: Path, num_adapters: int, **config: Any) -> Engine:
    """An engine whose budget holds exactly ``num_adapters`` training adapters' full state."""
    reference = make_engine(model_dir)
    return make_engine(model_dir, adapter_memory_budget=num_adapters * peak_bytes(reference),
                       **config)


def create_adapters(engine: Engine, adapter_ids: Sequence[str]) -> None:
    for i, adapter_id in enumerate(adapter_ids):
        engine.create_adapter(adapter_id, LoraConfig(rank=LORA.rank, seed=i))


def outcome_bits(outcome: object) -> tuple[Any, ...]:
    """A comparable, bit-exact form of one fwd/bwd or optim outcome (repr of a float is exact)."""
    if isinstance(outcome, ForwardBackwardResult):
        return (tuple(x.tobytes() for x in outcome.logprobs),
                tuple(x.tobytes() for x in outcome.elementwise_loss), repr(outcome.metrics))
    assert isinstance(outcome, OptimStepResult), outcome
    return (repr(outcome.metrics),)


def train_alternately(engine: Engine, adapter_ids: Sequence[str], rounds: int,
                      after_call: Callable[[], None] = lambda: None
                      ) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """Each round: a forward_backward per adapter in turn, then one packing two adapters (their
    gradients accumulate), then an optim_step per adapter; a last forward_backward each leaves
    gradients accumulated. Returns every outcome's bits and, per optim_step, whether its
    adapter had been paged out since its forward_backward."""
    gen = torch.Generator().manual_seed(0)
    outcomes: list[tuple[Any, ...]] = []
    paged_before_step: list[bool] = []

    def fwd_bwd(*ids: str) -> None:
        works = [work(f"fb-{a}", a, [ce_datum(gen, 10, VOCAB)]) for a in ids]
        outcomes.extend(outcome_bits(o) for o in engine.forward_backward(works))
        after_call()

    for _ in range(rounds):
        for adapter_id in adapter_ids:
            fwd_bwd(adapter_id)
        for a, b in zip(adapter_ids[::2], adapter_ids[1::2], strict=True):
            fwd_bwd(a, b)
        for adapter_id in adapter_ids:
            paged_before_step.append(not engine.pager.is_resident(adapter_id))
            step = OptimStepWork(f"o-{adapter_id}", adapter_id, AdamParams(learning_rate=1e-2))
            outcomes.extend(outcome_bits(o) for o in engine.optim_step([step]))
            after_call()
    for adapter_id in adapter_ids:
        fwd_bwd(adapter_id)
    return outcomes, paged_before_step


def full_state(engine: Engine, adapter_id: str) -> dict[str, torch.Tensor]:
    """Copies of an adapter's leaves, gradients, moments and step, paged in to read them."""
    lease = engine.pager.acquire([adapter_id])
    try:
        state = {}
        for name, p in engine.bank.get(adapter_id).named_parameters():
            state[f"param.{name}"] = p.detach().clone()
            if p.grad is not None:
                state[f"grad.{name}"] = p.grad.clone()
        optimizer = engine.trainer.optimizer_state(adapter_id)
        if optimizer is not None:
            state.update(optimizer.state_dict())
        return state
    finally:
        engine.pager.release(lease)


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return (x.dtype == y.dtype and x.shape == y.shape
            and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)))


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert same_bits(a[key], b[key]), key


def independent_resident_bytes(engine: Engine) -> int:
    """Device bytes of adapter state, from the tensors themselves: real (non-meta) leaves and
    their gradients, plus the optimizer states the trainer holds."""
    total = 0
    for adapter_id in engine.bank.ids():
        for p in engine.bank.get(adapter_id).parameters():
            if not p.is_meta:
                total += p.numel() * p.element_size()
                if p.grad is not None:
                    total += p.grad.numel() * p.grad.element_size()
        optimizer = engine.trainer.optimizer_state(adapter_id)
        if optimizer is not None:
            tensors = [optimizer.step, *optimizer.exp_avg, *optimizer.exp_avg_sq]
            total += sum(t.numel() * t.element_size() for t in tensors)
    return total


def check_accounting(engine: Engine) -> None:
    """Resident bytes are exact and within the budget (no call here overflows it)."""
    stats = engine.memory_stats()
    assert stats.bytes_resident == engine.pager.bytes_resident()
    assert stats.bytes_resident == independent_resident_bytes(engine)
    assert stats.budget_bytes is None or stats.bytes_resident <= stats.budget_bytes
    assert stats.num_resident + stats.num_host + stats.num_disk == len(engine.bank)
    if stats.host_budget_bytes is not None:
        assert stats.bytes_host <= stats.host_budget_bytes
