"""`EngineWorker`: the code that runs inside one Ray actor — a torch `Engine` and the protocol
methods the server calls on it.

Errors cross the process boundary as values (`Raised`, from every protocol method), so the
server re-raises the domain error itself, never a Ray wrapper carrying the worker's traceback
(which it would log and report as a server bug). A training cycle is one call (`run_cycle`):
a crash of either of its batch calls comes back as a `CallCrash` carrying the error's text
(tracebacks do not travel), so the other call's items still get their outcomes. A checkpoint
read for an
install stays in the worker: `read_checkpoint` returns a `PreparedHandle` naming it, and
`install_adapter` takes the handle back (the tensors never travel). The actor runs its IO calls
(saves, reads) on threads beside its compute calls, as the protocol allows. In a
model-parallel group (`GroupMember`) it is one rank: it joins the group's process group and
serves one pipeline stage (`cluster.model_parallel`).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from loraplex.config import EngineConfig
from loraplex.domain.cycle import CallCrash, CycleOutcome, run_cycle_calls
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.results import (
    AdapterMemory,
    FwdBwdOutcome,
    LoadResult,
    OptimOutcome,
    PreparedAdapter,
    SampleStep,
    SaveResult,
)
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.errors import LoraplexError

if TYPE_CHECKING:
    from loraplex.engine.group_checkpoint import AdapterShare
    from loraplex.engine.model.stage_pipe import StagePipe

T = TypeVar("T")


@dataclass(frozen=True)
class Raised:
    """A domain error a worker call raised, returned instead of thrown."""

    error: LoraplexError


@dataclass(frozen=True)
class WithMemory(Generic[T]):
    """A compute call's answer and the worker's adapter memory right after it (the server
    keeps it for placement instead of asking: `cluster.memory_cache`)."""

    answer: T
    memory: AdapterMemory


@dataclass(frozen=True)
class PreparedHandle:
    """A checkpoint a worker read and keeps, ready to install (the server holds only this)."""

    token: str
    config: LoraConfig


@dataclass(frozen=True)
class GroupMember:
    """A worker's place in a model-parallel group: rank ``rank`` of ``world`` (its pipeline
    stage), rendezvous at the group's TCP store (held by the server), on ``device``
    (``cpu``, or the CUDA device this rank drives)."""

    rank: int
    world: int
    store_host: str
    store_port: int
    device: str = "cpu"
    timeout_s: float = 1800.0


class EngineWorker:
    """One engine (made in the actor's or the rank process's own process) and its protocol
    methods.

    Args:
        model_dir: the base model (the same path on every host).
        config: the engine slice; ``num_threads`` None uses the actor's CPUs.
        member: its place in a model-parallel group (None: a whole model of its own). The
            constructor then joins the group's process group (returning once every rank
            has), and loads only its stage.
    """

    def __init__(self, model_dir: str, config: EngineConfig, num_cpus: int,
                 member: GroupMember | None = None) -> None:
        from dataclasses import replace

        from loraplex.engine.executor import Engine

        if config.num_threads is None:
            config = replace(config, num_threads=max(1, num_cpus))
        pipe = None if member is None else _join_group(model_dir, config, member)
        self._engine = Engine(model_dir, config, pipe)
        self._is_rank = member is not None
        self._prepared: dict[str, PreparedAdapter] = {}
        self._lock = threading.Lock()

    def ready(self) -> tuple[ModelInfo, int, str, int]:
        """The model's facts, this process's pid, its Ray node ("" outside Ray) and the bytes
        of base weights it holds (packed copies included): the worker is up once this
        answers."""
        node = ""
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        model = self._engine.model
        return (self._engine.model_info(), os.getpid(), node,
                model.weights.nbytes() + model.packed_bytes())

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> Raised | None:
        return _value(lambda: self._engine.create_adapter(adapter_id, config))

    def delete_adapter(self, adapter_id: str) -> Raised | None:
        return _value(lambda: self._engine.delete_adapter(adapter_id))

    def has_adapter(self, adapter_id: str) -> bool | Raised:
        return _value(lambda: self._engine.has_adapter(adapter_id))

    def forward_backward(self, works: Sequence[ForwardBackwardWork]
                         ) -> list[FwdBwdOutcome] | Raised:
        return _value(lambda: self._engine.forward_backward(works))

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome] | Raised:
        return _value(lambda: self._engine.optim_step(works))

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> WithMemory[CycleOutcome]:
        """`forward_backward`, then `optim_step` (`domain.cycle.run_cycle_calls`). A rank of a
        model-parallel group catches only domain errors: anything else must fail the call, so
        that its group is lost, as a crash of its separate calls would."""
        cycle = run_cycle_calls(self._engine.forward_backward, self._engine.optim_step,
                                fwd_bwd, optim, LoraplexError if self._is_rank else Exception)
        return WithMemory(CycleOutcome(_portable(cycle.forward_backward),
                                       _portable(cycle.optim_step), cycle.train_s,
                                       cycle.optim_s), self._engine.adapter_memory())

    def adapter_share(self, adapter_id: str, with_optimizer: bool) -> AdapterShare | Raised:
        return _value(lambda: self._engine.adapter_share(adapter_id, with_optimizer))

    def save_adapter(self, work: SaveWork) -> SaveResult | Raised:
        return _value(lambda: self._engine.save_adapter(work))

    def read_checkpoint(self, work: LoadWork) -> PreparedHandle | Raised:
        read = _value(lambda: self._engine.read_checkpoint(work))
        if isinstance(read, Raised):
            return read
        token = uuid.uuid4().hex
        with self._lock:
            self._prepared[token] = read
        return PreparedHandle(token, read.config)

    def install_adapter(self, adapter_id: str, token: str) -> LoadResult | Raised:
        with self._lock:
            prepared = self._prepared.pop(token)
        return _value(lambda: self._engine.install_adapter(adapter_id, prepared))

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> Raised | None:
        return _value(lambda: self._engine.snapshot_adapter(src_adapter_id, dst_adapter_id))

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int,
                    cancel: Sequence[str] = ()) -> WithMemory[SampleStep] | Raised:
        step = _value(lambda: self._engine.sample_step(admit, max_decode_steps, cancel))
        return step if isinstance(step, Raised) else WithMemory(step,
                                                                self._engine.adapter_memory())

    def num_running_samples(self) -> int | Raised:
        return _value(self._engine.num_running_samples)

    def release_memory(self) -> Raised | None:
        return _value(self._engine.release_memory)

    def adapter_memory(self) -> AdapterMemory | Raised:
        return _value(self._engine.adapter_memory)

    def noop(self, payload: Any = None) -> Any:
        """Answers at once (the dispatch-overhead benchmark's call)."""
        return payload


def _value(call: Callable[[], T]) -> T | Raised:
    try:
        return call()
    except LoraplexError as exc:
        return Raised(exc.detached())


def _portable(outcomes: tuple[T, ...] | CallCrash) -> tuple[T, ...] | CallCrash:
    """A crash as the server can unpickle and log it: a domain error as itself, detached;
    anything else as a `RuntimeError` holding its traceback's text."""
    if not isinstance(outcomes, CallCrash):
        return outcomes
    error = outcomes.error
    if isinstance(error, LoraplexError):
        return CallCrash(error.detached())
    return CallCrash(RuntimeError("in the engine worker: "
                                  + "".join(traceback.format_exception(error)).rstrip()))


def _join_group(model_dir: str, config: EngineConfig, member: GroupMember) -> StagePipe:
    """Join the group's process group (gloo on CPU, NCCL on CUDA) and this rank's stage."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from loraplex.engine.model.loader import model_stages
    from loraplex.engine.model.stage_pipe import StagePipe

    device = torch.device(member.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=member.timeout_s)
    store = dist.TCPStore(member.store_host, member.store_port, member.world, is_master=False,
                          timeout=timeout)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                            rank=member.rank, world_size=member.world, timeout=timeout)
    stage = model_stages(model_dir, config, member.world)[member.rank]
    return StagePipe(stage, None, device)
