"""Per-adapter AdamW over adapter tensors only; the base model has no optimizer state."""
