"""Cost model: pure functions for FLOP and time accounting, model and hardware cards, dated
Tinker price sheets, workload presets and the per-token vs GPU-hour calculator. No I/O."""
