"""Frozen configuration, one slice per component, built once by the CLI.

Environment variables are read here and nowhere else. Each component receives only its own
slice (`config.engine` goes to the engine, `config.scheduler` to the scheduler, ...). Each
slice checks its own values on construction (`UserError` naming the field), whatever source
they came from; `loraplex.cli.config_sources` layers defaults, a TOML file, ``LORAPLEX_*``
variables and flags into these dataclasses, reaching every field by its type annotation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from loraplex.errors import user_error

DEFAULT_MODEL_NAME = "Qwen/Qwen3-8B"
"""Catalogue name the built-in tiny model is served under when no ``--model`` is given: a real
Qwen3 repo id, so the SDK's and the cookbook's tokenizer and renderer lookups accept it."""


def _check_at_least_one(config: object, *names: str) -> None:
    """Raise `UserError` naming the first of ``names`` whose value on ``config`` is below 1."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise user_error(name, f"must be at least 1, got {value}")


@dataclass(frozen=True)
class EngineConfig:
    """Compute settings.

    Attributes:
        device: ``cpu`` or ``cuda``; ``auto`` picks cuda when present.
        dtype: compute dtype; ``auto`` is float32 on CPU and bfloat16 on CUDA.
        max_lora_rank: largest rank a client may ask for.
        batch_invariant: pad GEMM rows and tile attention so a token's logprob does not depend
            on what else shares the batch, nor on decode vs full forward (bitwise).
        row_multiple: GEMM row counts are padded to a multiple of this in batch-invariant mode.
        kv_block_size: keys per attention block and per KV-cache page.
        kv_cache_blocks: pages in the sampler's KV cache (bounds sampler memory); None: as
            many as ``kv_cache_memory`` holds.
        kv_cache_memory: bytes of the sampler's KV cache when ``kv_cache_blocks`` is None
            (None: a tenth of the device's memory, host RAM on a CPU, and at most 131,072
            positions; `engine.sampling.kv_budget`).
        recompute: activation recomputation in training. ``layer``: keep each decoder
            layer's input only and recompute the layer's inside in the backward (the same
            bits; on SmolLM2 a 8,192-token step's activations go from ~20 GB to ~1 GB);
            ``none``: keep every activation.
        max_context: longest sequence accepted (None: the model's own limit).
        num_threads: torch intra-op threads (None: torch's default).
        retain_host_memory: keep freed host memory in the process for the next step's tensors
            instead of returning it to the OS and faulting it in again (glibc malloc; see
            `engine.host_allocator`); the process's memory then stays at its peak.
        adapter_memory_budget: bytes of adapter state kept on the engine's device: LoRA
            weights + gradients + AdamW moments of every resident adapter, sampler snapshots
            included. Idle adapters beyond it page out (host memory, then disk) and back in,
            bit for bit, on next use; a call whose own adapters exceed it still runs (None:
            unlimited, nothing pages).
        host_memory_budget: bytes of paged-out adapter state kept in host memory before the
            oldest spills to disk (None: unlimited; 0: page straight to disk).
        page_dir: scratch directory for paged-out adapter state; the engine writes into a
            private subdirectory it deletes on close. Never a checkpoint: its files are
            deleted and overwritten freely (None: a temporary directory).
        sample_prefill_tokens_per_step: prompt tokens the sampler prefills per step while
            sequences are decoding: a long prompt is prefilled in pieces between decode steps,
            so the running sequences and a short prompt admitted beside it are not held behind
            all of it (with nothing decoding, a step prefills as much as fits).
        sample_shared_decode_kv_tokens: while more than one tenant is sampling, the KV
            positions one tenant's decode rows may read per decode step (deficit round-robin,
            `engine.sampling.step_share`): a tenant decoding many long sequences decodes
            some of them each step instead of making every step long for everyone (0: off).
        sample_shared_prefill_tokens: while more than one tenant is sampling, prompt tokens
            prefilled per decode step (long prompts cut into pieces this small).
        sample_shared_linger_steps: decode steps a tenant still counts as sampling after its
            last sequence finished (its next request usually comes moments later).
        native_kernels: on CPU in float32, run loraplex's C kernels (`engine.kernels`, built
            with the system C compiler on first use): the packed sgemm for the base model's
            linears and head, wherever the loader finds it gives F.linear's bits on this
            machine (it keeps a packed copy of those weights: twice their memory), and the
            paged attention forward. False: torch only.
    """

    device: str = "auto"
    dtype: str = "auto"
    max_lora_rank: int = 128
    batch_invariant: bool = True
    row_multiple: int = 8
    kv_block_size: int = 64
    kv_cache_blocks: int | None = None
    kv_cache_memory: int | None = None
    recompute: Literal["none", "layer"] = "layer"
    max_context: int | None = None
    num_threads: int | None = None
    retain_host_memory: bool = True
    adapter_memory_budget: int | None = None
    host_memory_budget: int | None = None
    page_dir: str | None = None
    sample_prefill_tokens_per_step: int = 2048
    sample_shared_decode_kv_tokens: int = 16384
    sample_shared_prefill_tokens: int = 16
    sample_shared_linger_steps: int = 32
    native_kernels: bool = True

    def __post_init__(self) -> None:
        if self.num_threads is not None and self.num_threads < 1:
            raise user_error("num_threads", f"must be at least 1, got {self.num_threads}")
        for name in ("kv_cache_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise user_error(name, f"must be at least 1, got {value}")
        if self.recompute not in ("none", "layer"):
            raise user_error("recompute", f"must be 'none' or 'layer', got {self.recompute!r}")
        if self.sample_shared_decode_kv_tokens < 0:
            raise user_error("sample_shared_decode_kv_tokens",
                             f"must be ≥ 0 (0: off), got {self.sample_shared_decode_kv_tokens}")
        if self.sample_shared_linger_steps < 0:
            raise user_error("sample_shared_linger_steps",
                             f"must be ≥ 0, got {self.sample_shared_linger_steps}")
        _check_at_least_one(self, "sample_shared_prefill_tokens")


@dataclass(frozen=True)
class SchedulerConfig:
    """Clock-cycle scheduling and admission.

    Attributes:
        token_budget: most datum tokens packed into one training batch.
        max_inflight_per_tenant: queued + running ops per tenant before backpressure.
        quantum_tokens: deficit round-robin quantum per tenant per round.
        timeslice: naive mode, one model per cycle (the multiplexing baseline).
        decode_steps_per_cycle: sampler decode steps between training batches when both wait.
        stream_decode_steps: at most this many decode steps per sampling step while a
            streamed request runs, so its tokens leave the server as they are sampled (each
            step's new tokens are sent once it ends).
        max_sampler_snapshots_per_model: newest ephemeral sampler snapshots kept in engine
            memory per training run (older sampling sessions of that run stop working).
        max_checkpoint_samplers: checkpoint-backed sampler adapters kept loaded (LRU).
        sample_kv_budget_tokens: KV tokens running sampling requests may reserve (prompt +
            num_samples × max_tokens each, the worst case). About twice the engine's KV
            cache by default: most samples stop before max_tokens, and when pages do run out
            the engine preempts and later recomputes its newest sequences.
        sample_share: engine-time share sampling gets while training also waits (0..1).
        sample_anticipation_s: after a sampling step finished requests, training waits up to
            this long for those clients' next requests (a sequential sampler beside a
            training flood otherwise waits a whole cycle per request; 0: off). The wait is
            charged to sampling's share.
        sample_anticipation_cycle_fraction: and at most this part of a mean training cycle,
            which bounds what training loses to clients that do not come back.
        sample_prefill_tokens_per_step: prompt tokens sampling admits per step (the first
            request always), so a burst of long prompts is prefilled over several steps and a
            short request admitted beside it is not held behind all of them.
        sample_max_tenant_share: the part of ``sample_kv_budget_tokens`` one tenant's running
            requests may reserve while another tenant sampled within
            ``latency_fair_window_s``, so others always find room.
        seq_gap_timeout_s: ops stuck this long behind a seq_id that never arrived are failed
            and the missing seq_id is skipped (None: wait forever). Longer than the SDK's
            5-minute submit retry window.
        cycle_history: cycle records kept for the stats endpoint.
        io_threads: threads per base model that run checkpoint saves (write, encryption,
            commit) and checkpoint reads, so file work never stalls the clock loop.
        max_seq_ahead: how far past the next expected seq_id of a model a request may be
            (a request further ahead is refused; bounds what the gap timeout skips).
        latency_fair_window_s: while other tenants trained within this many seconds, a tenant
            packs about as many tokens per cycle as the largest of their recent demands (but
            at least ``latency_fair_floor_tokens``), so a flood of one tenant's work does not
            lengthen everyone's cycles (0: off).
        latency_fair_floor_tokens: the least a tenant may pack per cycle under that rule, so
            tenants of unequal batch sizes still fill cycles.
    """

    token_budget: int = 16384
    max_inflight_per_tenant: int = 256
    quantum_tokens: int = 2048
    timeslice: bool = False
    decode_steps_per_cycle: int = 8
    stream_decode_steps: int = 1
    max_sampler_snapshots_per_model: int = 4
    max_checkpoint_samplers: int = 16
    sample_kv_budget_tokens: int = 262144
    sample_share: float = 0.5
    sample_anticipation_s: float = 0.1
    sample_anticipation_cycle_fraction: float = 0.05
    sample_prefill_tokens_per_step: int = 8192
    sample_max_tenant_share: float = 0.75
    seq_gap_timeout_s: float | None = 900.0
    cycle_history: int = 4096
    io_threads: int = 2
    max_seq_ahead: int = 4096
    latency_fair_window_s: float = 2.0
    latency_fair_floor_tokens: int = 128

    def __post_init__(self) -> None:
        _check_at_least_one(self, "token_budget")
        if not 0 < self.sample_max_tenant_share <= 1:
            raise user_error("sample_max_tenant_share",
                             f"must be in (0, 1], got {self.sample_max_tenant_share}")
        for name in ("sample_anticipation_s", "sample_anticipation_cycle_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise user_error(name, f"must be in [0, 1], got {getattr(self, name)}")
        _check_at_least_one(self, "decode_steps_per_cycle", "stream_decode_steps",
                            "sample_prefill_tokens_per_step")


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
        _check_at_least_one(self, "max_body_bytes", "max_decompressed_bytes",
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
        _check_at_least_one(self, "max_training_runs", "max_checkpoint_bytes",
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


@dataclass(frozen=True)
class ClusterConfig:
    """Engine workers as Ray actors (``pip install 'loraplex[ray]'``).

    Attributes:
        workers: engine workers per model source; 0 runs the engine in the server process
            (no Ray at all), N ≥ 1 starts N Ray actors (a local Ray runtime unless
            ``ray_address`` is set).
        ray_address: join this running Ray cluster (``ray start --head`` on one host,
            ``ray start --address=...`` on the others) instead of starting one.
        worker_resources: one worker's Ray bundle, ``NAME=AMOUNT[,...]`` (``CPU=1``,
            ``GPU=1``, custom resources); with ``model_parallel`` N, one rank's (a group
            asks for N such bundles, packed on one node).
        model_parallel: ranks per engine worker: N > 1 makes each worker a group of N
            processes that together hold one copy of the base model as pipeline stages
            (torch.distributed, gloo on CPU and NCCL on CUDA): Ray actors when Ray is used,
            else child processes of the server (``workers`` 0 then means one group).
        ray_host: the interface a Ray runtime this server starts listens on (None: the API's
            ``server.host``; loopback keeps Ray on loopback too). A joined cluster
            (``ray_address``) binds as it was started.
        head_probe_interval_s: how often the Ray head's GCS port is probed; three misses in
            a row and the head is lost (workers fail over, the connection is made again).
    """

    workers: int = 0
    ray_address: str | None = None
    worker_resources: str = "CPU=1"
    model_parallel: int = 1
    ray_host: str | None = None
    head_probe_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise user_error("workers", f"must be ≥ 0, got {self.workers}")
        if self.model_parallel < 1:
            raise user_error("model_parallel", f"must be ≥ 1, got {self.model_parallel}")
        if not self.head_probe_interval_s > 0:
            raise user_error("head_probe_interval_s",
                             f"must be > 0, got {self.head_probe_interval_s}")

    @property
    def uses_ray(self) -> bool:
        return self.workers > 0 or self.ray_address is not None


@dataclass(frozen=True)
class LoraplexConfig:
    """The aggregate the CLI builds; components never see it whole."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def default_hf_home() -> str:
    """Hugging Face's cache root as ``transformers`` resolves it (``$HF_HOME``, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``)."""
    if os.environ.get("HF_HOME"):
        return os.environ["HF_HOME"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "huggingface")


ENV_PREFIX = "LORAPLEX_"
"""Every configuration variable's prefix: ``LORAPLEX_<SECTION>_<FIELD>``."""


def loraplex_environment() -> dict[str, str]:
    """The ``LORAPLEX_*`` environment variables by full name: the only place configuration
    reads the environment (`loraplex.cli.config_sources` interprets them)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
