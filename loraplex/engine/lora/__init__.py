"""LoRA adapters as data: per-adapter tensors at exact rank (`adapter`), a bank of them by id
(`bank`), and the per-batch stack applied by segment GEMMs (`lora_batch`).

Entry points: `AdapterBank.create/get/delete/snapshot`, `AdapterBank.stack(batch, ...) ->
LoraBatch` (passed to `Transformer.forward`), `LoraAdapter.named_parameters` (optimizer and
checkpoint order) and `peft_state_dict` (PEFT / Tinker cookbook key names).
"""
