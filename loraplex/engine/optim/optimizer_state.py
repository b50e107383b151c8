"""`AdamWState`: one adapter's optimizer state (step count, first and second moments per
trainable tensor) and its exact round trip through named tensors for checkpoints.

Knows nothing of files or of the update rule (`adamw`); the checkpoint code stores
`state_dict()` in safetensors and hands the tensors back to `from_state_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from loraplex.errors import user_error

STEP_KEY = "step"


@dataclass(frozen=True)
class AdamWState:
    """AdamW moments of one adapter, updated in place by `adamw.adamw_step`.

    Attributes:
        names: stable names of the adapter's trainable tensors, in update order.
        step: float32 0-d tensor on the parameters' device, the number of steps taken
            (torch.optim keeps its step as a float32 tensor too; the fused kernel reads it).
        exp_avg: first moments, one per tensor, shaped like it.
        exp_avg_sq: second moments, one per tensor, shaped like it.
    """

    names: tuple[str, ...]
    step: torch.Tensor
    exp_avg: list[torch.Tensor]
    exp_avg_sq: list[torch.Tensor]

    @staticmethod
    def zeros(names: Sequence[str], params: Sequence[torch.Tensor]) -> AdamWState:
        """Fresh state (step 0, zero moments) for ``params``, which ``names`` name."""
        if len(names) != len(params) or len(set(names)) != len(names):
            raise ValueError("names must be unique, one per parameter tensor")
        device = params[0].device if params else torch.device("cpu")
        return AdamWState(
            names=tuple(names),
            step=torch.zeros((), dtype=torch.float32, device=device),
            exp_avg=[torch.zeros_like(p, memory_format=torch.preserve_format) for p in params],
            exp_avg_sq=[torch.zeros_like(p, memory_format=torch.preserve_format) for p in params],
        )

    @property
    def num_steps(self) -> int:
        return int(self.step.item())

    @property
    def nbytes(self) -> int:
        moments = self.exp_avg + self.exp_avg_sq
        return sum(t.numel() * t.element_size() for t in moments) + self.step.element_size()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``step``, ``exp_avg.<name>``, ``exp_avg_sq.<name>``: CPU copies, exact values."""
        tensors = {STEP_KEY: self.step.detach().to("cpu", copy=True)}
        for name, m, v in zip(self.names, self.exp_avg, self.exp_avg_sq, strict=True):
            tensors[f"exp_avg.{name}"] = m.detach().to("cpu", copy=True)
            tensors[f"exp_avg_sq.{name}"] = v.detach().to("cpu", copy=True)
        return tensors

    @staticmethod
    def from_state_dict(
        tensors: Mapping[str, torch.Tensor],
        names: Sequence[str],
        params: Sequence[torch.Tensor],
    ) -> AdamWState:
        """Rebuild the state written by `state_dict` for ``params`` (same names and shapes).

        Raises:
            UserError: a key is missing or a shape/dtype does not match (the checkpoint belongs
                to a different adapter layout); field ``optimizer_state.<key>``.
        """
        state = AdamWState.zeros(names, params)
        expected = {STEP_KEY: state.step}
        for name, m, v in zip(state.names, state.exp_avg, state.exp_avg_sq, strict=True):
            expected[f"exp_avg.{name}"] = m
            expected[f"exp_avg_sq.{name}"] = v
        unexpected = sorted(set(tensors) - set(expected))
        if unexpected:
            raise user_error(f"optimizer_state.{unexpected[0]}", "not a tensor of this adapter")
        for key, target in expected.items():
            source = tensors.get(key)
            if source is None:
                raise user_error(f"optimizer_state.{key}", "missing")
            if source.shape != target.shape or source.dtype != target.dtype:
                raise user_error(
                    f"optimizer_state.{key}",
                    f"{source.dtype} {list(source.shape)}, expected "
                    f"{target.dtype} {list(target.shape)}",
                )
            target.copy_(source)
        return state
