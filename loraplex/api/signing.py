"""Signed, expiring download URLs (no auth header: the SDK and cookbook fetch them with a plain
``urllib`` GET, tinker-api.md §9.3). The signature is an HMAC-SHA256 over the resource path and
the expiry, keyed by the server secret in the data dir.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import quote

from loraplex.errors import NotFoundError


class UrlSigner:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, resource: str, ttl_s: float) -> tuple[str, int]:
        """``?expires=…&sig=…`` for ``resource`` (a path below the API root) and the expiry."""
        expires = int(time.time() + ttl_s)
        return f"expires={expires}&sig={self._mac(resource, expires)}", expires

    def verify(self, resource: str, expires: int, sig: str) -> None:
        """Raises NotFoundError (the URL reveals nothing) if the signature is wrong or stale."""
        if expires < time.time() or not hmac.compare_digest(sig, self._mac(resource, expires)):
            raise NotFoundError("download URL expired or invalid")

    def _mac(self, resource: str, expires: int) -> str:
        message = f"{resource}|{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


def quote_path(path: str) -> str:
    return quote(path, safe="/:")
