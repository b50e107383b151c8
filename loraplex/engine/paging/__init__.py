"""Adapter paging: tenants bounded by disk, not device memory.

`pager.AdapterPager` keeps resident adapter state within `EngineConfig.adapter_memory_budget`
(LRU over adapters by last use), paging idle adapters out to host memory, then to disk, and
back in bit for bit; `adapter_state.AdapterState` is one adapter's leaves + gradients + optimizer
state detached from it, `page_file.PageFile` its scratch file on disk, and
`memory_stats` the counters `Engine.memory_stats` reports, `tier.Tier` the bookkeeping of one
tier. Imports point down: `paging` → `lora`, `optim` (the trainer's optimizer states are reached
through the `pager.OptimizerStates` Protocol), never back.
"""
