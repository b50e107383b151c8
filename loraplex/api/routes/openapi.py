"""``GET /openapi.json``: the server's OpenAPI document (`loraplex.api.openapi`), without auth."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from loraplex.api.openapi import openapi_document

router = APIRouter()


@router.get("/openapi.json", include_in_schema=False)
async def openapi_json(request: Request) -> JSONResponse:
    """Built per call, off the event loop (tens of milliseconds of schema generation)."""
    return JSONResponse(await asyncio.to_thread(openapi_document, request.app))
