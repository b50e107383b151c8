"""Authentication: the ``X-API-Key`` header (or ``Authorization: Bearer``, what Prometheus
scrapers send) → the calling `Principal` (tinker-api.md §1.2).

Known keys map to their tenant (and operator flag); with ``--open`` any other ``tml-`` key is
its own tenant. Resolved keys are cached in memory for ``key_cache_ttl_s`` (so a key revoked
with ``loraplex keys revoke`` stops working within that time) in a bounded LRU, so the hot path
rarely touches SQLite and a flood of distinct keys cannot grow the cache without bound. A JWT
issued before its tenant's keys were revoked is refused within the same time
(`RevocationEpochs`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from typing import Annotated

from fastapi import Depends, Request

from loraplex.api.context import ctx_of
from loraplex.api.jwt_tokens import JWT_PREFIX, JwtIssuer
from loraplex.errors import AuthError
from loraplex.store.keys import Principal

MAX_CACHED_KEYS = 10_000


class KeyCache:
    """Key → (principal, resolved at), least recently used first.

    Args:
        ttl_s: how long a resolved key is trusted without asking the database again.
        max_keys: most keys kept.
    """

    def __init__(self, ttl_s: float, max_keys: int = MAX_CACHED_KEYS) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[Principal, float]] = OrderedDict()

    def principal(self, request: Request) -> Principal:
        key = presented_key(request)
        now = time.monotonic()
        if key is not None:
            with self._lock:
                cached = self._entries.get(key)
                if cached is not None and now - cached[1] < self.ttl_s:
                    self._entries.move_to_end(key)
                    return cached[0]
        ctx = ctx_of(request)
        principal = ctx.stores.keys.principal_for(key, open_access=ctx.config.open_access)
        if key is not None:
            with self._lock:
                self._entries[key] = (principal, now)
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_keys:
                    self._entries.popitem(last=False)
        return principal


class RevocationEpochs:
    """Tenant → when its keys were last revoked, reloaded from the database at most once per
    ``ttl_s`` (not per request), so revoking a key stops its JWTs within that time too.

    Args:
        ttl_s: ``server.key_cache_ttl_s``, the same bound as for the keys themselves.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._loaded_at = -math.inf
        self._epochs: dict[str, float] = {}

    def revoked_at(self, request: Request, tenant: str) -> float:
        now = time.monotonic()
        with self._lock:
            if now - self._loaded_at >= self.ttl_s:
                self._epochs = ctx_of(request).stores.keys.revocation_epochs()
                self._loaded_at = now
            return self._epochs.get(tenant, -math.inf)


def presented_key(request: Request) -> str | None:
    """The API key of a request: ``X-API-Key``, else a bearer token."""
    key = request.headers.get("x-api-key")
    if key is None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            key = token.strip()
    return key


async def authenticate(request: Request) -> Principal:
    """FastAPI dependency: the caller (AuthError → 401). Async on purpose: FastAPI runs sync
    dependencies in a thread pool, a thread hop per request for a dict lookup. In JWT mode a
    presented JWT is checked by its signature (`JwtIssuer`), without the key store."""
    issuer: JwtIssuer | None = request.app.state.jwt_issuer
    if issuer is not None:
        key = presented_key(request)
        if key is not None and key.startswith(JWT_PREFIX):
            epochs: RevocationEpochs = request.app.state.revocations
            return issuer.verify(key, lambda tenant: epochs.revoked_at(request, tenant))
    cache: KeyCache = request.app.state.key_cache
    return cache.principal(request)


async def key_holder(request: Request) -> Principal:
    """FastAPI dependency: the caller, by an API key only (never a JWT)."""
    cache: KeyCache = request.app.state.key_cache
    return cache.principal(request)


async def tenant_of(request: Request) -> str:
    """FastAPI dependency: the calling tenant."""
    return (await authenticate(request)).tenant


async def caller_if_any(request: Request) -> Principal | None:
    """FastAPI dependency for views open to anyone: the caller, or None without a valid key."""
    try:
        return await authenticate(request)
    except AuthError:
        return None


Tenant = Annotated[str, Depends(tenant_of)]
Caller = Annotated[Principal, Depends(authenticate)]
KeyHolder = Annotated[Principal, Depends(key_holder)]
