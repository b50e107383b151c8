"""Cost model: FLOP and time accounting, model and hardware cards, dated Tinker price sheets,
workload presets, the per-token vs GPU-hour calculator and the billing of metered usage. Pure
functions, no I/O; imports only the domain, the errors, the config and the standard library.

Layers, bottom up: ``cards`` (models, hardware) → ``flops`` → ``memory`` → ``timing`` → ``step``;
``pricing`` + ``price_sheets``; ``workloads`` + ``presets`` → ``calculator`` → ``seed_table``,
``report``. ``billing`` prices metered usage (`pricing.TokenUsage`, `pricing.price_usage`); a
measured machine is `cards.hardware.HardwareCard.custom`, a loaded model its `ModelInfo.card`.
"""
