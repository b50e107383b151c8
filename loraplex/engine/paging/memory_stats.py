"""`PageStats` (what paging has done since the engine started) and `MemoryStats` (where adapter
state lives now, `Engine.memory_stats`): plain numbers for tests, benchmarks and the stats
endpoint. Knows nothing of how paging decides."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PageStats:
    """Counters, updated by the pager.

    Attributes:
        page_outs: adapters moved off the device (to host memory, or straight to disk).
        page_ins: adapters moved back onto the device.
        to_disk: page files written (page-outs with a host budget of 0, and host copies
            spilled past the host budget).
        from_disk: page-ins read from a page file.
        bytes_to_host, bytes_from_host: bytes copied between the device and host memory; 0 on
            a CPU engine, where those moves hand the same tensors over (the disk tier is what
            bounds memory there).
        bytes_to_disk, bytes_from_disk: page-file bytes written and read.
        seconds: wall time spent moving state (copies, file writes and reads).
        over_budget_calls: calls whose own adapters did not fit the budget; they ran anyway.
        max_over_budget_bytes: the most such a call reserved beyond the budget.
    """

    page_outs: int = 0
    page_ins: int = 0
    to_disk: int = 0
    from_disk: int = 0
    bytes_to_host: int = 0
    bytes_from_host: int = 0
    bytes_to_disk: int = 0
    bytes_from_disk: int = 0
    seconds: float = 0.0
    over_budget_calls: int = 0
    max_over_budget_bytes: int = 0


@dataclass(frozen=True)
class MemoryStats:
    """Where the adapter state of one engine lives.

    Attributes:
        num_resident, num_host, num_disk: adapters on the device, in host memory, on disk.
        bytes_resident: leaves + gradients + moments of the resident adapters (device bytes).
        bytes_host: the same for the host-memory copies.
        bytes_disk: page-file bytes on disk.
        budget_bytes: `EngineConfig.adapter_memory_budget` (None: unlimited).
        host_budget_bytes: `EngineConfig.host_memory_budget` (None: unlimited).
        paging: a copy of the counters.
    """

    num_resident: int
    num_host: int
    num_disk: int
    bytes_resident: int
    bytes_host: int
    bytes_disk: int
    budget_bytes: int | None
    host_budget_bytes: int | None
    paging: PageStats
