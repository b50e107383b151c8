"""`AdapterState`: one adapter's complete mutable state held apart from the adapter: its leaf
values, the gradients accumulated into them since the last optim_step, and its optimizer state.

What the pager moves between tiers. Moving is exact (plain copies, no dtype change) and lazy:
tensors already on the target device are handed over, not copied, so on a CPU engine the
device → host move is a change of owner. Knows nothing of budgets, files or LRU order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.optim.optimizer_state import OptimizerState


@dataclass
class AdapterState:
    """Attributes:
        names: `LoraAdapter.named_parameters` names, the order of every list here.
        params: leaf values, detached (the adapter keeps the ``requires_grad`` flags on its
            placeholders while paged out).
        grads: accumulated gradients (None: nothing accumulated for that leaf).
        optimizer: the adapter's optimizer state (None: no step taken yet, or a frozen adapter).
    """

    names: tuple[str, ...]
    params: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    optimizer: OptimizerState | None

    @staticmethod
    def of(adapter: LoraAdapter, optimizer: OptimizerState | None) -> AdapterState:
        """The state of a resident adapter (references, no copy)."""
        named = adapter.named_parameters()
        names = tuple(n for n, _ in named)
        assert optimizer is None or optimizer.names == names
        return AdapterState(names, [p.detach() for _, p in named], [p.grad for _, p in named],
                            optimizer)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held: leaves + gradients + moments + step."""
        total = sum(_nbytes(t) for t in (*self.params, *self.grads) if t is not None)
        return total + (self.optimizer.nbytes if self.optimizer is not None else 0)

    def to(self, device: torch.device | str) -> tuple[AdapterState, int]:
        """The same state on ``device``, and the bytes actually copied (0 when it is there)."""
        copied = 0

        def move(t: torch.Tensor) -> torch.Tensor:
            nonlocal copied
            moved = t.to(device)
            if moved is not t:
                copied += _nbytes(t)
            return moved

        optimizer = self.optimizer.map(move) if self.optimizer is not None else None
        state = AdapterState(self.names, [move(p) for p in self.params],
                             [None if g is None else move(g) for g in self.grads], optimizer)
        return state, copied


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
