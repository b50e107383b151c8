"""Sampling: paged KV cache with prefix sharing, logits processing, continuous-batching sampler."""
