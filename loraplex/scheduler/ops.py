"""Domain ops: what a request asks the system to do, after the API has validated it, and what a
finished op resolves its future with.

One frozen dataclass per kind of op. An op is wrapped in a `WorkItem` (tenant, ordering key,
seq_id, enqueue time) and submitted to the scheduler; the results below (or the domain results
the engine returns) travel back through the future store. No pydantic, no torch, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loraplex.domain.ids import TinkerPath
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.domain.sampling import SampleResult
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork
from loraplex.errors import LoraplexError
from loraplex.store.checkpoints import PendingCheckpoint
from loraplex.store.runs import TrainingRunRecord
from loraplex.store.samplers import SamplerSource

# Tinker's X-Tinker-Request-Type names, which are also the keys of the future kinds.
RequestKind = Literal[
    "CreateModel", "ForwardBackward", "Forward", "OptimStep", "SaveWeights",
    "SaveWeightsForSampler", "SaveWeightsExternal", "LoadWeights", "Sample",
]


@dataclass(frozen=True)
class CreateModelOp:
    """Create a fresh adapter for a new training run (the run's seq 0)."""

    run: TrainingRunRecord


@dataclass(frozen=True)
class LoadOp:
    """Load a checkpoint: into a new run (create-via-load, seq 0) or an existing one.

    Attributes:
        new_run: the run record to create once loaded (None: load into an existing run).
    """

    work: LoadWork
    path: TinkerPath
    new_run: TrainingRunRecord | None = None


@dataclass(frozen=True)
class ForwardBackwardOp:
    work: ForwardBackwardWork


@dataclass(frozen=True)
class OptimStepOp:
    work: OptimStepWork


@dataclass(frozen=True)
class SaveOp:
    """Write the run's adapter into a pending checkpoint directory, then commit it.

    Attributes:
        with_optimizer: ``save_state`` (weights/) keeps the AdamW state too.
        encrypt_to: age recipients; every file is replaced by its ``.age`` ciphertext.
    """

    model_id: str
    checkpoint: PendingCheckpoint
    with_optimizer: bool
    encrypt_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class SnapshotOp:
    """Ephemeral ``save_weights_for_sampler``: freeze the run's weights for a sampling session.

    Attributes:
        kind: ``snapshot`` (frozen) or ``inflight`` (the session follows later inflight saves).
    """

    model_id: str
    sampler_id: str
    session_id: str
    tenant: str
    base_model: str
    kind: Literal["snapshot", "inflight"]


@dataclass(frozen=True)
class SampleOp:
    """One asample request.

    Attributes:
        work: the engine request; for ``inflight`` samplers the scheduler fills in the adapter
            version current at submit time.
        sequence_ids: one id per sample, returned at submit time, stamped on the results.
        source: what the sampling session is bound to (``base``, ``checkpoint``, ``snapshot``,
            ``inflight``).
        model_id: the training run behind a snapshot / inflight sampler.
        record_for_session: session that owns recorded sequences (record_stability_info).
        base_model: the served NAME sampled (metering prices by it).
        usage_run_id: the training run its usage is attributed to (the run behind a snapshot
            / inflight sampler, or the run that wrote its checkpoint; None: the bare base).
    """

    work: SampleWork
    sequence_ids: tuple[str, ...]
    source: SamplerSource = "base"
    model_id: str | None = None
    record_for_session: str | None = None
    base_model: str | None = None
    usage_run_id: str | None = None


@dataclass(frozen=True)
class FailedOp:
    """A request rejected after its seq_id was known: it keeps its place in the model's order
    (so later ops are not stuck behind a gap) and fails its own future when its turn comes."""

    error: LoraplexError


@dataclass(frozen=True)
class ReleaseOp:
    """Drop engine adapters (finished sessions, evicted sampler snapshots)."""

    adapter_ids: tuple[str, ...]


Op = (CreateModelOp | LoadOp | ForwardBackwardOp | OptimStepOp | SaveOp | SnapshotOp | SampleOp
      | FailedOp | ReleaseOp)


@dataclass(frozen=True)
class WorkItem:
    """An op with everything the scheduler orders and accounts it by.

    Attributes:
        request_id: the future it resolves.
        tenant: owner (fairness, limits, future access).
        kind: the future's request type.
        model_id: per-model ordering key for training ops (None for samples).
        seq_id: position in the model's order (the SDK's per-client counter).
        sampler_key: ``(sampling_session_id, seq_id)`` for sample dedupe.
        enqueued_at: monotonic submit time.
    """

    request_id: str
    tenant: str
    kind: RequestKind
    op: Op
    model_id: str | None = None
    seq_id: int | None = None
    sampler_key: tuple[str, int] | None = None
    enqueued_at: float = 0.0

    @property
    def num_tokens(self) -> int:
        if isinstance(self.op, ForwardBackwardOp):
            return self.op.work.num_tokens
        if isinstance(self.op, SampleOp):
            return len(self.op.work.prompt)
        return 0


@dataclass(frozen=True)
class Admitted:
    """What a submit answers: the request id (the original one for a retried submit)."""

    request_id: str
    sample_sequence_ids: tuple[str, ...] = field(default=())


# ---- what futures resolve with, besides the engine's own results --------------------------


@dataclass(frozen=True)
class ModelCreated:
    model_id: str


@dataclass(frozen=True)
class WeightsLoaded:
    model_id: str
    path: str


@dataclass(frozen=True)
class CheckpointSaved:
    """A committed checkpoint (``kind`` says which Tinker response shape to answer with)."""

    path: str
    size_bytes: int
    kind: Literal["weights", "sampler_weights", "external_weights"]


@dataclass(frozen=True)
class SamplerSnapshotReady:
    sampling_session_id: str


@dataclass(frozen=True)
class Sampled:
    result: SampleResult
    sequence_ids: tuple[str, ...]


FutureResult = (ModelCreated | WeightsLoaded | CheckpointSaved | SamplerSnapshotReady | Sampled
                | ForwardBackwardResult | OptimStepResult | None)
