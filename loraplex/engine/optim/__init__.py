"""Per-adapter optimizers over adapter tensors only; the base model has no optimizer state.

`optimizer_state.OptimizerState` holds one adapter's step and moments (AdamW's two or Dimuon's
momentum; created lazily before its first step, saved, paged and restored exactly);
`adamw.adamw_step` applies one Tinker `AdamParams` step and `dimuon.dimuon_step` one
`DimuonParams` step to that adapter's tensors, returning its metrics.
"""
