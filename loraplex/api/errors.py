"""The one place exceptions become HTTP responses and Tinker future failures.

| raised                      | HTTP | future failure category |
|-----------------------------|------|-------------------------|
| NotFoundError               | 404  | user                    |
| AuthError                   | 401  | user                    |
| TokenError (a bad JWT)      | 401 (+ WWW-Authenticate: invalid_token) | user |
| ConflictError               | 409  | user                    |
| QuotaError, ForbiddenError  | 403  | user                    |
| PayloadTooLargeError        | 413  | user                    |
| other UserError, bad schema | 400  | user                    |
| CapacityError               | 429 (+ Retry-After) | server   |
| StorageError                | 507 (+ x-should-retry: false) | server |
| anything else               | 500 with an error id, never a trace | server |

Under ``/v1/`` (the OpenAI-compatible routes) the same statuses carry OpenAI's error shape,
``{"error": {"message", "type", "param", "code"}}``, which OpenAI clients parse.

Every 4xx carries a JSON body naming the field (an empty 400 is retried by the SDK as a proxy
glitch, tinker-api.md §2.4). 409 is retried by the SDK's HTTP layer, so submit paths report
conflicts as failed futures instead.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.api.error_bodies import ErrorBody, OpenAIError, OpenAIErrorDetail
from loraplex.errors import (
    AuthError,
    CapacityError,
    ConflictError,
    ForbiddenError,
    LoraplexError,
    NotFoundError,
    PayloadTooLargeError,
    QuotaError,
    ServerError,
    StorageError,
    TokenError,
    UserError,
    server_bug,
    user_error,
)

_STATUSES: tuple[tuple[type[LoraplexError], int], ...] = (
    (NotFoundError, 404), (AuthError, 401), (ConflictError, 409), (QuotaError, 403),
    (ForbiddenError, 403), (PayloadTooLargeError, 413), (UserError, 400), (CapacityError, 429),
    (StorageError, 507),
)
"""The module docstring's table, in order: an error gets the status of the first class it is an
instance of (a subclass before its base: PayloadTooLargeError is a UserError)."""


def http_status(error: LoraplexError) -> int:
    return next((status for kind, status in _STATUSES if isinstance(error, kind)), 500)


def error_body(error: LoraplexError) -> dict[str, Any]:
    """JSON of a failed request, also the shape of a failed future (``error``, ``category``);
    ``field`` only when one is named."""
    body = ErrorBody(error=error.message, category=error.category, detail=error.message)
    if error.field is not None:
        body.field = error.field
    return body.model_dump(mode="json", exclude_unset=True)


def failure_json(error: LoraplexError) -> dict[str, Any]:
    """What retrieve_future answers for a failed future (tinker-api.md §4.2 row 4)."""
    return {"error": error.message, "category": error.category}


OPENAI_PREFIX = "/v1/"

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 403: "permission_error", 404: "not_found_error", 409: "conflict_error",
                 413: "invalid_request_error", 429: "rate_limit_error"}


def openai_error(error: LoraplexError, status: int) -> OpenAIError:
    """OpenAI's error object: ``param`` is the offending field, ``code`` a short reason."""
    code = {401: "invalid_api_key", 404: "model_not_found" if error.field == "model"
            else "not_found", 429: "rate_limit_exceeded"}.get(status)
    kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return OpenAIError(error=OpenAIErrorDetail(message=error.message, type=kind,
                                               param=error.field, code=code))


def openai_error_body(error: LoraplexError, status: int) -> dict[str, Any]:
    """`openai_error` as the JSON sent."""
    return openai_error(error, status).model_dump(mode="json")


def error_response(error: LoraplexError, path: str = "") -> JSONResponse:
    headers = {"Retry-After": "1"} if isinstance(error, CapacityError) else None
    if isinstance(error, StorageError):  # a full or read-only disk: retrying at once won't help
        headers = {"x-should-retry": "false"}
    if isinstance(error, TokenError):  # the SDK re-exchanges its key once, then replays
        headers = {"WWW-Authenticate": 'Bearer error="invalid_token"'}
    status = http_status(error)
    content = (openai_error_body(error, status) if path.startswith(OPENAI_PREFIX)
               else error_body(error))
    return JSONResponse(content, status_code=status, headers=headers)


def from_validation(exc: pydantic.ValidationError | RequestValidationError,
                    prefix: str = "") -> UserError:
    """A schema failure as a UserError naming the first offending field."""
    errors = exc.errors()
    if not errors:
        return user_error(prefix or "body", "invalid request")
    first = errors[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    field = ".".join(p for p in (prefix, loc) if p) or "body"
    return user_error(field, str(first.get("msg", "invalid value")))


def install(app: FastAPI) -> None:
    """Register the handlers that turn every exception into one of the responses above."""

    @app.exception_handler(LoraplexError)
    async def _domain(request: Request, exc: LoraplexError) -> JSONResponse:
        return error_response(exc, request.url.path)

    @app.exception_handler(pydantic.ValidationError)
    async def _schema(request: Request, exc: pydantic.ValidationError) -> JSONResponse:
        return error_response(from_validation(exc), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(from_validation(exc), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error: LoraplexError = (NotFoundError(f"{request.url.path}: no such endpoint")
                                if exc.status_code == 404 else UserError(str(exc.detail)))
        body = (openai_error_body(error, exc.status_code)
                if request.url.path.startswith(OPENAI_PREFIX) else error_body(error))
        return JSONResponse(body, status_code=exc.status_code)

    app.add_middleware(ServerBugMiddleware)


class ServerBugMiddleware:
    """Turns an unexpected exception into a 500 with an error id (never a trace) without
    re-raising it, so the server keeps the client's keep-alive connection open. (Starlette's
    own catch-all handler re-raises after answering, and uvicorn then closes the connection.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # a response is half-sent: nothing better to do than to drop it
                raise
            error = server_bug(exc, f"{scope.get('method')} {scope.get('path')}")
            await error_response(error, str(scope.get("path", "")))(scope, receive, send)


__all__ = ["ServerError", "error_body", "error_response", "failure_json", "from_validation",
           "http_status", "install"]
