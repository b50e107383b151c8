"""What finishing each kind of op does to the persistent stores, and what its future gets.

Runs right after the engine call (on the clock thread; for saves and loads, on the IO thread
that did the file work), before the future resolves, so a client never sees a result whose
record is missing (a checkpoint path that is not yet listed, a sampling session that does not
exist). A failed op rolls back what its submit reserved.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar, assert_never

from loraplex.domain.ops import (
    CheckpointSaved,
    CreateModelOp,
    FailedOp,
    FutureResult,
    LoadOp,
    ModelCreated,
    Sampled,
    SampleOp,
    SamplerSnapshotReady,
    SaveOp,
    SnapshotOp,
    WeightsLoaded,
    WorkItem,
)
from loraplex.domain.results import (
    AdapterReady,
    EngineResult,
    ForwardBackwardResult,
    LoadResult,
    OptimStepResult,
    SaveResult,
)
from loraplex.domain.sampling import SampleResult
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import LoraplexError, ServerError
from loraplex.store.checkpoints import CheckpointRecord, CheckpointStore
from loraplex.store.encryption import encrypt_directory
from loraplex.store.runs import RunStore
from loraplex.store.samplers import SamplerStore, new_record
from loraplex.store.sequences import SequenceStore

R = TypeVar("R")


def expect(result: EngineResult, kind: type[R], item: WorkItem) -> R:
    """``result`` as the type the protocol promises for ``item``'s op (else a server bug)."""
    if not isinstance(result, kind):
        raise ServerError(f"executor returned {type(result).__name__} for {item.kind} "
                          f"{item.request_id}")
    return result


class Effects:
    """Applies completion side effects with the stores the scheduler was given."""

    def __init__(self, runs: RunStore, checkpoints: CheckpointStore, samplers: SamplerStore,
                 sequences: SequenceStore) -> None:
        self.runs = runs
        self.checkpoints = checkpoints
        self.samplers = samplers
        self.sequences = sequences

    def succeeded(self, item: WorkItem, result: EngineResult, *, trained_tokens: int = 0
                  ) -> FutureResult:
        """Record a successful op; returns what its future resolves with.

        Args:
            trained_tokens: for an optim step, tokens trained since the previous step.
        """
        op = item.op
        match op:
            case CreateModelOp():
                expect(result, AdapterReady, item)
                self.runs.insert(op.run)
                return ModelCreated(op.run.model_id)
            case LoadOp():
                self._record_load(op, expect(result, LoadResult, item))
                return WeightsLoaded(op.work.adapter_id, str(op.path))
            case SaveOp():
                expect(result, SaveResult, item)
                record = self._commit(op)
                return CheckpointSaved(str(record.path), record.size_bytes, record.path.kind)
            case SnapshotOp():
                self._record_snapshot(op, expect(result, AdapterReady, item))
                return SamplerSnapshotReady(op.sampler_id)
            case SampleOp():
                sampled = expect(result, SampleResult, item)
                self._record_sequences(item, op, sampled)
                return Sampled(sampled, op.sequence_ids)
            case OptimStepWork():
                stepped = expect(result, OptimStepResult, item)
                self.runs.record_step(op.adapter_id, trained_tokens)
                return stepped
            case ForwardBackwardWork():
                return expect(result, ForwardBackwardResult, item)
            case FailedOp():
                raise ServerError(f"pre-failed op {item.request_id} reported a success")
            case _:
                assert_never(op)

    def _record_load(self, op: LoadOp, loaded: LoadResult) -> None:
        """A create-via-load's new run, with the LoRA config of its checkpoint; else the run
        loaded into is touched."""
        if op.new_run is not None:
            self.runs.insert(replace(op.new_run, lora=loaded.config))
        else:
            self.runs.touch(op.work.adapter_id)

    def _commit(self, op: SaveOp) -> CheckpointRecord:
        """List a written checkpoint (encrypting it first when asked)."""
        try:
            if op.encrypt_to:
                encrypt_directory(op.checkpoint.directory, op.encrypt_to)
            return self.checkpoints.commit(op.checkpoint)
        except LoraplexError:
            raise
        except Exception as exc:  # a full or read-only disk: say so, not "a bug"
            raise self.checkpoints.storage_error(exc) from None

    def _record_snapshot(self, op: SnapshotOp, ready: AdapterReady) -> None:
        """The sampler a snapshot made (an inflight one keeps no adapter of its own)."""
        self.samplers.insert(new_record(
            sampler_id=op.sampler_id, tenant=op.tenant, session_id=op.session_id,
            base_model=op.base_model, model_path=None, source=op.kind, model_id=op.model_id,
            adapter_id=ready.adapter_id if op.kind == "snapshot" else None, adapter_dir=None))

    def failed(self, item: WorkItem, error: LoraplexError) -> None:
        """Undo what the submit reserved for an op that failed."""
        if isinstance(item.op, SaveOp):
            self.checkpoints.abort(item.op.checkpoint)

    def _record_sequences(self, item: WorkItem, op: SampleOp, result: SampleResult) -> None:
        if op.record_for_session is None:
            return
        if len(result.sequences) != len(op.sequence_ids):
            raise ServerError(f"sampler returned {len(result.sequences)} sequences for "
                              f"{len(op.sequence_ids)} ids")
        self.sequences.record(
            request_id=item.request_id, tenant=item.tenant, session_id=op.record_for_session,
            prompt=op.work.prompt,
            sequences=[(sid, seq.tokens, seq.logprobs)
                       for sid, seq in zip(op.sequence_ids, result.sequences, strict=True)],
        )
