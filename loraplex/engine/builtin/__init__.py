"""Built-in random models, made without network: ``tiny`` (tests) and ``small`` (benchmarks).

`model.create_builtin_model(dir, arch, size, seed)` writes a Hugging Face model directory
(seeded random weights in HF names, config, generation config) with the byte-level BPE
tokenizer that `tokenizer` trains on the text of `corpus`. Everything else reads the result
like any downloaded checkpoint (`engine.model.loader`). Knows nothing about adapters,
training or sampling.
"""
