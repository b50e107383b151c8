"""A GGUF file's tokenizer metadata → a Hugging Face fast tokenizer with its chat template.

Reuses transformers' own GGUF tokenizer rebuild (``PreTrainedTokenizerFast.from_pretrained(dir,
gguf_file=…)``, what ``AutoTokenizer`` ends in, without its 6 s detour through the model-config
reader; vocabulary, merges, control and user-defined tokens, bos/eos/pad, the
``tokenizer.chat_template``, llama.cpp's split regex for the pre-tokenizers it knows). One gap
is filled here: llama.cpp's ``smollm`` pre-tokenizer (SmolLM/SmolLM2, also StarCoder, Refact,
Command-R, CodeShell, EXAONE) isolates every digit before the GPT-2 split, which transformers
leaves at the GPT-2 default (digits in runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.engine.model.gguf_index import GGUFIndex
from loraplex.engine.model.gguf_weights import field_value
from loraplex.errors import user_error

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
#: llama.cpp pre-tokenizer types that split ``\p{N}`` first, then the GPT-2 regex.
DIGIT_FIRST_PRES = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")


def gguf_tokenizer(path: str | Path, reader: GGUFIndex) -> Any:
    """The transformers fast tokenizer the file describes.

    Raises:
        UserError: the file has no tokenizer, or one transformers cannot rebuild (the message
            names ``tokenizer.ggml.model``).
    """
    from transformers import PreTrainedTokenizerFast

    kind = field_value(reader, "tokenizer.ggml.model")
    if kind is None:
        raise user_error("tokenizer.ggml.model", f"{path}: the GGUF file has no tokenizer")
    gguf_path = Path(path).resolve()
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(gguf_path.parent),
                                                            gguf_file=gguf_path.name)
    except (ValueError, KeyError, NotImplementedError) as err:
        raise user_error("tokenizer.ggml.model",
                         f"{path}: cannot rebuild its {kind!r} tokenizer: {err}") from err
    if field_value(reader, "tokenizer.ggml.pre") in DIGIT_FIRST_PRES:
        _split_digits_first(tokenizer)
    return tokenizer


def _split_digits_first(tokenizer: Any) -> None:
    from tokenizers import Regex, pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(GPT2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
