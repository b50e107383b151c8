"""The `small` benchmark weights both servers load: loraplex's built-in, or an equivalent.

Prefers `loraplex.engine.model.builtin.create_builtin_model(dir, "qwen3", "small", 0)`; while that
does not exist, writes an equivalent random Qwen3 (4 layers, hidden 512, 8 heads / 4 KV heads of
64, MLP 1536, vocab 8192, tied embeddings, ≈ 17 M params) with `transformers` and a byte-level BPE
tokenizer trained locally with `tokenizers` (no hub access). Needs torch, so run it with
loraplex's venv, not a peer's.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

SMALL_VOCAB = 8192
TOKENIZER_VOCAB = 2048  # the tokenizer covers ids < 2048; the embedding has 8192 rows


def ensure_small_model(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """Create the small model under `directory` unless a config.json is already there."""
    out = Path(directory).resolve()
    if (out / "config.json").exists():
        return out
    try:
        from loraplex.engine.model.builtin import create_builtin_model
    except ImportError:
        _write_equivalent_small_qwen3(out, seed)
    else:
        create_builtin_model(str(out), "qwen3", "small", seed)
    return out


def _train_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
             "answer", "question", "number", "banana", "coffee", "split", "break", "model"]
    corpus = [" ".join(words[(i * k) % len(words)] for k in range(1, 12)) + f" {i} "
              + string.ascii_letters for i in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                     pad_token="<|endoftext|>")
    hf_tok.save_pretrained(str(out))
    return int(hf_tok.eos_token_id)


def _write_equivalent_small_qwen3(out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    eos_id = _train_tokenizer(out)
    config = Qwen3Config(vocab_size=SMALL_VOCAB, hidden_size=512, intermediate_size=1536,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None,
                         dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)  # float32: the config dtype
    model.save_pretrained(str(out), safe_serialization=True)
    num_params = sum(p.numel() for p in model.parameters())
    (out / "benchmark_model.json").write_text(json.dumps(
        {"source": "benchmarks.peers.small_model (stand-in for loraplex builtin:small)",
         "num_params": num_params, "seed": seed}))
