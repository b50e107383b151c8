"""The loss registry: Tinker ``loss_fn`` name → `LossSpec`. Unknown names are user errors.
The names are `loraplex.domain.losses.LOSS_FN_NAMES` (the one list): importing this module
fails if a spec is missing for a name or registered under one that is not there.

``custom`` (SDK 0.38's uploaded losses) is not a registry entry: its function is the client's
graph, rebuilt per request by `custom_graph.validate_custom`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from loraplex.domain.losses import LOSS_FN_NAMES
from loraplex.engine.losses import (
    cispo,
    cross_entropy,
    dro,
    gspo,
    importance_sampling,
    ppo,
    stable_reinforce,
)
from loraplex.engine.losses.loss_spec import LossSpec
from loraplex.errors import user_error

LOSSES: Mapping[str, LossSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            cross_entropy.SPEC,
            importance_sampling.SPEC,
            ppo.SPEC,
            cispo.SPEC,
            dro.SPEC,
            gspo.SPEC,
            stable_reinforce.SPEC,
        )
    }
)


if tuple(LOSSES) != LOSS_FN_NAMES:
    raise ImportError(f"loss specs {list(LOSSES)} differ from domain.losses {LOSS_FN_NAMES}")


def get_loss(name: str) -> LossSpec:
    """The spec registered under ``name``.

    Raises:
        UserError: (field ``loss_fn``) for an unknown name, listing the known ones.
    """
    spec = LOSSES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise user_error("loss_fn", f"unknown loss {name!r}; known losses: {', '.join(LOSSES)}")
    return spec
