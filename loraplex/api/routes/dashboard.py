"""``GET /dashboard``: the web dashboard, served from files inside the package (no CDN, no build
step: plain ES modules, hand-made SVG and canvas charts).

The page and its assets need no key: the page asks for one (or reads ``#key=tml-...`` from the
URL fragment, which browsers never send to the server) and sends it as ``X-API-Key`` on every
JSON request it makes. A strict Content-Security-Policy allows only this server's own scripts,
styles and requests. Assets are a fixed set of files in ``loraplex/api/static/dashboard``.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from loraplex.errors import NotFoundError

router = APIRouter()
ASSETS = resources.files("loraplex.api") / "static" / "dashboard"
MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@router.get("/dashboard", include_in_schema=False)
async def page() -> Response:
    return _file("index.html")


@router.get("/dashboard/assets/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name == "index.html":
        raise NotFoundError(f"no dashboard asset {name!r}")
    return _file(name)


def asset_names() -> list[str]:
    """The files the dashboard is made of (what the package must ship)."""
    return sorted(f.name for f in ASSETS.iterdir() if f.is_file())


def _file(name: str) -> Response:
    suffix = name[name.rfind("."):] if "." in name else ""
    if name not in asset_names() or suffix not in MEDIA_TYPES:
        raise NotFoundError(f"no dashboard asset {name!r}")
    return Response((ASSETS / name).read_bytes(), media_type=MEDIA_TYPES[suffix],
                    headers=SECURITY_HEADERS)
