"""The torch data plane: one frozen base model, many LoRA adapters, packed forward/backward,
losses, per-adapter AdamW, the KV-cache sampler and checkpoint IO.

Refuses to know about HTTP, SQLite, tenants as users, or scheduling policy: tensors and domain
objects in, domain results out. It implements `loraplex.scheduler.executor.BatchExecutor`
structurally, without importing it.
"""
