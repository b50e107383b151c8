"""Training data as the engine receives it: `Datum` = model input tokens + named loss inputs.

Mirrors Tinker's `Datum`/`TensorData` after decoding from protobuf. The API layer flattens
`encoded_text` chunks into one token array; image chunks become runs of the model's image
placeholder token with an `ImageInput` each (`images`); dmel chunks are refused.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from loraplex.domain.image import ImageChunkIn, ImageInput

DType = Literal["float32", "int64"]
TYPECODE: dict[str, str] = {"float32": "f", "int64": "q"}


@dataclass(frozen=True)
class TensorData:
    """A dense tensor: flat little-endian values plus a shape.

    Attributes:
        dtype: ``float32`` or ``int64`` (the two dtypes the SDK sends).
        shape: full shape; ``[N]`` for per-token loss inputs.
        data: flat values, typecode ``f`` for float32 and ``q`` for int64.
    """

    dtype: DType
    shape: tuple[int, ...]
    data: array[Any]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @staticmethod
    def from_list(values: list[float] | list[int], dtype: DType) -> TensorData:
        return TensorData(dtype, (len(values),), array(TYPECODE[dtype], values))


@dataclass(frozen=True)
class ProvenanceSpan:
    """Where a run of tokens came from: a prompt or a sampled sequence recorded by the sampler.

    Attributes:
        kind: ``prompt`` or ``sampled``.
        sequence_id: an id returned in ``sample_sequence_ids``.
        offset: first token of the span inside that recorded sequence.
        length: number of tokens.
    """

    kind: Literal["prompt", "sampled"]
    sequence_id: str
    offset: int
    length: int


@dataclass(frozen=True)
class Datum:
    """One training example.

    Attributes:
        tokens: model input token ids (typecode ``q``), length N.
        loss_fn_inputs: name → tensor, each aligned with `tokens` (position i scores token i+1).
        model_input_spans: provenance of `tokens` runs (stable_reinforce).
        loss_fn_input_spans: provenance of loss-input runs, in target coordinates.
        images: the images among `tokens` (their placeholder runs), in order.
        pending_images: image chunks decoded from the wire but not yet placed (the codec
            does not know the model; `api.model_input` places them): `tokens` holds the
            text tokens only while any are pending.
    """

    tokens: array[int]
    loss_fn_inputs: Mapping[str, TensorData]
    model_input_spans: tuple[ProvenanceSpan, ...] = field(default=())
    loss_fn_input_spans: tuple[ProvenanceSpan, ...] = field(default=())
    images: tuple[ImageInput, ...] = field(default=())
    pending_images: tuple[ImageChunkIn, ...] = field(default=())

    @property
    def length(self) -> int:
        return len(self.tokens)
