"""Metered usage: the one counter record (`UsageCounts`) every layer sums, and what one
finished op consumed (`OpUsage`).

The scheduler makes an `OpUsage` per finished op; the server folds them into `UsageCounts`
per `UsageKey` in SQLite; the stats view keeps per-tenant sums of the same record; billing
prices it (``loraplex.cost.billing``).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields


@dataclass(frozen=True)
class UsageCounts:
    """Summed quantities.

    Attributes:
        num_ops, num_failed: ops finished, and how many of them failed (failures carry no
            tokens, only the engine time they took).
        engine_s: engine seconds attributed to the ops (a packed call is shared by tokens).
        trained_tokens: datum tokens of forward_backward ops.
        forward_tokens: datum tokens of forward-only ops.
        prompt_tokens: prompt tokens of sample requests, once per request (what the engine
            prefills; ``cache_hit_tokens`` of them came from its prefix cache).
        rollout_prompt_tokens: prompt × num_samples: what per-rollout billing counts.
        cache_hit_tokens: prompt tokens the engine served from its prefix cache.
        sampled_tokens: generated tokens.
        num_sequences: completions generated (Σ num_samples).
    """

    num_ops: int = 0
    num_failed: int = 0
    engine_s: float = 0.0
    trained_tokens: int = 0
    forward_tokens: int = 0
    prompt_tokens: int = 0
    rollout_prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    sampled_tokens: int = 0
    num_sequences: int = 0

    def __add__(self, other: UsageCounts) -> UsageCounts:
        return UsageCounts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


USAGE_COUNTERS = tuple(f.name for f in fields(UsageCounts))
TOKEN_TYPES = ("trained", "forward", "prompt", "cache_hit", "sampled")
"""``{type}_tokens`` counters, as the stats and metrics views label them."""


@dataclass(frozen=True)
class UsageKey:
    """What a stored row of counters is about.

    Attributes:
        run_id: the training run (``""``: sampling the bare base model).
        base_model: the served NAME (``""`` when unknown).
        kind: the op's Tinker request type (``ForwardBackward``, ``Forward``, ``Sample``, ...).
        hour: start of the UTC hour the ops finished in (Unix seconds).
    """

    tenant: str
    run_id: str
    base_model: str
    kind: str
    hour: int


@dataclass(frozen=True)
class OpUsage:
    """What one finished op consumed.

    Attributes:
        kind: the op's request type.
        run_id: the training run it belongs to (a sample: the run behind its sampler or the
            run that wrote its checkpoint; None for the bare base model).
        base_model: the served NAME (None when unknown).
        finished_at: wall-clock time it finished (Unix seconds).
        counts: its quantities (``num_ops`` = 1).
    """

    request_id: str
    tenant: str
    kind: str
    run_id: str | None
    base_model: str | None
    finished_at: float
    counts: UsageCounts

    @property
    def failed(self) -> bool:
        return self.counts.num_failed > 0

    @property
    def key(self) -> UsageKey:
        return UsageKey(self.tenant, self.run_id or "", self.base_model or "", self.kind,
                        int(self.finished_at) // 3600 * 3600)
