"""`StagePipe`: what one pipeline stage exchanges with the other stages of its model-parallel
group, over a torch.distributed process group (gloo on CPU, NCCL on CUDA).

Every rank of a group receives the same engine calls in the same order and runs the same
bookkeeping (validation, packing, page allocation, stop rules); only the model's layers are
split (`model.stage`). Per forward: the first stage looks the tokens up in the embedding (a
tied model's is held once, by the last stage, which sends the rows to the first); each stage
runs its layers and sends the residual stream on; the last stage ends the forward (norm, head,
losses, sampling). Per backward, gradients of the residual stream go back stage by stage. What
only the last stage knows and every stage needs (which adapters trained, which sampled tokens)
is broadcast from it; per-stage verdicts (non-finite gradients, gradient norms) are gathered by
all. Point-to-point transfers carry one ``[rows, hidden]`` tensor; objects are small.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import PackedBatch
from loraplex.engine.model.stage import Stage
from loraplex.engine.model.transformer import Transformer


class StagePipe:
    """One stage's links (rank ``stage.index`` of ``group``).

    Args:
        stage: this rank's stage.
        group: the group's process group (None: the default one).
        device: where received tensors are put (the model's device).
    """

    def __init__(self, stage: Stage, group: Any = None, device: torch.device | None = None
                 ) -> None:
        self.stage = stage
        self.group = group
        self.device = device or torch.device("cpu")
        self._ranks = [dist.get_global_rank(group, i) if group is not None else i
                       for i in range(stage.count)]

    @property
    def is_last(self) -> bool:
        return self.stage.is_last

    def run_layers(self, model: Transformer, batch: PackedBatch, lora: LoraBatch | None,
                   kv: PagedKVCache | None = None, train: bool = False
                   ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """This stage's share of a forward: its input (received; a leaf that requires grad
        in training, None where the stage embeds the tokens itself) and its output, which is
        sent on unless this is the last stage."""
        x_in = self._receive_input(model, batch)
        if x_in is not None and train and not self.stage.is_first:
            x_in.requires_grad_()
        hidden = model.forward(batch, lora, kv, x_R_D=x_in)
        if not self.is_last:
            self._send(hidden.detach(), self.stage.index + 1)
        return x_in, hidden

    def _receive_input(self, model: Transformer, batch: PackedBatch) -> torch.Tensor | None:
        count, index = self.stage.count, self.stage.index
        if count == 1 or (index == 0 and model.spec.holds_embed):
            return None  # the first stage embeds the tokens itself
        shape = (batch.num_rows, model.spec.hidden_size)
        if self.is_last and model.spec.holds_embed:  # a tied model: the head's stage holds it
            self._send(model.embed_rows(batch), 0)
        return self._recv(shape, model.dtype, count - 1 if index == 0 else index - 1)

    def receive_grad(self, like: torch.Tensor) -> torch.Tensor:
        """The gradient of this stage's output, from the next stage."""
        return self._recv(tuple(like.shape), like.dtype, self.stage.index + 1)

    def send_grad(self, x_in: torch.Tensor | None) -> None:
        """This stage's input gradient to the previous stage (the first stage has none to
        send: its input is the frozen embedding's rows)."""
        if self.stage.is_first:
            return
        assert x_in is not None
        grad = x_in.grad if x_in.grad is not None else torch.zeros_like(x_in)
        self._send(grad, self.stage.index - 1)

    def from_last(self, value: Any = None) -> Any:
        """The last stage's ``value``, on every stage (the others pass None)."""
        box = [value if self.is_last else None]
        dist.broadcast_object_list(box, src=self._ranks[-1], group=self.group,
                                   device=self._object_device())
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every stage's ``value``, in stage order, on every stage."""
        out: list[Any] = [None] * self.stage.count
        dist.all_gather_object(out, value, group=self.group)
        return out

    def _send(self, x: torch.Tensor, to: int) -> None:
        dist.send(x.contiguous(), dst=self._ranks[to], group=self.group)

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, source: int) -> torch.Tensor:
        x = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(x, src=self._ranks[source], group=self.group)
        return x

    def _object_device(self) -> torch.device | None:
        return self.device if self.device.type == "cuda" else None
