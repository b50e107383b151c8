"""API keys and the tenants they name: keys are stored as SHA-256 hashes, never in clear.

A key created with ``loraplex keys create NAME`` belongs to tenant NAME (several keys may share
one tenant); ``--operator`` keys also see the machine-wide views (every tenant's stats, the
labelled Prometheus metrics). ``loraplex keys revoke NAME`` revokes every key of NAME (also
refused in open mode afterwards). In open
mode any other ``tml-`` key is accepted and becomes its own tenant, named ``key-`` + a prefix of
its hash (so the key itself never reaches the database or the logs); that prefix is reserved:
no created key's tenant name may start with it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from loraplex.errors import AuthError, user_error
from loraplex.store.db import Database

KEY_PREFIX = "tml-"
OPEN_TENANT_PREFIX = "key-"
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash   TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS revoked_keys (
    key_hash   TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    revoked_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Principal:
    """Who a request comes from.

    Attributes:
        tenant: owner of everything the request makes or reads.
        is_operator: may read the machine-wide views (all tenants' figures).
    """

    tenant: str
    is_operator: bool = False


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """Creates and revokes keys and resolves a presented key to its principal."""

    def __init__(self, db: Database) -> None:
        self._db = db
        columns = {row["name"] for row in db.query("PRAGMA table_info(api_keys)")}
        if "operator" not in columns:  # data dirs of earlier versions
            db.execute("ALTER TABLE api_keys ADD COLUMN operator INTEGER NOT NULL DEFAULT 0")

    def create(self, tenant: str, *, operator: bool = False) -> str:
        """Mint a new ``tml-`` key for ``tenant`` and store only its hash.

        Raises:
            UserError: the tenant name is not a short identifier, or takes the open-mode
                tenants' ``key-`` prefix.
        """
        if not isinstance(tenant, str) or not _TENANT_NAME.match(tenant):
            raise user_error("NAME", f"tenant names are 1-64 of [A-Za-z0-9_.@-] starting with "
                             f"a letter or digit, got {tenant!r}")
        if tenant.startswith(OPEN_TENANT_PREFIX):
            raise user_error("NAME", f"names starting with {OPEN_TENANT_PREFIX!r} are reserved "
                             "for open-access tenants")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        self._db.execute(
            "INSERT INTO api_keys (key_hash, tenant, created_at, operator) VALUES (?, ?, ?, ?)",
            (hash_key(key), tenant, time.time(), int(operator)),
        )
        return key

    def revoke(self, tenant: str) -> int:
        """Revoke every key of ``tenant`` (refused from now on, even in open mode, where an
        unknown key would otherwise become a tenant of its own); returns how many there were."""
        with self._db.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO revoked_keys (key_hash, tenant, revoked_at)"
                         " SELECT key_hash, tenant, ? FROM api_keys WHERE tenant = ?",
                         (time.time(), tenant))
            return int(conn.execute("DELETE FROM api_keys WHERE tenant = ?",
                                    (tenant,)).rowcount)

    def revocation_epochs(self) -> dict[str, float]:
        """Tenant → when its keys were last revoked (JWTs issued before then are refused)."""
        rows = self._db.query("SELECT tenant, MAX(revoked_at) AS at FROM revoked_keys "
                              "GROUP BY tenant")
        return {str(r["tenant"]): float(r["at"]) for r in rows}

    def principal_for(self, key: str | None, *, open_access: bool) -> Principal:
        """The principal a request's key names.

        Raises:
            AuthError: missing key, wrong prefix, or (without open access) an unknown key.
        """
        if not key:
            raise AuthError("X-API-Key: missing API key", field="X-API-Key")
        if not key.startswith(KEY_PREFIX):
            raise AuthError("X-API-Key: API keys start with 'tml-'", field="X-API-Key")
        digest = hash_key(key)
        row = self._db.query_one("SELECT tenant, operator FROM api_keys WHERE key_hash = ?",
                                 (digest,))
        if row is not None:
            return Principal(str(row["tenant"]), bool(row["operator"]))
        if self._db.query_one("SELECT 1 FROM revoked_keys WHERE key_hash = ?", (digest,)):
            raise AuthError("X-API-Key: this API key was revoked", field="X-API-Key")
        if open_access:
            return Principal(OPEN_TENANT_PREFIX + digest[:16])
        raise AuthError("X-API-Key: unknown API key", field="X-API-Key")

    def tenant_for(self, key: str | None, *, open_access: bool) -> str:
        """The tenant of `principal_for`."""
        return self.principal_for(key, open_access=open_access).tenant
