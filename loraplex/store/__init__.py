"""Persistence: SQLite metadata (keys, sessions, models, checkpoints, futures, usage, recorded
sequences) and the checkpoint file layout under the data dir. No torch, no HTTP."""
