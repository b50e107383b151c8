"""`StopRule` (one request's stop tokens and strings) and `StopStringMatcher` (detokenization).

Stop token ids and EOS end a completion when sampled; the token is kept. Stop strings are
matched in the detokenized completion (the model's ``tokenizer.json``, special tokens rendered,
so ``"<|im_end|>"`` works as a string too); the completion keeps every token up to and including
the one that completed the string, since a token-level API cannot cut inside a token (the
caller's renderer strips the text). Only a window of trailing tokens is decoded per step: a
string of n UTF-8 bytes ends inside the last n tokens (every token carries ≥ 1 byte), and an
occurrence that ended earlier would have stopped the sequence earlier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from loraplex.domain.sampling import StopCondition

#: Tokens decoded beyond the stop string's byte length (a partial UTF-8 character at the start
#: of the window decodes to U+FFFD, which no stop string can match into).
WINDOW_SLACK = 4


@dataclass(frozen=True)
class StopRule:
    """What ends one request's completions besides the length limit.

    Attributes:
        token_ids: sampled tokens that stop (stop ids, plus EOS unless ``stop=[]``).
        strings: stop strings, matched in the detokenized completion.
        window: trailing tokens decoded to look for ``strings``.
    """

    token_ids: frozenset[int]
    strings: tuple[str, ...]
    window: int

    @staticmethod
    def of(stop: StopCondition, eos_token_ids: Iterable[int]) -> StopRule:
        ids = set(stop.token_ids) | (set(eos_token_ids) if stop.use_eos else set())
        window = max((len(s.encode()) for s in stop.strings), default=0) + WINDOW_SLACK
        return StopRule(frozenset(ids), stop.strings, window)


class StopStringMatcher:
    """Detokenizes completion tails with the model's tokenizer (loaded lazily, once)."""

    def __init__(self, model_dir: str | Path) -> None:
        self._path = Path(model_dir) / "tokenizer.json"
        self._tokenizer: Tokenizer | None = None

    @property
    def is_available(self) -> bool:
        return self._path.is_file()

    def matches(self, completions: Sequence[Sequence[int]], rules: Sequence[StopRule]
                ) -> list[bool]:
        """Whether each completion's tail contains one of its rule's stop strings."""
        if not completions:
            return []
        tails = [list(c[-r.window:]) for c, r in zip(completions, rules, strict=True)]
        texts = self._decoder().decode_batch(tails, skip_special_tokens=False)
        return [any(s in text for s in r.strings) for text, r in zip(texts, rules, strict=True)]

    def _decoder(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_file(str(self._path))
        return self._tokenizer
