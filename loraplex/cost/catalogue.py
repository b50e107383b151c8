"""Looking a name up in one of the cost model's catalogues (model cards, hardware cards, price
sheets), with the one error every catalogue gives for a name it does not hold.

Knows mappings and names only; each catalogue lives next to the type it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from loraplex.errors import user_error

T = TypeVar("T")


def look_up(catalogue: Mapping[str, T], name: str, field: str, what: str) -> T:
    """``catalogue[name]``.

    Args:
        field: the user-facing field the name came from (the error's location).
        what: what the catalogue holds, for the message ("hardware", "sheet", ...).

    Raises:
        UserError: ``name`` is not catalogued; the message lists the known names.
    """
    entry = catalogue.get(name)
    if entry is None:
        raise user_error(field, f"unknown {what} {name!r}; known: {sorted(catalogue)}")
    return entry
