"""How many KV-cache pages the sampler allocates: a memory budget divided by one page's bytes.

A page holds ``block_size`` positions of keys and values for every layer the engine holds, so
its bytes grow with the model: the old fixed 2048 pages were 67 MB on the tiny built-in and
6 GB on SmolLM2-135M's 30 layers. `kv_cache_blocks` sizes the cache from
``EngineConfig.kv_cache_memory`` instead (default: `AUTO_FRACTION` of the device's memory,
host RAM on a CPU), at most `AUTO_MAX_TOKENS` positions unless set explicitly; an explicit
``kv_cache_blocks`` wins over both. Knows nothing about sequences or requests.
"""

from __future__ import annotations

import os

import torch

from loraplex.engine.model.spec import ModelSpec

#: Share of the device's memory (host RAM on a CPU) the cache takes when no budget is set.
AUTO_FRACTION = 0.10
#: Most positions an automatically sized cache holds (2048 pages of 64): small models keep the
#: old default rather than taking a tenth of the machine.
AUTO_MAX_TOKENS = 131072


def page_bytes(spec: ModelSpec, num_layers: int, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one page: keys and values of ``block_size`` positions in ``num_layers``."""
    values = 2 * num_layers * spec.num_kv_heads * block_size * spec.head_dim
    return values * torch.empty((), dtype=dtype).element_size()


def device_memory(device: torch.device) -> int:
    """Total memory of ``device`` (host RAM for a CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_cache_blocks(explicit_blocks: int | None, budget_bytes: int | None, spec: ModelSpec,
                    num_layers: int, block_size: int, device: torch.device,
                    dtype: torch.dtype) -> int:
    """The cache's page count (see the module docstring); at least one page."""
    if explicit_blocks is not None:
        return explicit_blocks
    per_page = page_bytes(spec, num_layers, block_size, dtype)
    if budget_bytes is not None:
        return max(1, budget_bytes // per_page)
    auto = int(AUTO_FRACTION * device_memory(device)) // per_page
    return max(1, min(auto, AUTO_MAX_TOKENS // block_size))
