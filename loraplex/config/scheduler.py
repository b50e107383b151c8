"""`SchedulerConfig`: clock-cycle scheduling and admission (``[scheduler]``)."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.config.checks import check_at_least_one
from loraplex.errors import user_error


@dataclass(frozen=True)
class SchedulerConfig:
    """Clock-cycle scheduling and admission.

    Attributes:
        token_budget: most datum tokens packed into one training batch.
        max_inflight_per_tenant: queued + running ops per tenant before backpressure.
        quantum_tokens: deficit round-robin quantum per tenant per round.
        timeslice: naive mode, one model per cycle (the multiplexing baseline).
        decode_steps_per_cycle: sampler decode steps between training batches when both wait.
        stream_decode_steps: at most this many decode steps per sampling step while a
            streamed request runs, so its tokens leave the server as they are sampled (each
            step's new tokens are sent once it ends).
        max_sampler_snapshots_per_model: newest ephemeral sampler snapshots kept in engine
            memory per training run (older sampling sessions of that run stop working).
        max_checkpoint_samplers: checkpoint-backed sampler adapters kept loaded (LRU).
        sample_kv_budget_tokens: KV tokens running sampling requests may reserve (prompt +
            num_samples × max_tokens each, the worst case). About twice the engine's KV
            cache by default: most samples stop before max_tokens, and when pages do run out
            the engine preempts and later recomputes its newest sequences.
        sample_share: engine-time share sampling gets while training also waits (0..1).
        sample_anticipation_s: after a sampling step finished requests, training waits up to
            this long for those clients' next requests (a sequential sampler beside a
            training flood otherwise waits a whole cycle per request; 0: off). The wait is
            charged to sampling's share.
        sample_anticipation_cycle_fraction: and at most this part of a mean training cycle,
            which bounds what training loses to clients that do not come back.
        sample_prefill_tokens_per_step: prompt tokens sampling admits per step (the first
            request always), so a burst of long prompts is prefilled over several steps and a
            short request admitted beside it is not held behind all of them.
        sample_max_tenant_share: the part of ``sample_kv_budget_tokens`` one tenant's running
            requests may reserve while another tenant sampled within
            ``latency_fair_window_s``, so others always find room.
        seq_gap_timeout_s: ops stuck this long behind a seq_id that never arrived are failed
            and the missing seq_id is skipped (None: wait forever). Longer than the SDK's
            5-minute submit retry window.
        cycle_history: cycle records kept for the stats endpoint.
        io_threads: threads per base model that run checkpoint saves (write, encryption,
            commit) and checkpoint reads, so file work never stalls the clock loop.
        max_seq_ahead: how far past the next expected seq_id of a model a request may be
            (a request further ahead is refused; bounds what the gap timeout skips).
        latency_fair_window_s: while other tenants trained within this many seconds, a tenant
            packs about as many tokens per cycle as the largest of their recent demands (but
            at least ``latency_fair_floor_tokens``), so a flood of one tenant's work does not
            lengthen everyone's cycles (0: off).
        latency_fair_floor_tokens: the least a tenant may pack per cycle under that rule, so
            tenants of unequal batch sizes still fill cycles.
    """

    token_budget: int = 16384
    max_inflight_per_tenant: int = 256
    quantum_tokens: int = 2048
    timeslice: bool = False
    decode_steps_per_cycle: int = 8
    stream_decode_steps: int = 1
    max_sampler_snapshots_per_model: int = 4
    max_checkpoint_samplers: int = 16
    sample_kv_budget_tokens: int = 262144
    sample_share: float = 0.5
    sample_anticipation_s: float = 0.1
    sample_anticipation_cycle_fraction: float = 0.05
    sample_prefill_tokens_per_step: int = 8192
    sample_max_tenant_share: float = 0.75
    seq_gap_timeout_s: float | None = 900.0
    cycle_history: int = 4096
    io_threads: int = 2
    max_seq_ahead: int = 4096
    latency_fair_window_s: float = 2.0
    latency_fair_floor_tokens: int = 128

    def __post_init__(self) -> None:
        check_at_least_one(self, "token_budget")
        if not 0 < self.sample_max_tenant_share <= 1:
            raise user_error("sample_max_tenant_share",
                             f"must be in (0, 1], got {self.sample_max_tenant_share}")
        for name in ("sample_anticipation_s", "sample_anticipation_cycle_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise user_error(name, f"must be in [0, 1], got {getattr(self, name)}")
        check_at_least_one(self, "decode_steps_per_cycle", "stream_decode_steps",
                            "sample_prefill_tokens_per_step")
