"""What finishing each kind of op does to the persistent stores, and what its future gets.

Runs on the clock-loop thread right after the engine call, before the future resolves, so a
client never sees a result whose record is missing (a checkpoint path that is not yet listed,
a sampling session that does not exist). A failed op rolls back what its submit reserved.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from loraplex.domain.results import ForwardBackwardResult, LoadResult, OptimStepResult
from loraplex.domain.sampling import SampleResult
from loraplex.errors import LoraplexError, ServerError
from loraplex.scheduler.ops import (
    CheckpointSaved,
    CreateModelOp,
    FailedOp,
    ForwardBackwardOp,
    FutureResult,
    LoadOp,
    ModelCreated,
    OptimStepOp,
    ReleaseOp,
    Sampled,
    SampleOp,
    SamplerSnapshotReady,
    SaveOp,
    SnapshotOp,
    WeightsLoaded,
    WorkItem,
)
from loraplex.store.checkpoints import CheckpointStore
from loraplex.store.encryption import encrypt_directory
from loraplex.store.runs import RunStore
from loraplex.store.samplers import SamplerStore, new_record
from loraplex.store.sequences import SequenceStore


class Effects:
    """Applies completion side effects with the stores the scheduler was given."""

    def __init__(self, runs: RunStore, checkpoints: CheckpointStore, samplers: SamplerStore,
                 sequences: SequenceStore) -> None:
        self.runs = runs
        self.checkpoints = checkpoints
        self.samplers = samplers
        self.sequences = sequences

    def succeeded(self, item: WorkItem, outcome: Any, *, engine_adapter: str | None = None,
                  trained_tokens: int = 0) -> FutureResult:
        """Record a successful op; returns what its future resolves with.

        Args:
            engine_adapter: for a snapshot, the engine id of the version it created.
            trained_tokens: for an optim step, tokens trained since the previous step.
        """
        op = item.op
        if isinstance(op, CreateModelOp):
            self.runs.insert(op.run)
            return ModelCreated(op.run.model_id)
        if isinstance(op, LoadOp):
            assert isinstance(outcome, LoadResult)
            if op.new_run is not None:
                self.runs.insert(replace(op.new_run, lora=outcome.config))
            else:
                self.runs.touch(op.work.adapter_id)
            return WeightsLoaded(op.work.adapter_id, str(op.path))
        if isinstance(op, SaveOp):
            if op.encrypt_to:
                encrypt_directory(op.checkpoint.directory, op.encrypt_to)
            record = self.checkpoints.commit(op.checkpoint)
            return CheckpointSaved(str(record.path), record.size_bytes, record.path.kind)
        if isinstance(op, SnapshotOp):
            self.samplers.insert(new_record(
                sampler_id=op.sampler_id, tenant=op.tenant, session_id=op.session_id,
                base_model=op.base_model, model_path=None, source=op.kind, model_id=op.model_id,
                adapter_id=engine_adapter if op.kind == "snapshot" else None, adapter_dir=None))
            return SamplerSnapshotReady(op.sampler_id)
        if isinstance(op, SampleOp):
            assert isinstance(outcome, SampleResult)
            self._record_sequences(item, op, outcome)
            return Sampled(outcome, op.sequence_ids)
        if isinstance(op, OptimStepOp):
            assert isinstance(outcome, OptimStepResult)
            self.runs.record_step(op.work.adapter_id, trained_tokens)
            return outcome
        if isinstance(op, ForwardBackwardOp):
            assert isinstance(outcome, ForwardBackwardResult)
            return outcome
        if isinstance(op, ReleaseOp | FailedOp):
            return None
        raise AssertionError(f"no effect for {type(op).__name__}")

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
