"""LoRA adapters as data: per-adapter tensors, stacked per batch, applied by segment GEMMs."""
