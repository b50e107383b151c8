"""The op vocabulary, in one place: what a request asks for (`Op`), how the scheduler carries
it (`WorkItem`), what a future resolves with (`FutureResult`), and what one clock step asks the
engine to do (`Plan`).

Every dispatch over these unions is a ``match`` ending in ``assert_never``, so a new kind of op,
result or plan fails ``mypy`` wherever it must be handled. Forward/backward and optim-step ops
are the engine's own work items (``domain.work``), not wrappers around them. Ops carry domain
values only (no SQLite records, no pydantic, no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, assert_never

from loraplex.domain.checkpoint import ReservedCheckpoint
from loraplex.domain.ids import CheckpointKind, TinkerPath
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult, PreparedAdapter
from loraplex.domain.sampling import SampleResult
from loraplex.domain.training_run import TrainingRun
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork
from loraplex.errors import LoraplexError, UserError

# Tinker's X-Tinker-Request-Type names, which are also the keys of the future kinds.
RequestKind = Literal[
    "CreateModel", "ForwardBackward", "Forward", "OptimStep", "SaveWeights",
    "SaveWeightsForSampler", "SaveWeightsExternal", "LoadWeights", "Sample",
    "CreateCustomLoss",
]
SamplerSource = Literal["base", "checkpoint", "snapshot", "inflight"]
"""What a sampling session samples: the bare base model, a checkpoint directory, or an in-memory
snapshot of a training run (``snapshot`` frozen, ``inflight`` following later inflight saves)."""


# ---- ops ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateModelOp:
    """Create a fresh adapter for a new training run (the run's seq 0)."""

    run: TrainingRun


@dataclass(frozen=True)
class LoadOp:
    """Load a checkpoint: into a new run (create-via-load, seq 0) or an existing one.

    Attributes:
        new_run: the run to create once loaded, its LoRA config taken from the checkpoint
            (None: load into an existing run).
    """

    work: LoadWork
    path: TinkerPath
    new_run: TrainingRun | None = None


@dataclass(frozen=True)
class SaveOp:
    """Write the run's adapter into a reserved checkpoint directory, then commit it.

    Attributes:
        with_optimizer: ``save_state`` (weights/) keeps the AdamW state too.
        encrypt_to: age recipients; every file is replaced by its ``.age`` ciphertext.
    """

    model_id: str
    checkpoint: ReservedCheckpoint
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

    def adapter_id(self, request_id: str) -> str:
        """Engine id of the sampler version this save creates (unique per request)."""
        return (self.sampler_id if self.kind == "snapshot"
                else f"{self.model_id}:inflight:{request_id}")


@dataclass(frozen=True)
class SampleOp:
    """One asample request.

    Attributes:
        work: the engine request; for ``inflight`` samplers the scheduler fills in the adapter
            version current at submit time.
        sequence_ids: one id per sample, returned at submit time, stamped on the results.
        source: what the sampling session is bound to.
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
    (so later ops are not stuck behind a gap) and fails its own future when its turn comes.
    The error is detached (message and field only: no traceback holding the request)."""

    error: LoraplexError


Op = (CreateModelOp | LoadOp | ForwardBackwardWork | OptimStepWork | SaveOp | SnapshotOp
      | SampleOp | FailedOp)


def new_run_of(op: Op) -> TrainingRun | None:
    """The training run an op brings to life (create, create-via-load), else None."""
    match op:
        case CreateModelOp():
            return op.run
        case LoadOp():
            return op.new_run
        case ForwardBackwardWork() | OptimStepWork() | SaveOp() | SnapshotOp() | SampleOp():
            return None
        case FailedOp():
            return None
        case _:
            assert_never(op)


def does_file_work(op: Op) -> bool:
    """Saves and loads read or write checkpoint files (the scheduler runs them on IO threads)."""
    match op:
        case SaveOp() | LoadOp():
            return True
        case (CreateModelOp() | ForwardBackwardWork() | OptimStepWork() | SnapshotOp()
              | SampleOp() | FailedOp()):
            return False
        case _:
            assert_never(op)


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
        """Datum tokens of a forward/backward, prompt tokens of a sample, else 0."""
        match self.op:
            case ForwardBackwardWork():
                return self.op.num_tokens
            case SampleOp():
                return len(self.op.work.prompt)
            case _:
                return 0


@dataclass(frozen=True)
class Admitted:
    """What a submit answers: the request id (the original one for a retried submit)."""

    request_id: str
    sample_sequence_ids: tuple[str, ...] = field(default=())


# ---- what futures resolve with --------------------------------------------------------------


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
    kind: CheckpointKind


@dataclass(frozen=True)
class SamplerSnapshotReady:
    sampling_session_id: str


@dataclass(frozen=True)
class Sampled:
    result: SampleResult
    sequence_ids: tuple[str, ...]


@dataclass(frozen=True)
class CustomLossCreated:
    """``create_custom_loss``: the stored loss's id."""

    loss_id: str


FutureResult = (ModelCreated | WeightsLoaded | CheckpointSaved | SamplerSnapshotReady | Sampled
                | ForwardBackwardResult | OptimStepResult | CustomLossCreated)


# ---- plans: what one clock step asks the engine to do ----------------------------------------


@dataclass(frozen=True)
class PlanStart:
    """When a plan was made (the scheduler's clock), how long the engine idled before it, and
    how long planning took; the plan's own record, so nothing is kept aside per plan."""

    at: float = 0.0
    idle_s: float = 0.0
    plan_s: float = 0.0


@dataclass(frozen=True)
class CyclePlan:
    """One training clock cycle: a packed batch, then optim steps.

    Attributes:
        batch: forward / forward_backward ops of many models (several consecutive ones of the
            same model allowed) for one engine ``forward_backward`` call, in model-then-seq
            order; pre-failed ops among them resolve with their error without the engine.
        optim: optim steps applied after the batch (one per model), each closing its model's
            ops in the batch or standing alone at its model's head.
    """

    batch: tuple[WorkItem, ...]
    optim: tuple[WorkItem, ...] = ()
    start: PlanStart = PlanStart()

    @property
    def items(self) -> tuple[WorkItem, ...]:
        return self.batch + self.optim


@dataclass(frozen=True)
class ControlPlan:
    """One create or snapshot op (or a pre-failed op that needs no engine). Saves and loads
    do their file work on IO threads instead (a load's install is an `InstallPlan`)."""

    item: WorkItem
    start: PlanStart = PlanStart()


@dataclass(frozen=True)
class SamplePlan:
    """One continuous-batching step: drop the cancelled requests (``cancel``: request ids whose
    client went away), admit new requests, decode every running sequence."""

    admit: tuple[WorkItem, ...]
    max_decode_steps: int
    start: PlanStart = PlanStart()
    cancel: tuple[str, ...] = ()


@dataclass(frozen=True)
class Install:
    """A checkpoint read on an IO thread, to be put into the engine on the clock thread.

    Attributes:
        item: the ``load_weights`` op it completes (None: a checkpoint-backed sampler adapter
            that waiting samples need).
    """

    adapter_id: str
    prepared: PreparedAdapter
    item: WorkItem | None = None


@dataclass(frozen=True)
class InstallPlan:
    """Install checkpoints read off the clock thread (cheap: no file work)."""

    installs: tuple[Install, ...]
    start: PlanStart = PlanStart()


@dataclass(frozen=True)
class ExpirePlan:
    """Ops stuck behind a seq_id that never arrived: each fails with ``error`` (no engine)."""

    items: tuple[WorkItem, ...]
    error: UserError
    start: PlanStart = PlanStart()


@dataclass(frozen=True)
class ReleasePlan:
    """Drop adapters nobody can use any more."""

    adapter_ids: tuple[str, ...]
    start: PlanStart = PlanStart()


Plan = CyclePlan | ControlPlan | SamplePlan | InstallPlan | ExpirePlan | ReleasePlan
