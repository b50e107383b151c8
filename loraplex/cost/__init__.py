"""Cost model: FLOP and time accounting, model and hardware cards, dated Tinker price sheets,
workload presets and the per-token vs GPU-hour calculator. Pure functions, no I/O; imports only
the domain, the errors and the standard library.

Layers, bottom up: ``cards`` (models, hardware) → ``flops`` → ``memory`` → ``timing`` → ``step``;
``pricing`` + ``price_sheets``; ``workloads`` + ``presets`` → ``calculator`` → ``seed_table``,
``report``. Metering prices `pricing.TokenUsage` with `pricing.price_usage`; a measured machine is
`cards.hardware.HardwareCard.custom`, a loaded model `cards.models.card_from_model_info`.
"""
