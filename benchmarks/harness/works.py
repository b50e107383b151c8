"""Builders of hand-made engine works, shared by the engine tests and the engine benchmarks
(`memory`, `model_parallel`): a random next-token datum, a forward_backward work, a sample work.

Builds domain objects only; runs nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from loraplex.domain.data import Datum, TensorData
from loraplex.domain.losses import LossFnName
from loraplex.domain.sampling import SamplingParams, StopCondition
from loraplex.domain.work import ForwardBackwardWork, SampleWork

NO_STOP = StopCondition(use_eos=False)


def ce_datum(gen: torch.Generator, n: int, vocab: int, *, signed_weights: bool = False,
             extra: Mapping[str, Sequence[float]] | None = None) -> Datum:
    """A random next-token datum; weights 1 (or fractional, some negative)."""
    tokens = torch.randint(0, vocab, (n + 1,), generator=gen).tolist()
    weights = (torch.randn(n, generator=gen) if signed_weights else torch.ones(n)).tolist()
    inputs = {"target_tokens": TensorData("int64", (n,), array("q", tokens[1:])),
              "weights": TensorData("float32", (n,), array("f", weights))}
    for key, values in (extra or {}).items():
        inputs[key] = TensorData("float32", (n,), array("f", values))
    return Datum(array("q", tokens[:-1]), inputs)


def train_work(request_id: str, adapter_id: str, data: Sequence[Datum],
               loss_fn: LossFnName = "cross_entropy", forward_only: bool = False, **config: float
               ) -> ForwardBackwardWork:
    return ForwardBackwardWork(request_id, adapter_id, tuple(data), loss_fn, dict(config),
                               forward_only)


def sample_work(request_id: str, prompt: Sequence[int], adapter: str | None = None,
                num_samples: int = 1, **kwargs: Any) -> SampleWork:
    """A request; SamplingParams fields and SampleWork fields both go in ``kwargs``."""
    param_names = set(SamplingParams.__dataclass_fields__)
    params = SamplingParams(**{k: v for k, v in kwargs.items() if k in param_names})
    rest = {k: v for k, v in kwargs.items() if k not in param_names}
    return SampleWork(request_id, adapter, rest.pop("adapter_dir", None), array("q", prompt),
                      num_samples, params, **rest)
