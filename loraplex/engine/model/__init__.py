"""Base-model code: HF checkpoint loading, the Qwen3/Llama transformer over packed sequences,
batch-invariant paged attention, and the built-in tiny/small models.

Entry points: `loader.load_model(dir, EngineConfig) -> Transformer`; `Transformer.pack(
[SequenceInput]) -> PackedBatch`, `.forward(batch, lora, kv) -> hidden rows`, `.logits`,
`.token_logprobs`; `kv_cache.PagedKVCache.allocate`; `builtin.create_builtin_model`.
Refuses to know about adapters' storage, losses, optimizers, block allocation or tenants.
"""
