"""Signed download links as the API hands them out: a checkpoint's archive URL for a tenant
(`archive_link`) below the API root the client reached (`api_root`). The download routes check
them (`api.signing`)."""

from __future__ import annotations

from fastapi import Request

from loraplex.api.context import ServerContext
from loraplex.api.signing import quote_path
from loraplex.domain.ids import TinkerPath


def archive_link(ctx: ServerContext, request: Request, tenant: str, path: TinkerPath
                 ) -> tuple[str, int]:
    """A signed URL of ``path``'s tar archive as made for ``tenant`` (who may read it), and
    its expiry (Unix seconds)."""
    resource = f"archives/{path.run_id}/{path.kind}/{path.name}.tar"
    query, expires = ctx.signer.sign(resource, tenant, ctx.config.download_url_ttl_s)
    return f"{api_root(request)}/{quote_path(resource)}?{query}", expires


def api_root(request: Request) -> str:
    return str(request.base_url).rstrip("/") + "/api/v1"
