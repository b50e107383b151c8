"""The clamp demo: a Tinker client (official SDK only) that SFT-warm-starts and then GRPO-trains
a policy to write `clamp(x, lo, hi)`. Knows nothing of loraplex internals; `cli/demo_cmd.py`
starts the embedded server and hands this package a base URL."""
