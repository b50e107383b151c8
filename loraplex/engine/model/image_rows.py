"""Images inside packed rows: where a sequence's image tokens sit, the multimodal rotary
positions (M-RoPE) of its tokens, and the rows of a batch whose embeddings images replace.

Qwen3-VL / Qwen3.5 position text and images on three axes (time, row, column). Text token i
before any image sits at (i, i, i); an image starting at position p with an ``h × w`` token
grid (after merging) puts token (r, c) at (p, p + r, p + c) and moves the next text position
to ``p + max(h, w)`` (transformers' ``get_rope_index``), so text after an image is shifted
against its token index; decoding continues from there. A sequence without images is at
(i, i, i) throughout: the plain rotary table gives it the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.engine.model.vision import ImageFeatures


@dataclass(frozen=True)
class ImageSpan:
    """One image of a sequence: its first token index, its merged (t, h, w) token grid and the
    vision tower's output for it."""

    offset: int
    grid_llm: tuple[int, int, int]
    features: ImageFeatures

    @property
    def num_tokens(self) -> int:
        t, h, w = self.grid_llm
        return t * h * w

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


def rope_positions(spans: Sequence[ImageSpan], start: int, count: int) -> torch.Tensor:
    """``[3, count]`` M-RoPE positions of token indices ``start .. start + count - 1``."""
    out = torch.empty(3, count, dtype=torch.long)
    index, position = 0, 0  # next token index not yet placed, and its text position
    end = start + count
    for span in sorted(spans, key=lambda s: s.offset):
        _text(out, start, end, index, span.offset, position)
        position += span.offset - index
        lo, hi = max(span.offset, start), min(span.end, end)
        if lo < hi:
            _, h, w = span.grid_llm
            k = torch.arange(lo - span.offset, hi - span.offset)
            out[0, lo - start:hi - start] = position + k // (h * w)
            out[1, lo - start:hi - start] = position + (k // w) % h
            out[2, lo - start:hi - start] = position + k % w
        position += max(span.grid_llm[1], span.grid_llm[2])
        index = span.end
    _text(out, start, end, index, end, position)
    return out


def _text(out: torch.Tensor, start: int, end: int, first: int, stop: int,
          position: int) -> None:
    """Text tokens ``first .. stop - 1`` (clipped to the window) from text ``position``."""
    lo, hi = max(first, start), min(stop, end)
    if lo < hi:
        out[:, lo - start:hi - start] = torch.arange(lo, hi) - first + position


@dataclass(frozen=True)
class BatchImages:
    """The rows of a packed batch that images fill.

    Attributes:
        rows_I: row of each image token the batch runs.
        embeds_I_D: the vision tower's embedding for each (replaces the token embedding).
        deepstack: per decoder layer k < K, ``[I, D]`` features added after layer k.
    """

    rows_I: torch.Tensor
    embeds_I_D: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]


def batch_images(seq_spans: Sequence[Sequence[ImageSpan]], row_start: Sequence[int],
                 num_cached: Sequence[int], num_new: Sequence[int],
                 device: torch.device | str) -> BatchImages | None:
    """The image rows among the batch's new tokens (an image may be cut by a prefill chunk:
    its part in this chunk); None without any."""
    rows: list[torch.Tensor] = []
    embeds: list[torch.Tensor] = []
    deep: list[list[torch.Tensor]] = []
    for spans, first_row, cached, new in zip(seq_spans, row_start, num_cached, num_new,
                                             strict=True):
        for span in spans:
            lo, hi = max(span.offset, cached), min(span.end, cached + new)
            if lo >= hi:
                continue
            rows.append(torch.arange(first_row + lo - cached, first_row + hi - cached))
            part = slice(lo - span.offset, hi - span.offset)
            embeds.append(span.features.embeds_N_D[part])
            deep.append([d[part] for d in span.features.deepstack])
    if not rows:
        return None
    levels = min(len(d) for d in deep)
    return BatchImages(torch.cat(rows).to(device), torch.cat(embeds),
                       tuple(torch.cat([d[k] for d in deep]) for k in range(levels)))
