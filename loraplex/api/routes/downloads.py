"""Checkpoint downloads (tinker-api.md §9.3).

SDK 0.38 / the cookbook: ``GET …/external_weights_urls`` lists one signed URL per file of an
external-weights export; each URL is then fetched with a plain GET and no auth header. SDK 0.27:
``GET …/archive`` answers 302 to a signed URL of a tar holding the PEFT adapter files and an
empty ``checkpoint_complete``. Signed URLs name the checkpoint, not its directory, and expire
after ``download_url_ttl_s``; they work for the owner's and for published checkpoints.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import os
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse

from loraplex.api.access import readable_checkpoint
from loraplex.api.auth import Tenant
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.download_links import api_root, archive_link
from loraplex.api.signing import quote_path
from loraplex.domain.ids import TinkerPath
from loraplex.errors import NotFoundError, user_error
from loraplex.store.archive import build_archive
from loraplex.store.checkpoints import CheckpointRecord

router = APIRouter(prefix="/api/v1")


def _readable(ctx: ServerContext, tenant: str, run_id: str, kind: str, name: str
              ) -> CheckpointRecord:
    path = TinkerPath.from_checkpoint_id(run_id, f"{kind}/{name}")
    record, _ = readable_checkpoint(ctx, tenant, str(path), "checkpoint_id")
    return record


def _files(directory: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(base, f), directory)
                  for base, _, files in os.walk(directory) for f in files)


def _expiry_iso(expires: int) -> str:
    return datetime.datetime.fromtimestamp(expires, datetime.UTC).isoformat()


@router.get("/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls")
async def external_weights_urls(run_id: str, kind: str, name: str, request: Request,
                                tenant: Tenant) -> dict[str, Any]:
    ctx = ctx_of(request)
    if kind != "external_weights":
        raise user_error("checkpoint_id", "only external_weights checkpoints have file URLs; "
                         "export with save_weights_external first")
    record = _readable(ctx, tenant, run_id, kind, name)
    urls, expires = {}, 0
    for rel in _files(record.directory):
        resource = f"files/{run_id}/{kind}/{name}/{rel}"
        query, expires = ctx.signer.sign(resource, tenant, ctx.config.download_url_ttl_s)
        urls[rel] = f"{api_root(request)}/{quote_path(resource)}?{query}"
    if not urls:
        _, expires = ctx.signer.sign("", tenant, ctx.config.download_url_ttl_s)
    return {"urls": urls, "expires": _expiry_iso(expires)}


@router.get("/training_runs/{run_id}/checkpoints/{kind}/{name}/archive")
async def archive_url(run_id: str, kind: str, name: str, request: Request,
                      tenant: Tenant) -> Response:
    ctx = ctx_of(request)
    record = _readable(ctx, tenant, run_id, kind, name)
    url, expires = archive_link(ctx, request, tenant, record.path)
    headers = {"Location": url, "Expires": email.utils.formatdate(expires, usegmt=True)}
    return JSONResponse({"url": url, "expires": _expiry_iso(expires)}, status_code=302,
                        headers=headers)


@router.get("/files/{run_id}/{kind}/{name}/{rel:path}")
async def download_file(run_id: str, kind: str, name: str, rel: str, t: str, expires: int,
                        sig: str, request: Request) -> FileResponse:
    ctx = ctx_of(request)
    ctx.signer.verify(f"files/{run_id}/{kind}/{name}/{rel}", t, expires, sig)
    record = _still_readable(ctx, t, run_id, kind, name)
    root = os.path.realpath(record.directory)
    target = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, target]) != root or not os.path.isfile(target):
        raise NotFoundError("no such file in the checkpoint")
    return FileResponse(target, media_type="application/octet-stream")


@router.get("/archives/{run_id}/{kind}/{name}.tar")
async def download_archive(run_id: str, kind: str, name: str, t: str, expires: int, sig: str,
                           request: Request) -> FileResponse:
    ctx = ctx_of(request)
    ctx.signer.verify(f"archives/{run_id}/{kind}/{name}.tar", t, expires, sig)
    record = _still_readable(ctx, t, run_id, kind, name)
    tar = await asyncio.to_thread(build_archive, record.directory, ctx.stores.archive_dir)
    return FileResponse(tar, media_type="application/x-tar", filename=f"{name}.tar")


def _still_readable(ctx: ServerContext, tenant: str, run_id: str, kind: str, name: str
                    ) -> CheckpointRecord:
    """The checkpoint a signed URL names, if the tenant it was made for may still read it."""
    path = TinkerPath.from_checkpoint_id(run_id, f"{kind}/{name}")
    record = ctx.stores.checkpoints.find(path)
    if record is None or not record.readable_by(tenant):
        raise NotFoundError("the checkpoint was deleted or is no longer published")
    return record
