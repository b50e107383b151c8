"""Work items: what the scheduler hands the engine, one typed object per kind of engine call.

Ids are strings the upper layers choose. ``adapter_id`` names an adapter version inside the
engine: a training run's live adapter uses its model id; a sampler version uses its own id
(e.g. a ``tinker://…/sampler_weights/…`` path or a snapshot's sampling session id).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass

from loraplex.domain.custom_loss import CustomLoss, CustomLossFn
from loraplex.domain.data import Datum
from loraplex.domain.image import ImageInput
from loraplex.domain.lora import LoraConfig
from loraplex.domain.losses import LossFnName
from loraplex.domain.optim import OptimParams
from loraplex.domain.sampling import SamplingParams

#: loss_fn_inputs key under which resolved sampling-time logprobs reach the engine
#: (stable_reinforce): float32 aligned with the datum, NaN where no span covers a position.
RECORDED_LOGPROBS_KEY = "recorded_logprobs"


@dataclass(frozen=True)
class ForwardBackwardWork:
    """One forward or forward_backward op of one model.

    Attributes:
        request_id: the future this work completes.
        adapter_id: the training adapter whose LoRA applies (and receives the gradients).
        data: datums, in request order.
        loss_fn: Tinker loss name (``custom``: ``custom_loss`` runs).
        loss_fn_config: merged ``loss_fn_config`` / ``loss_fn_config_v2`` values.
        forward_only: no gradients, no side effects.
        custom_loss: the uploaded loss of a ``custom`` work (None otherwise).
    """

    request_id: str
    adapter_id: str
    data: tuple[Datum, ...]
    loss_fn: LossFnName | CustomLossFn
    loss_fn_config: Mapping[str, float | str]
    forward_only: bool
    custom_loss: CustomLoss | None = None

    @property
    def num_tokens(self) -> int:
        return sum(d.length for d in self.data)


@dataclass(frozen=True)
class OptimStepWork:
    """Apply the adapter's accumulated gradients with the run's optimizer (AdamW or Dimuon,
    the family of ``params``), then clear them."""

    request_id: str
    adapter_id: str
    params: OptimParams


@dataclass(frozen=True)
class SaveWork:
    """Write an adapter to ``directory`` (created atomically; must not exist yet).

    Attributes:
        with_optimizer: also write AdamW moments and step (``save_state``).
        peft_export: also write ``adapter_config.json`` + ``adapter_model.safetensors``.
    """

    adapter_id: str
    directory: str
    with_optimizer: bool
    peft_export: bool = False


@dataclass(frozen=True)
class LoadWork:
    """Load ``directory`` into ``adapter_id`` (creating it when absent).

    Attributes:
        with_optimizer: restore AdamW moments and step too; otherwise they restart at zero.
        expect_config: when set, the checkpoint's LoRA config must match it.
        frozen: load as a sampler version (no gradients, no optimizer), not a training adapter.
    """

    adapter_id: str
    directory: str
    with_optimizer: bool
    expect_config: LoraConfig | None = None
    frozen: bool = False


@dataclass(frozen=True)
class SampleWork:
    """One asample request.

    Attributes:
        request_id: the future this work completes.
        adapter_id: adapter version to sample from; None samples the bare base model.
        adapter_dir: where to load ``adapter_id`` from if it is not resident.
        prompt: token ids (typecode ``q``).
        num_samples: independent completions, sharing the prompt's KV.
        params: sampling parameters.
        prompt_logprobs: return the logprob of every prompt token (NaN at index 0).
        topk_prompt_logprobs, topk_sample_logprobs: k alternatives per position (0: off).
        prompt_logprobs_last_n: only the last n prompt positions are scored.
        prompt_alt_tokens_k: draws per prompt position after the first (0: off), from the
            distribution the sampler draws from (every position; ``last_n`` does not apply).
        stream: report completion tokens while the request runs (`SequenceDelta`s after every
            `sample_step`), not only when it finishes.
        images: the prompt's images (their placeholder runs in ``prompt``), in order.
        tenant: who asked (set by the scheduler; the sampler shares its steps between
            tenants, ``engine.sample_shared_decode_kv_tokens``).
    """

    request_id: str
    adapter_id: str | None
    adapter_dir: str | None
    prompt: array[int]
    num_samples: int
    params: SamplingParams
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    prompt_alt_tokens_k: int = 0
    stream: bool = False
    images: tuple[ImageInput, ...] = ()
    tenant: str = ""
