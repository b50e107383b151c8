"""LoRA adapters as data: per-adapter tensors at exact rank (`adapter`), a bank of them by id
(`bank`), and the per-batch stack of a batch's adapters (`stacking`).

Entry points: `AdapterBank.create/get/delete/snapshot`, `AdapterBank.stack(batch, ...) ->
LoraBatch` (`engine.model.lora_batch`, passed to `Transformer.forward`),
`LoraAdapter.named_parameters` (optimizer and checkpoint order) and `peft_state_dict` (PEFT /
Tinker cookbook key names). Imports point one way: `lora` → `model`, never back.
"""
