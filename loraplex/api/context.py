"""Everything a route may use, built once by the composition root (`loraplex.cli.serve_cmd`)
and hung on ``app.state``: the server's config slice, the stores, the served catalogue (with
one scheduler per loaded model), the future store, and the download-URL signer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from loraplex.api.signing import UrlSigner
from loraplex.config import ServerConfig
from loraplex.scheduler.catalog import Catalog
from loraplex.scheduler.futures import FutureStore
from loraplex.store.stores import Stores


@dataclass(frozen=True)
class ServerContext:
    config: ServerConfig
    stores: Stores
    catalog: Catalog
    futures: FutureStore
    signer: UrlSigner
    started_at: float = field(default_factory=time.time)
    """When the server started: the ``created`` time of its served models in ``/v1/models``."""


def ctx_of(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx
