"""``--model NAME=SOURCE`` sources → local model directories.

SOURCE is a local Hugging Face checkpoint directory, or ``builtin:tiny`` / ``builtin:small``:
a built-in model created on first use under ``<data_dir>/models/builtin-<size>`` (random
weights and a locally trained tokenizer, no download). ``builtin:tiny-moe`` /
``builtin:small-moe`` are the Qwen3-MoE built-ins (8 experts, top-2; the Qwen3 tokenizer).
"""

from __future__ import annotations

import os

from loraplex.errors import user_error

BUILTIN_PREFIX = "builtin:"
BUILTIN_SIZES = ("tiny", "small")
BUILTIN_ARCH = "qwen3"
#: Built-in names with an arch suffix: ``builtin:<size>-moe`` → (arch, size).
BUILTIN_VARIANTS = {f"{size}-moe": ("qwen3_moe", size) for size in BUILTIN_SIZES}
BUILTIN_SEED = 0


def builtin_dir(data_dir: str, size: str) -> str:
    return os.path.join(os.path.abspath(data_dir), "models", f"builtin-{size}")


def resolve_source(source: str, data_dir: str, *, create: bool = True) -> str:
    """The directory a SOURCE names (creating a built-in on first use).

    Raises:
        UserError: an unknown built-in, or a path that is not a model directory.
    """
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX):]
        known = [*BUILTIN_SIZES, *BUILTIN_VARIANTS]
        if name not in known:
            raise user_error("--model", f"unknown built-in {source!r}; use one of "
                             f"{[BUILTIN_PREFIX + s for s in known]}")
        arch, size = BUILTIN_VARIANTS.get(name, (BUILTIN_ARCH, name))
        directory = builtin_dir(data_dir, name)
        if create and not os.path.exists(os.path.join(directory, "config.json")):
            from loraplex.engine.builtin.model import create_builtin_model

            create_builtin_model(directory, arch, size, BUILTIN_SEED)
        return directory
    directory = os.path.abspath(os.path.expanduser(source))
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise user_error("--model", f"{source!r} is not a model directory (no config.json)")
    return directory
