"""``GET /api/v1/loraplex/dashboard/tenant`` as sent: the calling tenant's newest training runs,
checkpoints (with a signed download URL and their evaluation scores) and sampling sessions,
each list with its total. Times are Unix seconds."""

from __future__ import annotations

from pydantic import BaseModel, Field, JsonValue

from loraplex.domain.eval_score import EvalScore


class LoraView(BaseModel):
    rank: int
    alpha: float
    train_attn: bool
    train_mlp: bool
    train_unembed: bool
    seed: int | None


class RunRow(BaseModel):
    model_id: str
    base_model: str
    session_id: str
    created_at: float
    last_request_time: float
    num_steps: int
    num_trained_tokens: int
    lora: LoraView
    optimizer_config: dict[str, JsonValue] = Field(description="as the client sent it")
    user_metadata: dict[str, JsonValue]
    is_live: bool = Field(description="whether its adapter is in engine memory")


class CheckpointRow(BaseModel):
    tinker_path: str
    run_id: str
    checkpoint_id: str
    kind: str
    name: str
    size_bytes: int
    created_at: float
    expires_at: float | None
    ttl_left_s: float | None
    public: bool
    user_metadata: dict[str, str]
    download_url: str = Field(description="a signed GET of its tar archive, no key needed")
    download_expires_at: int
    evals: list[EvalScore]


class SamplerRow(BaseModel):
    sampler_id: str
    session_id: str
    base_model: str
    source: str
    model_path: str | None
    model_id: str | None
    created_at: float


class TenantView(BaseModel):
    tenant: str
    is_operator: bool
    now: float
    runs: list[RunRow]
    num_runs: int
    checkpoints: list[CheckpointRow]
    num_checkpoints: int
    sampling_sessions: list[SamplerRow]
    num_sampling_sessions: int
