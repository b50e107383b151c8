"""Authentication: the ``X-API-Key`` header → tenant (tinker-api.md §1.2).

Known keys map to their tenant; with ``--open`` any ``tml-`` key is its own tenant. Resolved
keys are cached in memory (keys are never revoked while the server runs), so the hot path does
not touch SQLite.
"""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import Depends, Request

from loraplex.api.context import ctx_of


class KeyCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, str] = {}

    def tenant(self, request: Request) -> str:
        key = request.headers.get("x-api-key")
        if key is not None:
            with self._lock:
                cached = self._tenants.get(key)
            if cached is not None:
                return cached
        ctx = ctx_of(request)
        tenant = ctx.stores.keys.tenant_for(key, open_access=ctx.config.open_access)
        with self._lock:
            self._tenants[key or ""] = tenant
        return tenant


async def authenticate(request: Request) -> str:
    """FastAPI dependency: the calling tenant (AuthError → 401). Async on purpose: FastAPI
    runs sync dependencies in a thread pool, a thread hop per request for a dict lookup."""
    cache: KeyCache = request.app.state.key_cache
    return cache.tenant(request)


Tenant = Annotated[str, Depends(authenticate)]
