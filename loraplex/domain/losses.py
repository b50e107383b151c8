"""The built-in loss names a client may ask for: the one list the API, the engine registry and
the tests derive from (Tinker's ``LossFnType`` minus ``custom``: an uploaded loss graph is
named by its own id, `domain.custom_loss`, created through ``create_custom_loss``)."""

from __future__ import annotations

from typing import Literal, TypeGuard, get_args

LossFnName = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo",
                     "stable_reinforce"]
LOSS_FN_NAMES: tuple[LossFnName, ...] = get_args(LossFnName)


def is_loss_fn_name(name: object) -> TypeGuard[LossFnName]:
    return isinstance(name, str) and name in LOSS_FN_NAMES
