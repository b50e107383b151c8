"""API keys and the tenants they name: keys are stored as SHA-256 hashes, never in clear.

A key created with ``loraplex keys create NAME`` belongs to tenant NAME (several keys may share
one tenant). In open mode any ``tml-`` key is accepted and becomes its own tenant, named after a
prefix of its hash so the key itself never reaches the database or the logs.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from loraplex.errors import AuthError, user_error
from loraplex.store.db import Database

KEY_PREFIX = "tml-"
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash   TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """Creates keys and resolves a presented key to its tenant."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def create(self, tenant: str) -> str:
        """Mint a new ``tml-`` key for ``tenant`` and store only its hash.

        Raises:
            UserError: the tenant name is not a short identifier.
        """
        if not _TENANT_NAME.match(tenant):
            raise user_error("NAME", f"tenant names are 1-64 of [A-Za-z0-9_.@-], got {tenant!r}")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        self._db.execute(
            "INSERT INTO api_keys (key_hash, tenant, created_at) VALUES (?, ?, ?)",
            (hash_key(key), tenant, time.time()),
        )
        return key

    def tenant_for(self, key: str | None, *, open_access: bool) -> str:
        """The tenant a request's ``X-API-Key`` belongs to.

        Raises:
            AuthError: missing key, wrong prefix, or (without open access) an unknown key.
        """
        if not key:
            raise AuthError("X-API-Key: missing API key", field="X-API-Key")
        if not key.startswith(KEY_PREFIX):
            raise AuthError("X-API-Key: API keys start with 'tml-'", field="X-API-Key")
        digest = hash_key(key)
        row = self._db.query_one("SELECT tenant FROM api_keys WHERE key_hash = ?", (digest,))
        if row is not None:
            return str(row["tenant"])
        if open_access:
            return "key-" + digest[:16]
        raise AuthError("X-API-Key: unknown API key", field="X-API-Key")
