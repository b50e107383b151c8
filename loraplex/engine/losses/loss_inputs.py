"""`LossInputs`: one request's loss inputs, concatenated over its datums as torch tensors.

Built by `validation.validate` from domain `Datum`s; consumed by every loss function. Knows
nothing of models or logits: the trainer supplies the model's target logprobs separately.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossInputs:
    """All datums of one request, concatenated along the token axis (T = Σ datum lengths).

    Attributes:
        target_tokens: int64 ``[T]``, or ``[T, K]`` for top-K cross-entropy.
        tensors: float32 inputs by name (``weights``, ``logprobs``, ``advantages``, ...), each
            ``[T]`` (``weights`` is ``[T, K]`` when the targets are).
        config: the loss's ``loss_fn_config``, every known key resolved to a float.
        offsets: datum boundaries ``[0, end_0, end_1, …]`` (length num_datums + 1).
        datum_index_T: int64 ``[T]``, the datum each position belongs to (for per-sequence
            reductions such as GSPO's ratio).
    """

    target_tokens: torch.Tensor
    tensors: Mapping[str, torch.Tensor]
    config: Mapping[str, float]
    offsets: tuple[int, ...]
    datum_index_T: torch.Tensor

    @property
    def num_datums(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    @property
    def lengths(self) -> list[int]:
        return [end - start for start, end in zip(self.offsets, self.offsets[1:], strict=False)]

    def to(self, device: torch.device | str) -> LossInputs:
        """The same inputs on ``device`` (a no-op copy-free view when already there)."""
        return LossInputs(
            target_tokens=self.target_tokens.to(device),
            tensors={k: v.to(device) for k, v in self.tensors.items()},
            config=self.config,
            offsets=self.offsets,
            datum_index_T=self.datum_index_T.to(device),
        )

    def split(self, values_T: torch.Tensor) -> list[torch.Tensor]:
        """Cut a ``[T, ...]`` tensor back into one tensor per datum, in request order."""
        return list(torch.split(values_T, self.lengths))
