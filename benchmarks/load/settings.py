"""The load benchmark's settings: what one run does (client counts, durations, the flooder's
aggressiveness, the server's timeouts, the goals), and the smoke preset.

Plain data; `load/__main__.py` builds them from the command line, `load/phases.py` runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.load.client import Workload
from benchmarks.load.server import ServerSettings

#: tinker 0.38's session heartbeat period (``InternalClientHolder._session_heartbeat``).
SDK_HEARTBEAT_S = 10.0


@dataclass(frozen=True)
class Settings:
    """What one run does (the markdown prints it).

    Attributes:
        clients: soak clients (half train, half sample).
        clients_per_process: SDK clients per client process (threads; see `load/__main__.py`).
        soak_s: soak duration.
        steady_tenants: normal tenants of the flood phase.
        flood_s: the flood window.
        baseline_s: the normal tenants' baseline windows together (half before the flood,
            half after it); None: ``flood_s``.
        flood_concurrency, flood_retrievers, flood_retry_s, flood_nice: the flooder's
            submitters, result long-pollers, pause before resubmitting a 429, niceness.
        session_idle_s, future_ttl_s, housekeeping_s: the server's session idle timeout,
            future TTL and housekeeping interval (short, so sessions expire within the run).
        settle_s: RSS levels are medians over this many seconds.
        wait_fetched_grace: also wait until fetched futures are dropped before the final RSS.
        threads: the server's torch threads (1: stable under contention, perf-anchors §4).
        max_inflight_per_tenant: the server's per-tenant in-flight limit, where the flooder
            starts getting 429s (None: the server's default).
        openai_clients, openai_s, openai_max_tokens: the OpenAI phase's clients
            (`load/openai_clients.py`), its window, and their requests' largest ``max_tokens``.
        rss_interval_s: RSS sampling period.
        rss_tolerance, ratio_limit: the goals.
        drain_timeout_s: longest wait for the flooder's queue to drain.
        workload: op sizes of every SDK client (`load_client.Workload`).
    """

    clients: int = 32
    clients_per_process: int = 8
    soak_s: float = 120.0
    steady_tenants: int = 4
    flood_s: float = 60.0
    baseline_s: float | None = None
    flood_concurrency: int = 64
    flood_retrievers: int = 8
    flood_retry_s: float = 0.0
    flood_nice: int = 10
    session_idle_s: float = 30.0
    future_ttl_s: float = 60.0
    housekeeping_s: float = 2.0
    settle_s: float = 5.0
    wait_fetched_grace: bool = True
    threads: int | None = 1
    max_inflight_per_tenant: int | None = None
    openai_clients: int = 16
    openai_s: float = 60.0
    openai_max_tokens: int = 16
    rss_interval_s: float = 0.5
    rss_tolerance: float = 0.10
    ratio_limit: float = 2.0
    drain_timeout_s: float = 300.0
    workload: Workload = field(default_factory=Workload)

    @property
    def num_processes(self) -> int:
        return math.ceil(self.clients / self.clients_per_process)

    @property
    def baseline_half_s(self) -> float:
        return (self.flood_s if self.baseline_s is None else self.baseline_s) / 2

    def server(self) -> ServerSettings:
        return ServerSettings(self.session_idle_s, self.future_ttl_s, self.housekeeping_s,
                              self.threads, self.max_inflight_per_tenant)


#: A ~40 s end-to-end check: every phase and op kind (one OpenAI client per mode), the flooder's
#: 429s (a lower in-flight limit, so its queue also drains in a moment), sessions expiring (12 s
#: idle timeout: the SDK heartbeats every 10 s, and no smoke session needs a heartbeat); no
#: fetched-future grace.
SMOKE = Settings(clients=4, soak_s=3.0, flood_s=3.0, baseline_s=2.0, flood_concurrency=16,
                 flood_retrievers=4, session_idle_s=12.0, future_ttl_s=10.0,
                 housekeeping_s=0.5, settle_s=1.0, wait_fetched_grace=False,
                 max_inflight_per_tenant=32, openai_clients=4, openai_s=3.0,
                 workload=Workload(warmup_steps=1))


