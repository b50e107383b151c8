"""GGUF file → model directory: the serving form (config + tokenizer + a pointer to the file,
weights dequantised from it at every load) and the exported form (`import_gguf`: a plain HF
directory with ``model.safetensors`` that transformers and PEFT load).

Both check the architecture and every tensor's type first (a clear error before the slow
tokenizer rebuild), write beside the target and rename it into place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from loraplex.engine.builtin.tokenizer import save_tokenizer
from loraplex.engine.gguf.config import generation_eos_ids, hf_config
from loraplex.engine.gguf.tokenizer import gguf_tokenizer
from loraplex.engine.model.checkpoint import save_weights
from loraplex.engine.model.gguf_weights import (
    POINTER_FILE,
    architecture,
    check_tensors,
    load_gguf_weights,
    open_reader,
)
from loraplex.engine.model.spec import ModelSpec
from loraplex.errors import user_error


def import_gguf(gguf_path: str | Path, directory: str | Path,
                dtype: torch.dtype = torch.float32) -> Path:
    """Write a standalone HF model directory (config, generation config, tokenizer with chat
    template, ``model.safetensors`` in ``dtype``) for a GGUF file.

    Raises:
        UserError: unsupported file, or a non-empty target directory.
    """
    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        raise user_error("directory", f"{target} exists and is not empty")
    return _write(Path(gguf_path), target, dtype)


def ensure_gguf_model_dir(gguf_path: str | Path, directory: str | Path) -> Path:
    """The serving directory of a GGUF file, (re)made when absent or the file has changed."""
    gguf_path, target = Path(gguf_path).resolve(), Path(directory)
    pointer = target / POINTER_FILE
    if pointer.is_file() and json.loads(pointer.read_text()) == _stat_record(gguf_path):
        return target
    return _write(gguf_path, target, None)


def _stat_record(gguf_path: Path) -> dict[str, object]:
    if not gguf_path.is_file():
        raise user_error("model", f"{gguf_path}: no such GGUF file")
    stat = gguf_path.stat()
    return {"gguf_file": str(gguf_path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _write(gguf_path: Path, target: Path, dtype: torch.dtype | None) -> Path:
    """Weights copied in ``dtype``, or referenced (``dtype`` None)."""
    from transformers import GenerationConfig

    reader = open_reader(gguf_path)
    architecture(reader, gguf_path)
    check_tensors(reader, gguf_path)
    staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        config = hf_config(reader, gguf_path)
        config.save_pretrained(str(staging))
        GenerationConfig(bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id,
                         eos_token_id=generation_eos_ids(reader)).save_pretrained(str(staging))
        save_tokenizer(gguf_tokenizer(gguf_path, reader), staging)
        spec = ModelSpec.from_dir(staging)
        _drop_tokens_past_vocab(staging, spec.vocab_size)
        if dtype is None:
            (staging / POINTER_FILE).write_text(json.dumps(_stat_record(gguf_path)) + "\n")
        else:
            weights = load_gguf_weights(gguf_path, spec, torch.device("cpu"), dtype)
            save_weights(staging, spec, weights)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _drop_tokens_past_vocab(directory: Path, vocab_size: int) -> None:
    """Remove added tokens with ids the model has no rows for: transformers' GPT-2 tokenizer
    class appends its default ``<|endoftext|>`` when the vocabulary lacks it (Llama 3 GGUFs)."""
    path = directory / "tokenizer.json"
    state = json.loads(path.read_text())
    kept = [token for token in state["added_tokens"] if token["id"] < vocab_size]
    if len(kept) != len(state["added_tokens"]):
        state["added_tokens"] = kept
        path.write_text(json.dumps(state, ensure_ascii=False, indent=2) + "\n")
