"""`PageFile`: one paged-out adapter's `AdapterState` as a scratch safetensors file.

Keys: ``param.<name>``, ``grad.<name>`` (only gradients being accumulated), and once the adapter
has an optimizer ``exp_avg.<name>``, ``exp_avg_sq.<name>``, ``step``. Values round-trip bit for
bit. Scratch, not a checkpoint: no manifest, no fsync (after a crash nothing reads it again);
written under a temporary name and renamed, so a read never sees half a file. Knows nothing of
budgets or of which adapter it belongs to.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

from loraplex.engine.optim.optimizer_state import MOMENTUM_PREFIX, STEP_KEY, OptimizerState
from loraplex.engine.paging.adapter_state import AdapterState


@dataclass(frozen=True)
class PageFile:
    """Attributes:
        path: the file.
        names: the state's tensor names (`AdapterState.names`).
        state_bytes: `AdapterState.nbytes` of what it holds.
        file_bytes: its size on disk (tensor bytes + the safetensors header).
    """

    path: str
    names: tuple[str, ...]
    state_bytes: int
    file_bytes: int

    @staticmethod
    def write(state: AdapterState, path: str) -> PageFile:
        """Write ``state`` (from any device) to ``path``, replacing what was there."""
        tensors: dict[str, torch.Tensor] = {}
        for name, p, g in zip(state.names, state.params, state.grads, strict=True):
            tensors[f"param.{name}"] = p
            if g is not None:
                tensors[f"grad.{name}"] = g
        if (opt := state.optimizer) is not None:
            tensors.update(opt.tensors())
        tmp = f"{path}.tmp"
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
        return PageFile(path, state.names, state.nbytes, os.path.getsize(path))

    def read(self, device: torch.device | str) -> AdapterState:
        """The state, loaded onto ``device`` (the file stays until `delete`)."""
        tensors = load_file(self.path, device=str(device))
        optimizer = None
        if STEP_KEY in tensors:
            optimizer = _optimizer(self.names, tensors)
        return AdapterState(self.names, [tensors[f"param.{n}"] for n in self.names],
                            [tensors.get(f"grad.{n}") for n in self.names], optimizer)

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def _optimizer(names: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> OptimizerState:
    """The optimizer state a page holds (the keys of `OptimizerState.tensors`), by reference."""
    if OptimizerState.family_of(tensors) == "dimuon":
        return OptimizerState(names, tensors[STEP_KEY],
                              [tensors[f"{MOMENTUM_PREFIX}{n}"] for n in names], [], "dimuon")
    return OptimizerState(names, tensors[STEP_KEY], [tensors[f"exp_avg.{n}"] for n in names],
                          [tensors[f"exp_avg_sq.{n}"] for n in names])
