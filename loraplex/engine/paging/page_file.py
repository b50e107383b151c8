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

from loraplex.engine.optim.adamw_state import STEP_KEY, AdamWState
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
            tensors[STEP_KEY] = opt.step
            for name, m, v in zip(opt.names, opt.exp_avg, opt.exp_avg_sq, strict=True):
                tensors[f"exp_avg.{name}"] = m
                tensors[f"exp_avg_sq.{name}"] = v
        tmp = f"{path}.tmp"
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
        return PageFile(path, state.names, state.nbytes, os.path.getsize(path))

    def read(self, device: torch.device | str) -> AdapterState:
        """The state, loaded onto ``device`` (the file stays until `delete`)."""
        tensors = load_file(self.path, device=str(device))
        optimizer = None
        if STEP_KEY in tensors:
            optimizer = AdamWState(self.names, tensors[STEP_KEY],
                                   [tensors[f"exp_avg.{n}"] for n in self.names],
                                   [tensors[f"exp_avg_sq.{n}"] for n in self.names])
        return AdapterState(self.names, [tensors[f"param.{n}"] for n in self.names],
                            [tensors.get(f"grad.{n}") for n in self.names], optimizer)

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
