"""`OptimizerState`: one adapter's optimizer state (family, step count, moments per trainable
tensor) and its exact round trip through named tensors for checkpoints and pages.

Two families: AdamW keeps first and second moments (``exp_avg``, ``exp_avg_sq``), Dimuon keeps
one momentum per tensor (in ``exp_avg``; ``exp_avg_sq`` is empty). The named tensors say which
family they are: ``step`` plus ``exp_avg.<name>`` and ``exp_avg_sq.<name>`` (AdamW, the layout
of every earlier checkpoint) or ``momentum.<name>`` (Dimuon).

Knows nothing of files or of the update rules (`adamw`, `dimuon`); the checkpoint code stores
`state_dict()` in safetensors and hands the tensors back to `from_state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from loraplex.domain.optim import OptimizerFamily
from loraplex.errors import user_error

STEP_KEY = "step"
MOMENTUM_PREFIX = "momentum."


@dataclass(frozen=True)
class OptimizerState:
    """Optimizer state of one adapter, updated in place by `adamw_step` or `dimuon_step`.

    Attributes:
        names: stable names of the adapter's trainable tensors, in update order.
        step: float32 0-d tensor on the parameters' device, the number of steps taken
            (torch.optim keeps its step as a float32 tensor too; the fused kernel reads it).
        exp_avg: first moments (Dimuon: its momentum), one per tensor, shaped like it.
        exp_avg_sq: AdamW's second moments, one per tensor; empty for Dimuon.
        family: ``"adamw"`` or ``"dimuon"``.
    """

    names: tuple[str, ...]
    step: torch.Tensor
    exp_avg: list[torch.Tensor]
    exp_avg_sq: list[torch.Tensor]
    family: OptimizerFamily = "adamw"

    @staticmethod
    def zeros(names: Sequence[str], params: Sequence[torch.Tensor],
              family: OptimizerFamily = "adamw") -> OptimizerState:
        """Fresh state (step 0, zero moments) for ``params``, which ``names`` name."""
        if len(names) != len(params) or len(set(names)) != len(names):
            raise ValueError("names must be unique, one per parameter tensor")
        device = params[0].device if params else torch.device("cpu")

        def zero() -> list[torch.Tensor]:
            return [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]

        return OptimizerState(
            names=tuple(names),
            step=torch.zeros((), dtype=torch.float32, device=device),
            exp_avg=zero(),
            exp_avg_sq=zero() if family == "adamw" else [],
            family=family,
        )

    @property
    def num_steps(self) -> int:
        return int(self.step.item())

    @property
    def nbytes(self) -> int:
        moments = self.exp_avg + self.exp_avg_sq
        return sum(t.numel() * t.element_size() for t in moments) + self.step.element_size()

    def map(self, move: Callable[[torch.Tensor], torch.Tensor]) -> OptimizerState:
        """The same state with every tensor passed through ``move`` (a device copy)."""
        return OptimizerState(self.names, move(self.step), [move(m) for m in self.exp_avg],
                              [move(v) for v in self.exp_avg_sq], self.family)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The named tensors (references, no copy): see the module docstring for the keys."""
        out = {STEP_KEY: self.step}
        if self.family == "dimuon":
            out.update({f"{MOMENTUM_PREFIX}{n}": m for n, m in zip(self.names, self.exp_avg,
                                                                    strict=True)})
            return out
        for name, m, v in zip(self.names, self.exp_avg, self.exp_avg_sq, strict=True):
            out[f"exp_avg.{name}"] = m
            out[f"exp_avg_sq.{name}"] = v
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """`tensors` as CPU copies, exact values."""
        return {k: t.detach().to("cpu", copy=True) for k, t in self.tensors().items()}

    @staticmethod
    def family_of(tensors: Mapping[str, torch.Tensor]) -> OptimizerFamily:
        """Which family wrote these named tensors (Dimuon's carry ``momentum.`` keys)."""
        return "dimuon" if any(k.startswith(MOMENTUM_PREFIX) for k in tensors) else "adamw"

    @staticmethod
    def from_state_dict(
        tensors: Mapping[str, torch.Tensor],
        names: Sequence[str],
        params: Sequence[torch.Tensor],
    ) -> OptimizerState:
        """Rebuild the state written by `state_dict` for ``params`` (same names and shapes);
        the family is the one the keys name.

        Raises:
            UserError: a key is missing or a shape/dtype does not match (the checkpoint belongs
                to a different adapter layout); field ``optimizer_state.<key>``.
        """
        state = OptimizerState.zeros(names, params, OptimizerState.family_of(tensors))
        expected = state.tensors()
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
