"""`LossSpec` (what a loss needs: inputs, config keys with defaults, the function) and
`LossOutput` (what it returns). One spec per loss file; `registry` collects them.

Every loss is a pure function ``fn(logprobs, inputs) -> LossOutput`` where ``logprobs`` is the
model's log-probability of each target token (shape of ``inputs.target_tokens``, with autograd)
and the loss is a **sum** over tokens (Tinker semantics: no means).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from loraplex.engine.losses.loss_inputs import LossInputs

REDUCTIONS = frozenset({"mean", "sum", "min", "max"})


@dataclass(frozen=True)
class LossOutput:
    """The result of one loss over one request.

    Attributes:
        loss: scalar, the sum over all datums and tokens; carries autograd to ``logprobs``.
        elementwise_loss_T: detached float32 ``[T]`` per-position loss (summed over K for
            top-K cross-entropy); ``elementwise_loss_T.sum() == loss``, except for uploaded
            custom losses, which are not per position (zeros).
        metrics: ``name:reduction`` → detached 0-d tensor; ``loss:sum`` always present.
    """

    loss: torch.Tensor
    elementwise_loss_T: torch.Tensor
    metrics: Mapping[str, torch.Tensor]

    def metric_values(self) -> dict[str, float]:
        """Metrics as Python floats, with a single device→host copy."""
        names = list(self.metrics)
        if not names:
            return {}
        # float64: exact for float32 metrics, and keeps the custom losses' float64 sums.
        values = torch.stack([self.metrics[n].detach().double().reshape(()) for n in names])
        return dict(zip(names, values.tolist(), strict=True))


LossFn = Callable[[torch.Tensor, LossInputs], LossOutput]
#: Extra per-datum check: (datum index, that datum's float inputs as tensors) → raise UserError.
DatumCheck = Callable[[int, Mapping[str, torch.Tensor]], None]


@dataclass(frozen=True)
class LossSpec:
    """Everything validation and the trainer need to know about one loss.

    Attributes:
        name: the Tinker ``loss_fn`` string.
        fn: the loss function.
        required_inputs: float32 ``loss_fn_inputs`` keys that must be present (besides the
            always-required int64 ``target_tokens``).
        optional_inputs: float32 keys used when present (validated like required ones).
        config_defaults: every accepted ``loss_fn_config`` key and its default.
        allows_2d_targets: ``target_tokens`` / ``weights`` may be ``[N, K]`` (top-K targets).
        nan_allowed_inputs: float inputs in which NaN means "absent at this position".
        check_datum: extra per-datum validation beyond presence, dtype, shape and finiteness.
    """

    name: str
    fn: LossFn
    required_inputs: tuple[str, ...]
    optional_inputs: tuple[str, ...] = ()
    config_defaults: Mapping[str, float] = field(default_factory=dict)
    allows_2d_targets: bool = False
    nan_allowed_inputs: frozenset[str] = frozenset()
    check_datum: DatumCheck | None = None
