"""The one value check several config slices share; each slice's other checks live in its own
``__post_init__``."""

from __future__ import annotations

from loraplex.errors import user_error


def check_at_least_one(config: object, *names: str) -> None:
    """Raise `UserError` naming the first of ``names`` whose value on ``config`` is below 1."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise user_error(name, f"must be at least 1, got {value}")
