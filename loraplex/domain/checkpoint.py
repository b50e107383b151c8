"""A checkpoint directory reserved for one save, before it is committed and listed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loraplex.domain.ids import TinkerPath


@dataclass(frozen=True)
class ReservedCheckpoint:
    """Where one save writes; nothing is listed until the store commits it.

    Attributes:
        path: the ``tinker://`` path it will be listed under.
        directory: absolute directory the executor creates atomically (must not exist yet).
        ttl_seconds: lifetime once committed (None: kept until deleted).
    """

    path: TinkerPath
    tenant: str
    directory: str
    ttl_seconds: int | None
    user_metadata: Mapping[str, str] = field(default_factory=dict)
