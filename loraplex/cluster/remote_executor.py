"""`RemoteExecutor`: the server-side stand-in of one `EngineWorker` actor, implementing the
scheduler's `BatchExecutor` protocol with one blocking Ray call per method (a training cycle's
forward_backward and optim_step are one call: `run_cycle`).

A worker whose actor or node died, or whose Ray head was lost (`RayHead`), answers every call
with a `WorkerLostError` (the lane then
stops and its runs move, see `loraplex.scheduler.lanes`); a domain error the worker returned is
raised here as itself. The base model's facts are asked once, when the worker comes up; its
adapter memory only when the last answer is no longer current (`MemoryCache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import ray
from ray import exceptions as ray_errors

from loraplex.cluster.memory_cache import MemoryCache
from loraplex.cluster.ray_head import RayHead
from loraplex.cluster.worker import PreparedHandle, Raised, WithMemory
from loraplex.domain.cycle import CycleOutcome
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
from loraplex.errors import WorkerLostError

T = TypeVar("T")
LOST = (ray_errors.RayActorError, ray_errors.ActorUnavailableError, ray_errors.NodeDiedError,
        ray_errors.ObjectLostError, ray_errors.OwnerDiedError)
"""What Ray raises when a worker's process or node is gone."""


def call_actor(head: RayHead, generation: int, actor: Any, name: str, method: str,
               args: tuple[Any, ...]) -> Any:
    """``actor.method(*args)``, waited on through ``head``: a lost actor is a
    `WorkerLostError` naming ``name``, and so is every call while the Ray head is lost or
    when the actor belongs to an earlier runtime than ``generation``'s."""
    head.check(generation)
    try:
        return head.get(getattr(actor, method).remote(*args), generation)
    except LOST as exc:
        raise WorkerLostError(f"{name} was lost ({type(exc).__name__})") from None


class RemoteExecutor:
    """One engine worker, seen from the server.

    Args:
        name: the worker's name in logs and errors.
        actor: its Ray actor handle (an `EngineWorker`).
        info, pid, node_id: what its ``ready`` call answered.
        head: the Ray connection (a lost head fails every call at once).
        generation: the connection the actor was made in.
    """

    def __init__(self, name: str, actor: Any, info: ModelInfo, pid: int, node_id: str,
                 head: RayHead, generation: int) -> None:
        self.name = name
        self.actor = actor
        self.pid = pid
        self.node_id = node_id
        self._info = info
        self._head = head
        self._generation = generation
        self._memory = MemoryCache()

    def model_info(self) -> ModelInfo:
        return self._info

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        self._changing("create_adapter", adapter_id, config)

    def delete_adapter(self, adapter_id: str) -> None:
        self._changing("delete_adapter", adapter_id)

    def has_adapter(self, adapter_id: str) -> bool:
        return bool(self._call("has_adapter", adapter_id))

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        return list(self._changing("forward_backward", list(works)))

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        return list(self._changing("optim_step", list(works)))

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> CycleOutcome:
        """One Ray call: the worker runs both batches (`EngineWorker.run_cycle`)."""
        return _typed(self._with_memory("run_cycle", list(fwd_bwd), list(optim)), CycleOutcome)

    def save_adapter(self, work: SaveWork) -> SaveResult:
        return _typed(self._call("save_adapter", work), SaveResult)

    def read_checkpoint(self, work: LoadWork) -> PreparedAdapter:
        return _typed(self._call("read_checkpoint", work), PreparedHandle)

    def install_adapter(self, adapter_id: str, prepared: PreparedAdapter) -> LoadResult:
        if not isinstance(prepared, PreparedHandle):
            raise TypeError(f"not a checkpoint read by worker {self.name}")
        return _typed(self._changing("install_adapter", adapter_id, prepared.token),
                      LoadResult)

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        self._changing("snapshot_adapter", src_adapter_id, dst_adapter_id)

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int,
                    cancel: Sequence[str] = ()) -> SampleStep:
        return _typed(self._with_memory("sample_step", list(admit), max_decode_steps,
                                        list(cancel)), SampleStep)

    def num_running_samples(self) -> int:
        return int(self._call("num_running_samples"))

    def release_memory(self) -> None:
        self._call("release_memory")

    def adapter_memory(self) -> AdapterMemory:
        """As of the worker's last call (`MemoryCache`); a lost Ray head raises at once."""
        self._head.check(self._generation)
        return self._memory.get(lambda: _typed(self._call("adapter_memory"), AdapterMemory))

    def noop(self, payload: Any = None) -> Any:
        return self._call("noop", payload)

    def close(self) -> None:
        """End the actor (its resources go back to the Ray cluster); nothing to do when its
        runtime is gone."""
        if self._head.is_current(self._generation):
            ray.kill(self.actor, no_restart=True)

    def _call(self, method: str, *args: Any) -> Any:
        """One call on the actor (`call_actor`); a domain error it returned is raised."""
        value = call_actor(self._head, self._generation, self.actor,
                           f"engine worker {self.name}", method, args)
        if isinstance(value, Raised):
            raise value.error
        return value

    def _changing(self, method: str, *args: Any) -> Any:
        """`_call` of a method that may change the worker's adapter memory (its cached value
        is dropped first, and stays dropped if the call fails)."""
        self._memory.changing()
        return self._call(method, *args)

    def _with_memory(self, method: str, *args: Any) -> Any:
        """`_changing` of a method that answers `WithMemory`: its answer; the memory is kept."""
        version = self._memory.changing()
        value = _typed(self._call(method, *args), WithMemory)
        self._memory.put(version, _typed(value.memory, AdapterMemory))
        return value.answer


def _typed(value: Any, kind: type[T]) -> T:
    if not isinstance(value, kind):
        raise TypeError(f"worker answered {type(value).__name__}, expected {kind.__name__}")
    return value
