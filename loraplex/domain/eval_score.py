"""`EvalScore`: one metric of one evaluation task on one checkpoint, as lm-evaluation-harness
reports it (``acc`` of ``hellaswag``, with its standard error and sample count)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.errors import user_error

MAX_NAME = 200


@dataclass(frozen=True)
class EvalScore:
    """Attributes:
        task: the task's name (``hellaswag``, a local task's ``task:``).
        metric: the metric, with lm-eval's filter when it is not ``none``
            (``exact_match,strict-match``).
        value: the score.
        stderr: its standard error, when lm-eval gives one.
        num_samples: documents scored (after ``--limit``).
        created_at: when it was stored (Unix seconds).
    """

    task: str
    metric: str
    value: float
    stderr: float | None = None
    num_samples: int | None = None
    created_at: float = 0.0

    def validate(self, field: str) -> EvalScore:
        for name in ("task", "metric"):
            text = getattr(self, name)
            if not isinstance(text, str) or not 0 < len(text) <= MAX_NAME:
                raise user_error(f"{field}.{name}", f"a name of 1-{MAX_NAME} characters")
        for name in ("value", "stderr"):
            number = getattr(self, name)
            if number is not None and (isinstance(number, bool) or not math.isfinite(number)):
                raise user_error(f"{field}.{name}", f"a finite number, got {number!r}")
        if self.num_samples is not None and self.num_samples < 0:
            raise user_error(f"{field}.num_samples", "must be ≥ 0")
        return self
