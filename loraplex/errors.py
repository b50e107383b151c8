"""The one exception hierarchy of loraplex.

Raised low (engine, store, scheduler), mapped to HTTP statuses and Tinker future failures in
exactly one place: `loraplex.api.errors`. Nothing here knows about HTTP codes.
"""

from __future__ import annotations

import logging
import uuid
from typing import ClassVar, Literal, Self

log = logging.getLogger("loraplex")


class LoraplexError(Exception):
    """Base of every error loraplex raises on purpose.

    Attributes:
        message: human-readable text; for user errors it names the offending field.
        field: dotted path of the offending input (e.g. ``data[3].loss_fn_inputs.weights``).
    """

    category: ClassVar[Literal["user", "server"]] = "server"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle as (class, message, field), so an error crosses a process boundary (a Ray
        worker's outcome) whole and without its traceback."""
        return (_rebuild, (type(self), self.message, self.field))

    def detached(self) -> Self:
        """A copy with only the message and field: no traceback, cause or context, so a
        failure kept for a client holds no reference to the request that caused it."""
        return type(self)(self.message, field=self.field)


class UserError(LoraplexError):
    """The request is wrong (bad field, unknown loss, out-of-vocab token, ...). Nothing changed."""

    category = "user"


class NotFoundError(UserError):
    """The object does not exist, or belongs to another tenant (indistinguishable on purpose)."""


class AuthError(UserError):
    """Missing or unknown API key."""


class ForbiddenError(UserError):
    """The caller is known but may not see this (an operator-only view)."""

class TokenError(AuthError):
    """An expired, forged or malformed bearer JWT: the client should exchange its key for a
    new one (RFC 6750 ``invalid_token``)."""


class ConflictError(UserError):
    """The object already exists (e.g. a checkpoint name without ``overwrite``)."""


class QuotaError(UserError):
    """A tenant is at one of its quotas (training runs, checkpoint bytes): it must free some
    before this succeeds (retrying alone does not help)."""


class PayloadTooLargeError(UserError):
    """A request body (or what it decompresses to) is over the server's limit."""


class CapacityError(LoraplexError):
    """A tenant is over its in-flight budget; the client should back off and retry."""

    category = "server"


class StorageError(LoraplexError):
    """The data dir cannot take the write: its disk or quota is full, it is read-only, its
    database is damaged, or its database and checkpoint directories disagree (a refused start).
    The message names the problem (and the free bytes of a full disk), never a server path."""

    category = "server"


class ServerError(LoraplexError):
    """An internal failure; the HTTP layer attaches an error id and never a stack trace."""

    category = "server"


class WorkerLostError(ServerError):
    """The engine worker holding this work died (its process or node is gone). Retrying is
    safe: the message says what the training run was restored from."""


def _rebuild(cls: type[LoraplexError], message: str, field: str | None) -> LoraplexError:
    return cls(message, field=field)


def user_error(field: str, problem: str) -> UserError:
    """Build a `UserError` whose message starts with the field it is about."""
    return UserError(f"{field}: {problem}", field=field)


def server_bug(exc: BaseException, what: str) -> ServerError:
    """Log ``exc`` with its traceback under a new error id; return the client-safe error (the
    id, never the trace)."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s during %s", error_id, what, exc_info=exc)
    return ServerError(f"internal server error (error id {error_id})")
