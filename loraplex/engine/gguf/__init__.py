"""GGUF files as model sources: metadata → config, tokenizer and chat template; the serving
directory (weights read from the file at load) and the ``import-gguf`` export.

Weights themselves are read by `loraplex.engine.model.gguf_weights` (the loader needs them).
"""
