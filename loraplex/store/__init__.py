"""Persistence: SQLite (WAL) metadata for keys, sessions, training runs, checkpoints, sampling
sessions, futures and recorded sequences, plus the checkpoint directories under the data dir.

Knows domain types and the filesystem; knows nothing of HTTP, scheduling or tensors (the
executor writes checkpoint files into directories allocated here).
"""
