"""What the rest of the system may know about a loaded base model (no tensors)."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.domain.model_card import ModelCard
from loraplex.domain.pixel_spec import PixelSpec


@dataclass(frozen=True)
class ModelInfo:
    """Facts about one loaded base model, for validation, metering and FLOP accounting.

    Attributes:
        arch: the engine's model family (``qwen3`` or ``llama``).
        card: its architecture numbers, the same record the cost model prices (built by the
            engine from the model's config.json; the one description of its shape).
        max_context: longest prompt + completion (and longest training datum) accepted.
        eos_token_ids: tokens that end a completion under the default stop condition.
        num_params: exact parameter count of the loaded weights (norms included, a tied
            head counted once).
        compute: what decides the bits of its logprobs on this worker (device, dtype,
            batch-invariance, which kernels run: the C kernels' vector width or torch's
            fallback, torch's version). Workers whose labels differ give different bits for
            the same tokens ("": not reported).
        pixels: how its images become patches and tokens (None: it takes no images).
        image_token_id: the placeholder token an image's tokens are (``<|image_pad|>``).
    """

    arch: str
    card: ModelCard
    max_context: int
    eos_token_ids: tuple[int, ...]
    num_params: int
    compute: str = ""
    pixels: PixelSpec | None = None
    image_token_id: int | None = None

    @property
    def vocab_size(self) -> int:
        """Valid token ids are ``0 ≤ id < vocab_size``."""
        return self.card.vocab_size
