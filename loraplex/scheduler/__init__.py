"""Scheduling: per-model queues in seq_id order, clock cycles that pack many tenants' work into
shared engine batches, fairness and admission, sampler-adapter residency, the future store,
metering and observability.

Pure Python: never imports torch or the engine; it reaches the engine only through the
`BatchExecutor` protocol in `executor.py`. Flow: `ops` (what the API submits) → `scheduler`
(queues, `plan`, `complete`; policy in `planner`) → `runner` (the engine call) → `effects`
(store updates) → `futures` (what retrieve_future reads); `clock` drives it on a dedicated
thread. Each completed plan leaves a `metrics.CycleRecord` and per-op `usage.OpUsage` records
(priced by `billing`).
"""
