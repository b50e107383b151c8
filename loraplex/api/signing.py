"""Signed, expiring download URLs (no auth header: the SDK and cookbook fetch them with a plain
``urllib`` GET, tinker-api.md §9.3). The signature is an HMAC-SHA256 over the resource path, the
tenant the URL was made for and the expiry, keyed by the server secret in the data dir; the
download route checks that tenant may still read the checkpoint, so unpublishing (or deleting)
revokes URLs handed out before.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import quote, urlencode

from loraplex.errors import NotFoundError


class UrlSigner:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, resource: str, tenant: str, ttl_s: float) -> tuple[str, int]:
        """``?t=…&expires=…&sig=…`` for ``resource`` (a path below the API root) as made for
        ``tenant``, and the expiry."""
        expires = int(time.time() + ttl_s)
        query = urlencode({"t": tenant, "expires": expires,
                           "sig": self._mac(resource, tenant, expires)})
        return query, expires

    def verify(self, resource: str, tenant: str, expires: int, sig: str) -> None:
        """Raises NotFoundError (the URL reveals nothing) if the signature is wrong or stale."""
        expected = self._mac(resource, tenant, expires).encode()
        if expires < time.time() or not hmac.compare_digest(sig.encode(), expected):
            raise NotFoundError("download URL expired or invalid")

    def _mac(self, resource: str, tenant: str, expires: int) -> str:
        message = f"{resource}|{tenant}|{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


def quote_path(path: str) -> str:
    return quote(path, safe="/:")
