"""Base-model code: HF checkpoint loading, the Qwen3/Llama transformer over packed sequences,
batch-invariant paged attention, and the per-segment LoRA delta it applies.

Entry points: `loader.load_model(dir, EngineConfig) -> Transformer`; `Transformer.pack(
[SequenceInput]) -> PackedBatch`, `.forward(batch, lora, kv) -> hidden rows`, `.logits`,
`.token_logprobs`; `kv_cache.PagedKVCache.allocate`; `lora_batch.LoraBatch` (what `forward`
takes as ``lora``). Refuses to know about adapters' storage (`engine.lora` builds the
`LoraBatch`, and nothing here imports it), losses, optimizers, block allocation or tenants.
"""
