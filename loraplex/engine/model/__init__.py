"""Base-model code: HF checkpoint loading, the Qwen3/Llama transformer over packed sequences,
batch-invariant attention, and the built-in tiny/small models."""
