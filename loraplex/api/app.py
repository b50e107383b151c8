"""The app factory: one FastAPI app per `ServerContext`, no module-level state.

Startup moves checkpoint directories no record names (a crash left them uncommitted) to the
data dir's quarantine folder, never deleting them; then it runs one upkeep round and starts the
clock loops and the periodic upkeep; shutdown stops them. The server is ready (and
``/api/v1/healthz`` answers) once startup is done: the models were loaded before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from loraplex.api import errors, housekeeping, metering
from loraplex.api.auth import KeyCache, RevocationEpochs
from loraplex.api.completion_feeds import CompletionFeeds
from loraplex.api.context import ServerContext
from loraplex.api.jwt_tokens import JwtIssuer
from loraplex.api.openai_text import ModelTexts
from loraplex.api.routes import (
    client,
    custom_losses,
    cycles,
    dashboard,
    downloads,
    evals,
    futures,
    metrics,
    models,
    openai_completions,
    openai_models,
    openai_tokenizer,
    openapi,
    operator_view,
    run_metrics,
    runs,
    sampling,
    session_futures,
    sessions,
    stats,
    tenant_view,
    trace,
    training,
    usage,
    weights,
)

ROUTERS = (client, sessions, models, training, weights, sampling, futures, runs, downloads,
           stats, metrics, usage, openapi, run_metrics, tenant_view, operator_view, cycles,
           trace, dashboard, openai_models, openai_completions, openai_tokenizer, custom_losses,
           session_futures, evals)


def create_app(ctx: ServerContext) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(ctx.stores.checkpoints.quarantine_unknown)
        await asyncio.to_thread(housekeeping.sweep, ctx)
        ctx.catalog.start()
        upkeep = asyncio.create_task(housekeeping.run_forever(ctx))
        meter = asyncio.create_task(metering.run_forever(ctx))
        try:
            yield
        finally:
            upkeep.cancel()
            meter.cancel()
            await asyncio.to_thread(ctx.catalog.stop)
            await asyncio.to_thread(metering.flush, ctx)
            # The journal's writer thread is a daemon: flush now, or a request submitted in
            # its last interval answers 404 after a restart instead of "server restarted".
            await asyncio.to_thread(ctx.stores.futures.flush)

    app = FastAPI(title="loraplex", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ctx
    app.state.key_cache = KeyCache(ctx.config.key_cache_ttl_s)
    app.state.revocations = RevocationEpochs(ctx.config.key_cache_ttl_s)
    app.state.metrics_registries = metrics.metrics_registries(ctx)
    app.state.model_texts = ModelTexts()
    app.state.completion_feeds = CompletionFeeds(ctx.futures)
    key = ctx.config.jwt_issuer_key
    app.state.jwt_issuer = None if key is None else JwtIssuer(key, ctx.config.jwt_lifetime_s)
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)
    return app
