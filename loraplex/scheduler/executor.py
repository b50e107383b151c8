"""The one interface between scheduling and compute: `BatchExecutor`.

Defined here, by its consumer. Implemented by `loraplex.engine.executor.Engine` (torch) and by
test fakes. Every batch method returns one outcome per work item, in order: a result, or the
`LoraplexError` that failed that item alone. Whole-batch exceptions are reserved for bugs.
A training cycle is one `run_cycle` call (forward_backward, then optim_step: one round trip to
a remote worker); an executor without a faster way composes its two batch calls with
`loraplex.domain.cycle.run_cycle_calls`, which also defines what a native one must do.

Threads: the clock thread makes every call except two, which run on the scheduler's IO threads
so that file work never stalls other tenants' cycles: `save_adapter` and `read_checkpoint`.
While either runs, the scheduler makes no other call about that adapter id (its model's queue
is busy), so an executor only has to tolerate them beside calls about *other* adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

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


class BatchExecutor(Protocol):
    """Compute for one base model and the adapters living beside it."""

    def model_info(self) -> ModelInfo:
        """Static facts about the base model."""
        ...

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        """Add a fresh adapter (B = 0). Raises UserError for a bad config."""
        ...

    def delete_adapter(self, adapter_id: str) -> None:
        """Drop an adapter and its optimizer state; unknown ids are ignored."""
        ...

    def has_adapter(self, adapter_id: str) -> bool:
        """Whether the adapter is resident."""
        ...

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        """Run many models' forward / forward_backward ops as one packed batch.

        Gradients accumulate into each adapter until its next `optim_step`. Several works may
        name the same adapter (consecutive chunks of one client call, or a forward next to a
        forward_backward): each is its own outcome, all see the same weights, and the
        gradients of all of them accumulate.
        """
        ...

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        """One AdamW step per listed adapter; clears their gradients."""
        ...

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> CycleOutcome:
        """`forward_backward` of ``fwd_bwd``, then `optim_step` of the steps that apply, in one
        call: a call that crashed fails only its own items, and after a forward_backward crash
        the steps of that batch's adapters are skipped (`domain.cycle.run_cycle_calls`)."""
        ...

    def save_adapter(self, work: SaveWork) -> SaveResult:
        """Write weights (and optimizer state) atomically under ``work.directory``.
        Runs on an IO thread (see the module docstring)."""
        ...

    def read_checkpoint(self, work: LoadWork) -> PreparedAdapter:
        """Read and check a checkpoint into memory without touching resident adapters.
        Runs on an IO thread. Raises UserError for a missing, corrupt or mismatched one."""
        ...

    def install_adapter(self, adapter_id: str, prepared: PreparedAdapter) -> LoadResult:
        """Make ``prepared`` resident as ``adapter_id``, replacing an adapter of that id (and
        its gradients and optimizer state) if one exists. Cheap: no file work."""
        ...

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        """Freeze a copy of ``src``'s current weights under ``dst`` (a sampler version)."""
        ...

    def sample_step(
        self, admit: Sequence[SampleWork], max_decode_steps: int, cancel: Sequence[str] = ()
    ) -> SampleStep:
        """Continuous batching: drop the running requests named in ``cancel`` (their KV pages
        freed; they finish with a user error), admit new requests (prefill), decode up to
        ``max_decode_steps`` steps for every running sequence, and return the requests that
        finished (with their request ids), in any order, and the new tokens of the streamed
        requests that still run. Requests that stay unfinished keep running next call.
        Admitted requests' adapters are resident (the scheduler installs them first)."""
        ...

    def num_running_samples(self) -> int:
        """Requests admitted by `sample_step` and not yet returned."""
        ...

    def adapter_memory(self) -> AdapterMemory:
        """What the resident (and paged-out) adapters take; cheap, any thread."""
        ...

    def release_memory(self) -> None:
        """The clock loop has had no work for a while: hand host memory kept for the next
        step back to the OS (``EngineConfig.retain_host_memory``)."""
        ...

    def close(self) -> None:
        """Release the worker (the server is stopping); no call follows."""
        ...
