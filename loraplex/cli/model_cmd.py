"""`loraplex model create-tiny | info | cache-tokenizer`: built-in models, facts, tokenizers.

``create-tiny DIR [--arch qwen3|llama|qwen3_moe] [--size tiny|small] [--seed N]`` writes a
random model (HF safetensors + config.json) and a locally trained tokenizer, without network:
``tiny`` (≤ 1M parameters) for tests, ``small`` (≈ 20M, 4 layers, hidden 512, vocab 8k) for
benchmarks; ``qwen3_moe``: the same with 8 routed experts (top-2) in every layer.
``info DIR`` prints the model facts the server would report, as JSON.
``import-gguf FILE DIR [--dtype float32|bfloat16|float16]`` writes a GGUF file (Llama or Qwen3
family) as a plain HF directory: config, generation config, tokenizer and chat template rebuilt
from its metadata, weights dequantised into ``model.safetensors``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from loraplex.engine.model.family import FAMILIES

#: ``--arch`` choices: every family with built-in models (`Family.builtin`).
BUILTIN_ARCHES = tuple(arch for arch, f in FAMILIES.items() if f.builtin is not None)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="create built-in models, inspect model dirs",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="model_command", required=True)
    create = verbs.add_parser("create-tiny", help="write a random built-in model + tokenizer")
    create.add_argument("directory", metavar="DIR", help="target directory (absent or empty)")
    create.add_argument("--arch", choices=BUILTIN_ARCHES, default="qwen3")
    create.add_argument("--size", choices=("tiny", "small"), default="tiny")
    create.add_argument("--seed", type=int, default=0, help="weights and tokenizer seed")
    create.set_defaults(func=_create)
    info = verbs.add_parser("info", help="print a model directory's facts as JSON")
    info.add_argument("directory", metavar="DIR")
    info.set_defaults(func=_info)
    gguf = verbs.add_parser("import-gguf", help="write a GGUF file as an HF model directory")
    gguf.add_argument("file", metavar="FILE", help="the .gguf file")
    gguf.add_argument("directory", metavar="DIR", help="target directory (absent or empty)")
    gguf.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                      help="dtype of the written weights (dequantised values are fp32)")
    gguf.set_defaults(func=_import_gguf)
    from loraplex.cli.hf_cache import register_cache_tokenizer

    register_cache_tokenizer(verbs)


def _create(args: argparse.Namespace) -> int:
    from loraplex.engine.builtin.model import create_builtin_model
    from loraplex.engine.model.spec import ModelSpec

    path = create_builtin_model(args.directory, args.arch, args.size, args.seed)
    spec = ModelSpec.from_dir(path)
    print(f"wrote {args.size} {args.arch} model ({spec.num_params():,} parameters, "
          f"vocab {spec.vocab_size}) to {path}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from loraplex.engine.model.spec import ModelSpec

    info = ModelSpec.from_dir(args.directory).model_info()
    print(json.dumps({"vocab_size": info.vocab_size, **dataclasses.asdict(info)}, indent=2))
    return 0


def _import_gguf(args: argparse.Namespace) -> int:
    import torch

    from loraplex.engine.gguf.model_dir import import_gguf
    from loraplex.engine.model.spec import ModelSpec

    path = import_gguf(args.file, args.directory, getattr(torch, args.dtype))
    spec = ModelSpec.from_dir(path)
    print(f"wrote {spec.arch} model ({spec.num_params():,} parameters, vocab {spec.vocab_size}, "
          f"{args.dtype}) from {args.file} to {path}")
    return 0
