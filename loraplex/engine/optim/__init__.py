"""Per-adapter AdamW over adapter tensors only; the base model has no optimizer state.

`adamw_state.AdamWState` holds one adapter's moments and step (created at adapter creation or
lazily before its first step, saved and restored exactly); `adamw.adamw_step` applies one
Tinker `AdamParams` step to that adapter's tensors and returns its metrics.
"""
