"""Short-lived JWTs for SDK 0.38's ``pjwt_auth_enabled`` mode (tinker-api.md §1.2).

With ``server.jwt_issuer_key`` set, ``POST /api/v1/auth/token`` exchanges an API key for an
HS256 JWT (claims ``iss``, ``sub`` = tenant, ``op`` = operator flag, ``iat``, ``exp``) that the
SDK then sends as ``X-API-Key`` on every request and refreshes at about half its lifetime. A
token is checked by signature and expiry alone (no database read); an expired or forged one
is a `TokenError` (401 with ``WWW-Authenticate: Bearer error="invalid_token"``), on which the
SDK exchanges its key again and replays the request once. A revoked key's tokens stay valid
until they expire (``server.jwt_lifetime_s``). Stdlib only (hmac, hashlib, base64).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

from loraplex.errors import TokenError
from loraplex.store.keys import Principal

JWT_PREFIX = "eyJ"
"""What the SDK, too, takes for a JWT: a base64url JSON header."""
ISSUER = "loraplex"
_HEADER = {"alg": "HS256", "typ": "JWT"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class JwtIssuer:
    """Mints and checks the server's JWTs.

    Args:
        key: the HMAC-SHA256 secret (``server.jwt_issuer_key``).
        lifetime_s: ``exp - iat`` of a minted token.
    """

    def __init__(self, key: str, lifetime_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = key.encode()
        self.lifetime_s = lifetime_s
        self._clock = clock

    def issue(self, principal: Principal) -> str:
        now = int(self._clock())
        claims = {"iss": ISSUER, "sub": principal.tenant, "op": principal.is_operator,
                  "iat": now, "exp": now + int(self.lifetime_s)}
        signing_input = ".".join(_b64(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (_HEADER, claims))
        return f"{signing_input}.{_b64(self._sign(signing_input))}"

    def verify(self, token: str, revoked_at: Callable[[str], float] | None = None
               ) -> Principal:
        """The principal a valid token names.

        Args:
            revoked_at: tenant → when its keys were last revoked (``-inf``: never); a token
                issued at or before then is refused.

        Raises:
            TokenError: malformed, not signed with this server's key, not HS256, from
                another issuer, expired, or issued before its tenant's keys were revoked.
        """
        parts = token.split(".")
        if len(parts) != 3:
            raise _invalid("not a JWT")
        try:  # the signature first: nothing of an unsigned token is parsed
            signature = _unb64(parts[2])
        except ValueError:
            raise _invalid("not a JWT") from None
        if not hmac.compare_digest(signature, self._sign(f"{parts[0]}.{parts[1]}")):
            raise _invalid("bad signature")
        try:
            header: Any = json.loads(_unb64(parts[0]))
            claims: Any = json.loads(_unb64(parts[1]))
        except (ValueError, RecursionError):
            raise _invalid("not a JWT") from None
        if header != _HEADER or not isinstance(claims, dict) or claims.get("iss") != ISSUER:
            raise _invalid("not issued by this server")
        exp, tenant = claims.get("exp"), claims.get("sub")
        if not isinstance(exp, int) or not isinstance(tenant, str):
            raise _invalid("missing claims")
        if exp <= self._clock():
            raise _invalid("expired")
        iat = claims.get("iat")
        if revoked_at is not None and (not isinstance(iat, int) or iat <= revoked_at(tenant)):
            raise _invalid("issued before its key was revoked")
        return Principal(tenant, bool(claims.get("op")))

    def _sign(self, signing_input: str) -> bytes:
        return hmac.new(self._key, signing_input.encode(), hashlib.sha256).digest()


def _invalid(problem: str) -> TokenError:
    return TokenError(f"X-API-Key: JWT {problem}; exchange the API key again at "
                      "/api/v1/auth/token", field="X-API-Key")
