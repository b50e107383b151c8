"""Training runs and checkpoints as the REST views send them (tinker-api.md §5), named and
shaped as the SDK's ``tinker.types`` parse them, with times as ISO 8601 UTC strings (``…Z``).
Two differences from the SDK's own models: a checkpoint also names its ``training_run_id``,
and fields without a value are left out rather than sent as null (`Checkpoint`)."""

from __future__ import annotations

from pydantic import BaseModel


class Checkpoint(BaseModel):
    """A saved checkpoint; ``user_metadata`` is set only when not empty, ``expires_at`` only
    when it has a TTL."""

    checkpoint_id: str
    checkpoint_type: str
    time: str
    tinker_path: str
    size_bytes: int
    public: bool
    training_run_id: str
    user_metadata: dict[str, str] | None = None
    expires_at: str | None = None


class TrainingRun(BaseModel):
    """A training run; ``last_checkpoint`` / ``last_sampler_checkpoint``: the newest visible
    checkpoint of each kind, set only when there is one."""

    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool
    corrupted: bool
    lora_rank: int
    last_request_time: str
    user_metadata: dict[str, str]
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None


class Cursor(BaseModel):
    offset: int
    limit: int
    total_count: int


class TrainingRunsResponse(BaseModel):
    training_runs: list[TrainingRun]
    cursor: Cursor


class CheckpointsListResponse(BaseModel):
    """A page of checkpoints; ``cursor`` only on the user-wide list."""

    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None
