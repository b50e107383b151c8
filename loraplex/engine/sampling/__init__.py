"""Sampling: a continuous-batching KV-cache sampler over paged blocks with prefix sharing.

Entry point: `sampler.Sampler(model, bank, config, model_dir)` with
`.step(admit, max_decode_steps) -> [(request_id, SampleResult | LoraplexError)]` (it never
loads adapters: one not in the bank fails its request), `.num_running()` and
`.invalidate_adapter(adapter_id)` (call it whenever an adapter's weights change in place or it
is deleted). Prefill admission: `prefill_planner`; prefill forward: `prefill`; pages and prefix
cache: `block_manager`, `kv_pool`; token choice: `next_token`, `token_sampler`, `inverse_cdf`,
`random_stream`; stops: `stop_rule`. Refuses to know about HTTP, tenants, sequence ids or
stability records.
"""
