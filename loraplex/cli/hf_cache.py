"""`loraplex model cache-tokenizer NAME [--data-dir DIR] [--hf-home DIR]`: make the tokenizer of
the model served as NAME loadable offline by its catalogue name.

Installs the tokenizer files and ``config.json`` (transformers 5 reads the config before the
tokenizer) of NAME's model directory into a Hugging Face cache layout,
``HF_HOME/hub/models--Org--Name/{refs/main, snapshots/<sha>/…}``, so that
``AutoTokenizer.from_pretrained(NAME)`` — the SDK's ``get_tokenizer()`` and the cookbook's —
works with ``HF_HUB_OFFLINE=1`` (cookbook.md §0.3). Llama-3 names are installed as
``thinkingmachineslabinc/meta-llama-3-instruct-tokenizer``, the id both remap them to. NAME's
directory is the one ``loraplex serve`` last served it from (recorded in the data dir), the
built-in tiny model for the default name, a real built-in for its own name
(``HuggingFaceTB/SmolLM2-135M-Instruct``), or ``--source``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
from pathlib import Path

from loraplex.config import (
    BUILTIN_SERVED_NAMES,
    DEFAULT_MODEL_NAME,
    ServerConfig,
    default_hf_home,
)
from loraplex.errors import user_error

LLAMA3_TOKENIZER = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "config.json", "generation_config.json",
                   # an image model's processor (AutoImageProcessor: cookbook VLM renderers)
                   "preprocessor_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def register_cache_tokenizer(model_subparsers: argparse._SubParsersAction) -> None:
    """Add ``cache-tokenizer`` to the ``loraplex model`` verbs."""
    parser = model_subparsers.add_parser(
        "cache-tokenizer", help="install NAME's tokenizer into an offline HF cache",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", metavar="NAME", help="served model name, e.g. Qwen/Qwen3-8B")
    parser.add_argument("--data-dir", default=ServerConfig.data_dir, metavar="DIR",
                        help="the server's data directory")
    parser.add_argument("--hf-home", default=None, metavar="DIR",
                        help="HF cache root (default: $HF_HOME or ~/.cache/huggingface)")
    parser.add_argument("--source", default=None, metavar="SOURCE",
                        help="model dir or builtin:SIZE to take the tokenizer from (default: "
                             "what the server serves NAME from)")
    parser.add_argument("--with-weights", action="store_true",
                        help="also cache the weights (for merging adapters offline)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model_dir = model_dir_for(args.name, args.data_dir, args.source)
    repo_id = cache_repo_id(args.name)
    snapshot = install(model_dir, repo_id, args.hf_home or default_hf_home(),
                       with_weights=args.with_weights)
    print(f"cached {args.name} as {repo_id} in {snapshot}")
    return 0


def cache_repo_id(name: str) -> str:
    """The repo id the SDK and the cookbook will ask ``AutoTokenizer`` for."""
    name = name.split(":", 1)[0]
    if name.startswith(("meta-llama/Llama-3", "meta-llama/Meta-Llama-3")):
        return LLAMA3_TOKENIZER
    if name.count("/") != 1 or not all(name.split("/")):
        raise user_error("NAME", f"{name!r} is not an HF-style 'org/model' id")
    return name


def model_dir_for(name: str, data_dir: str, source: str | None) -> str:
    from loraplex.cli.model_sources import resolve_source

    if source is not None:
        return resolve_source(source, data_dir)
    from loraplex.store.stores import open_stores

    stores = open_stores(data_dir)
    try:
        served = stores.served_models.model_dir(name)
    finally:
        stores.close()
    if served is not None:
        return served
    if name == DEFAULT_MODEL_NAME:
        return resolve_source("builtin:tiny", data_dir)
    builtin = {served: source for source, served in BUILTIN_SERVED_NAMES.items()}.get(name)
    if builtin is not None:
        return resolve_source(builtin, data_dir)
    raise user_error("NAME", f"{name!r} was never served from {data_dir}; start `loraplex "
                     "serve` with it first, or pass --source")


def install(model_dir: str, repo_id: str, hf_home: str, *, with_weights: bool = False) -> Path:
    """Copy the files into ``hf_home/hub/models--…/snapshots/<sha>`` and point refs/main at it.

    The snapshot id is a content hash, so reinstalling the same files is a no-op and a changed
    tokenizer gets a new snapshot (the old one stays until the cache is cleaned).
    """
    source = Path(model_dir)
    files = sorted(p for p in source.iterdir() if p.is_file() and (
        p.name in TOKENIZER_FILES or (with_weights and p.suffix in WEIGHT_SUFFIXES)))
    if not any(p.name == "config.json" for p in files):
        raise user_error("NAME", f"{model_dir} has no config.json")
    if with_weights and not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise user_error("--with-weights", f"{model_dir} has no weight files (a GGUF source "
                         "keeps them in its file): write them out with `loraplex model "
                         "import-gguf FILE DIR` and pass --source DIR")
    digest = hashlib.sha1()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    sha = digest.hexdigest()
    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / sha
    if not snapshot.exists():
        staging = repo / "snapshots" / f".{sha}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for path in files:
            shutil.copy2(path, staging / path.name)
        staging.rename(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    return snapshot
