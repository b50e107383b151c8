"""Cards: what a model (architecture numbers from its public config.json) and an accelerator
(datasheet peaks, rental price) are, as frozen data. No prices per token, no workloads."""
