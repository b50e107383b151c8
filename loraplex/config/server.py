"""`ServerConfig`: the HTTP surface (``[server]``), with the models it serves and its own
sub-slices: usage metering (``[metering]``), request bounds (``[limits]``) and per-tenant quotas
(``[quotas]``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loraplex.config.checks import check_at_least_one
from loraplex.errors import user_error

DEFAULT_MODEL_NAME = "Qwen/Qwen3-8B"
"""Catalogue name the built-in tiny model is served under when no ``--model`` is given: a real
Qwen3 repo id, so the SDK's and the cookbook's tokenizer and renderer lookups accept it."""


@dataclass(frozen=True)
class MeteringConfig:
    """Usage metering and how it is priced (``GET /api/v1/loraplex/usage``, ``loraplex usage``).

    Attributes:
        flush_interval_s: how often metered ops are folded into the SQLite usage table.
        price_sheet: a dated sheet of ``loraplex.cost.price_sheets``.
        price_table: a custom sheet (``price_sheet_from_mapping`` keys); replaces
            ``price_sheet`` when set.
        model_map: served NAME → the sheet's model name (names the sheet lists map to
            themselves).
        default_model: the sheet model for names neither mapped nor listed.
        cached_prefill_ratio: price of a prefix-cache hit relative to prefill in
            ``cache_aware`` mode (None: the sheet's own ratio).
    """

    flush_interval_s: float = 2.0
    price_sheet: str = "tinker-2026-01-05"
    price_table: Mapping[str, Any] | None = None
    model_map: Mapping[str, str] = field(default_factory=dict)
    default_model: str = "Qwen/Qwen3-8B"
    cached_prefill_ratio: float | None = 0.2


BUILTIN_SERVED_NAMES = {"builtin:smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""Real built-ins and the catalogue name ``--model SOURCE`` (no ``NAME=``) serves them under."""


@dataclass(frozen=True)
class ModelSource:
    """``--model NAME=SOURCE``: a catalogue name served from a local directory or a built-in.

    Attributes:
        name: what clients pass as ``base_model``.
        source: a local Hugging Face directory, ``builtin:tiny`` / ``builtin:small`` /
            ``builtin:smollm2-135m``, or ``gguf:/path/model.gguf``.
    """

    name: str
    source: str

    @staticmethod
    def parse(spec: str) -> ModelSource:
        """``NAME=SOURCE`` → `ModelSource` (a bare real built-in gets its own name).

        Raises:
            ValueError: no ``=``, or an empty side (the config loader names the source).
        """
        if spec in BUILTIN_SERVED_NAMES:  # a bare real built-in: served under its own name
            return ModelSource(BUILTIN_SERVED_NAMES[spec], spec)
        name, sep, source = spec.partition("=")
        if not sep or not name or not source:
            raise ValueError(f"expected NAME=SOURCE, got {spec!r}")
        return ModelSource(name, source)


@dataclass(frozen=True)
class LimitsConfig:
    """Request bounds, checked before anything is allocated (``loraplex.api.body`` and the
    codec apply them; the table in docs/limits.md lists them).

    Attributes:
        max_body_bytes: largest request body read (HTTP 413 beyond; the SDK's own chunking
            keeps forward_backward bodies near 5 MB).
        max_decompressed_bytes: largest zstd-decompressed body (a zstd bomb is refused after
            inflating this much, never more).
        max_tensor_elements: most elements one decoded tensor may hold (checked on the shape,
            before a sparse tensor is densified).
        max_request_elements: most elements all decoded tensors of one request may hold
            together (checked on the shapes before any is decoded: many sparse tensors, each
            within `max_tensor_elements`, would otherwise expand a few bytes into gigabytes).
        max_image_pixels: most pixels an image chunk may decode to (its header is read first:
            a decompression bomb is refused before any pixel is decoded).
        max_image_bytes: most encoded bytes of one image chunk.
    """

    max_body_bytes: int = 64 << 20
    max_decompressed_bytes: int = 256 << 20
    max_tensor_elements: int = 1 << 24
    max_request_elements: int = 1 << 25
    max_image_pixels: int = 1 << 25
    max_image_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        check_at_least_one(self, "max_body_bytes", "max_decompressed_bytes",
                            "max_tensor_elements", "max_request_elements", "max_image_pixels",
                            "max_image_bytes")


@dataclass(frozen=True)
class QuotaConfig:
    """Per-tenant quotas (shown in ``GET /api/v1/loraplex/usage``). In-flight ops are bounded
    by ``scheduler.max_inflight_per_tenant``.

    Attributes:
        max_training_runs: live training runs (adapters in engine memory) per tenant, over
            every served model; a create beyond it is refused (HTTP 403) until a session ends.
        max_checkpoint_bytes: stored checkpoint bytes per tenant; a save while at or over it
            fails (delete checkpoints or let their TTL pass).
        max_unfetched_result_bytes: bytes of completed results (and errors) a tenant has not
            fetched yet; new submits get HTTP 429 until it fetches them or they expire.
        max_custom_losses_per_session: uploaded losses one session may store (each is kept in
            SQLite for the session's life); a create beyond it is refused (HTTP 403).
    """

    max_training_runs: int = 64
    max_checkpoint_bytes: int = 50 << 30
    max_unfetched_result_bytes: int = 1 << 30
    max_custom_losses_per_session: int = 256

    def __post_init__(self) -> None:
        check_at_least_one(self, "max_training_runs", "max_checkpoint_bytes",
                            "max_unfetched_result_bytes", "max_custom_losses_per_session")


@dataclass(frozen=True)
class ServerConfig:
    """HTTP surface.

    Attributes:
        host, port: where uvicorn listens.
        data_dir: SQLite database, checkpoints and built-in models live here.
        models: catalogue names and their sources.
        open_access: accept any ``tml-`` key, one tenant per distinct key.
        long_poll_s: how long retrieve_future holds a pending request.
        future_ttl_s: how long an unfetched result (or failure) is kept.
        client_config: extra ``/client/config`` flags sent to every SDK (e.g.
            ``fwdbwd_max_chunk_len``, ``parallel_fwdbwd_chunks``; tinker-api.md §3.1).
        session_idle_timeout_s: a session without heartbeats this long has its training runs'
            adapters released from engine memory (their records and checkpoints stay).
        housekeeping_interval_s: how often TTLs are enforced and stale results dropped.
        download_url_ttl_s: lifetime of signed checkpoint-download URLs.
        key_cache_ttl_s: how long a resolved API key is trusted before the database is asked
            again (a revoked key stops working within this time).
        jwt_issuer_key: HMAC-SHA256 secret (≥ 32 characters) for SDK 0.38's JWT mode
            (``pjwt_auth_enabled``): set, the SDK exchanges its API key at
            ``/api/v1/auth/token`` for short-lived JWTs; None keeps plain API keys.
        jwt_lifetime_s: lifetime of those JWTs (a revoked key's tokens live this long).
        metering: usage metering and pricing.
        limits: request bounds.
        quotas: per-tenant quotas.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str = "./loraplex-data"
    models: tuple[ModelSource, ...] = (ModelSource(DEFAULT_MODEL_NAME, "builtin:tiny"),)
    open_access: bool = False
    long_poll_s: float = 25.0
    future_ttl_s: float = 3600.0
    client_config: Mapping[str, Any] = field(default_factory=dict)
    session_idle_timeout_s: float = 3600.0
    housekeeping_interval_s: float = 60.0
    download_url_ttl_s: float = 3600.0
    key_cache_ttl_s: float = 5.0
    jwt_issuer_key: str | None = field(default=None, repr=False)
    jwt_lifetime_s: float = 900.0
    metering: MeteringConfig = field(default_factory=MeteringConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    quotas: QuotaConfig = field(default_factory=QuotaConfig)

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        if not names:
            raise user_error("models", "serve at least one model")
        if len(set(names)) != len(names):
            raise user_error("models", f"a NAME appears twice in {names}")
        if self.jwt_issuer_key is not None and len(self.jwt_issuer_key) < 32:
            raise user_error("jwt_issuer_key", "must be at least 32 characters")
        if not 120 <= self.jwt_lifetime_s <= 86_400:
            raise user_error("jwt_lifetime_s", "must be in [120, 86400] seconds (the SDK "
                             "renews a token with 60 s left)")
