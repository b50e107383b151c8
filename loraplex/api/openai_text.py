"""Text ↔ tokens for the OpenAI-compatible routes: the served model's own ``tokenizer.json`` and
its chat template (``chat_template.jinja``, as transformers ≥ 4.43 saves it, else the
``chat_template`` of ``tokenizer_config.json``), rendered the way transformers'
``apply_chat_template`` renders it (a sandboxed Jinja environment, ``trim_blocks`` and
``lstrip_blocks``, the template's special tokens encoded as themselves).

Loaded lazily once per model directory (`ModelTexts`, held by the app). Knows nothing of HTTP.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from loraplex.errors import UserError, user_error
from loraplex.scheduler.catalog import ServedModel

CHARS_PER_TOKEN_BOUND = 32
"""A prompt of more than ``max_context × 32`` characters cannot fit the context (tokens of
more than 32 characters are rare, and such text is refused without being encoded)."""
MAX_REQUEST_CHARS = 4_000_000
"""Most characters of text one request may make the server encode or render (all prompts or
messages together): about a million tokens."""

HOLD = "\ufffd"
"""What a byte-level decoder yields for an incomplete UTF-8 sequence: held back until the next
token completes it."""


class ModelText:
    """One model directory's tokenizer and chat template.

    Args:
        model_dir: holds ``tokenizer.json`` (required) and ``tokenizer_config.json``.
    """

    def __init__(self, model_dir: str) -> None:
        from tokenizers import Tokenizer

        directory = Path(model_dir)
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        self._config: dict[str, Any] = (json.loads(config_path.read_text())
                                        if config_path.exists() else {})
        template_path = directory / "chat_template.jinja"
        if template_path.exists():
            self._config["chat_template"] = template_path.read_text()

    def encode(self, text: str) -> list[int]:
        """A completion prompt: the tokenizer's own special tokens added (a BOS where the
        model has one), as transformers' ``tokenizer(text)`` does."""
        return self.encode_as(text, add_special_tokens=True)

    def encode_as(self, text: str, add_special_tokens: bool) -> list[int]:
        """``/tokenize``: the text's tokens, the tokenizer's special tokens added or not."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens))

    def chat_text(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                  template_kwargs: dict[str, Any] | None = None) -> str:
        """The chat template rendered (what `chat_prompt` encodes)."""
        if self._template is None:
            raise user_error("messages", "the model's tokenizer has no chat template")
        try:
            return str(self._template.render(**{**(template_kwargs or {}),
                                                **self._special_tokens(), "messages": messages,
                                                "add_generation_prompt": add_generation_prompt}))
        except UserError:
            raise
        except Exception as exc:  # a template error is the messages' fault (raise_exception)
            raise user_error("messages", f"the chat template rejects them: {exc}") from None

    def info(self) -> dict[str, Any]:
        """``/tokenizer_info``: the tokenizer config's fields (special tokens as strings, the
        chat template), as vLLM serves them."""
        out: dict[str, Any] = {k: v for k, v in self._config.items()
                               if isinstance(v, (str, int, float, bool))}
        out.update(self._special_tokens())
        template = self._config.get("chat_template")
        out["chat_template"] = template if isinstance(template, str) else None
        return out

    def token_text(self, token: int) -> str:
        """One token's text (special tokens kept), for logprob entries."""
        return str(self._tokenizer.decode([token], skip_special_tokens=False))

    def chat_prompt(self, messages: list[dict[str, str]],
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """The template rendered with ``add_generation_prompt`` (and ``template_kwargs``, e.g.
        Qwen3's ``enable_thinking``), then encoded without adding special tokens (the template
        writes them), as ``apply_chat_template`` does.

        Raises:
            UserError: the model has no chat template, or the template rejects the messages.
        """
        if self._template is None:
            raise user_error("model", "the model's tokenizer has no chat template; use "
                             "/v1/completions")
        return self.encode_as(self.chat_text(messages, True, template_kwargs), False)

    def _special_tokens(self) -> dict[str, str]:
        out = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = self._config.get(name)
            if isinstance(value, dict):  # an AddedToken as saved by older transformers
                value = value.get("content")
            if isinstance(value, str):
                out[name] = value
        return out

    @cached_property
    def _template(self) -> Any:
        source = self._config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"),
                          None)
        if not isinstance(source, str):
            return None
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # Llama 3.1
        return env.from_string(source)

    def text_deltas(self, tokens: Sequence[int]) -> list[str]:
        """One text piece per token whose concatenation is the decoded completion; a token
        that ends mid-character gets ``""`` and its text arrives with the token completing it
        (`TextDeltas`); the last token carries whatever is still held."""
        stream = TextDeltas(self)
        deltas = [stream.push(token) for token in tokens]
        if deltas and stream.num_committed < len(tokens):  # cut mid-character: flush it
            deltas[-1] = stream.flush()
        return deltas


class TextDeltas:
    """Incremental detokenization (vLLM's prefix and read offsets): `push` one token at a time
    and get the text it adds. A token that ends mid-character adds ``""``; its text arrives
    with the token that completes it. Each piece depends only on the tokens pushed so far."""

    def __init__(self, text: ModelText) -> None:
        self._text = text
        self._tokens: list[int] = []
        self._prefix_at = self._read_at = 0

    @property
    def num_committed(self) -> int:
        """Leading tokens whose text is final (the rest are held mid-character)."""
        return self._read_at

    def push(self, token: int) -> str:
        self._tokens.append(token)
        prefix = self._text.decode(self._tokens[self._prefix_at:self._read_at])
        text = self._text.decode(self._tokens[self._prefix_at:])
        if len(text) > len(prefix) and not text.endswith(HOLD):
            self._prefix_at, self._read_at = self._read_at, len(self._tokens)
            return text[len(prefix):]
        return ""

    def flush(self) -> str:
        """The held text (replacement characters for an incomplete one) the pieces since the
        last committed token did not carry."""
        prefix = self._text.decode(self._tokens[self._prefix_at:self._read_at])
        return self._text.decode(self._tokens[self._prefix_at:])[len(prefix):]


def _raise_template_error(message: str) -> None:
    raise user_error("messages", str(message))


class ModelTexts:
    """`ModelText` per served model, loaded on first use (a tokenizer takes ~100 ms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_dir: dict[str, ModelText] = {}

    def of(self, served: ServedModel) -> ModelText:
        """Raises UserError when the model has no tokenizer to turn text into tokens."""
        directory = served.model_dir
        if directory is None or not (Path(directory) / "tokenizer.json").exists():
            raise user_error("model", f"{served.name!r} has no tokenizer.json on this server; "
                             "the OpenAI-compatible routes need one")
        with self._lock:
            text = self._by_dir.get(directory)
            if text is None:
                text = self._by_dir[directory] = ModelText(directory)
            return text


def check_text_budget(texts: Sequence[str], max_context: int, field: str) -> None:
    """Refuse, before any encoding, text that cannot fit the context (per item) or that is more
    than a request may make the server tokenize (`MAX_REQUEST_CHARS` together).

    Raises:
        UserError: naming ``field`` (``field[i]`` for the item over the bound).
    """
    bound = max_context * CHARS_PER_TOKEN_BOUND
    for i, text in enumerate(texts):
        if len(text) > bound:
            where = field if len(texts) == 1 else f"{field}[{i}]"
            raise user_error(where, f"{len(text)} characters cannot fit the context of "
                             f"{max_context} tokens")
    total = sum(len(t) for t in texts)
    if total > MAX_REQUEST_CHARS:
        raise user_error(field, f"{total} characters in one request; at most "
                         f"{MAX_REQUEST_CHARS}")
