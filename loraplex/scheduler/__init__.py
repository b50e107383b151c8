"""Scheduling: per-model queues in seq_id order, clock cycles that pack many tenants' work into
shared engine batches, fairness and admission, and the future store.

Pure Python: never imports torch or the engine; it reaches the engine only through the
`BatchExecutor` protocol in `executor.py`.
"""
