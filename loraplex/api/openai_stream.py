"""A streamed choice: the sampler's new tokens → OpenAI stream chunks, while it samples.

A choice's chunks are exactly those the stream of its whole result has (`openai_render.chunks`:
one per shown token, then the finish chunk), sent earlier: a token goes out once nothing sampled
later can change how it is shown. So a token waits while its text is held mid-character (the
next token may complete it), while it is the newest one (it may be an EOS, which is not shown,
or carry text a final flush changes), and while a stop string could still begin inside it (its
text ends within the longest stop string's length − 1 of the end, or past a stop string the
text already holds: OpenAI cuts the text there). Whatever is left is sent from the final
result, rendered the same way as without ``stream``. Knows nothing of HTTP or the scheduler.
"""

from __future__ import annotations

from loraplex.api import openai_render
from loraplex.api.openai_render import Choice, Kind
from loraplex.api.openai_responses import Chunk, ResponseHead
from loraplex.api.openai_text import ModelText, TextDeltas
from loraplex.domain.sampling import SequenceDelta


class ChoiceStream:
    """One choice's tokens as they arrive, and the chunks already sent for them.

    Args:
        index: the choice's index (``prompt * n + sample``).
        stops: the request's stop strings (None: none).
        topk_k: alternatives per token asked for (None: no logprobs).
    """

    def __init__(self, kind: Kind, head: ResponseHead, index: int, text: ModelText,
                 stops: list[str] | None, topk_k: int | None) -> None:
        self._kind, self._head, self._index, self._text = kind, head, index, text
        self._stops = stops or []
        self._hold_chars = max((len(s) for s in self._stops), default=1) - 1
        self._topk_k = topk_k
        self._detok = TextDeltas(text)
        self._tokens: list[int] = []
        self._logprobs: list[float | None] = []
        self._topk: list[list[tuple[int, float]] | None] = []
        self._pieces: list[str] = []
        self._ends: list[int] = []  # text offset where each token's piece ends
        self._text_so_far = ""
        self._stop_at: int | None = None  # where the first stop string in the text begins
        self.num_sent = 0

    def feed(self, delta: SequenceDelta) -> list[Chunk]:
        """The chunks ``delta``'s tokens let go out now."""
        if delta.start != len(self._tokens):  # deltas only append; a gap is a bug upstream
            raise RuntimeError(f"choice {self._index}: tokens from {delta.start}, "
                               f"have {len(self._tokens)}")
        rows = (openai_render.topk_rows(delta.topk_logprobs, len(delta.tokens))
                if delta.topk_logprobs is not None else [None] * len(delta.tokens))
        searched = len(self._text_so_far)
        for token, logprob, row in zip(delta.tokens, delta.logprobs, rows, strict=True):
            piece = self._detok.push(int(token))
            self._tokens.append(int(token))
            self._logprobs.append(float(logprob))
            self._topk.append(row)
            self._pieces.append(piece)
            self._ends.append((self._ends[-1] if self._ends else 0) + len(piece))
        self._text_so_far += "".join(self._pieces[len(self._pieces) - len(delta.tokens):])
        self._find_stop(searched)
        return self._send(self._sendable())

    def finish(self, final: Choice) -> list[Chunk]:
        """The rest of the choice from its final rendering, and the finish chunk."""
        sent = self.num_sent
        if final.tokens[:sent] != self._tokens[:sent] or final.pieces[:sent] != \
                self._pieces[:sent]:
            raise RuntimeError(f"choice {self._index}: the final result disagrees with the "
                               f"{sent} streamed tokens")
        offset = self._ends[sent - 1] if sent else 0
        out = []
        for i in range(sent, len(final.tokens)):
            out.append(openai_render.token_chunk(self._kind, self._head, final, self._text, i,
                                                 offset))
            offset += len(final.pieces[i])
        self.num_sent = len(final.tokens)
        return [*out, openai_render.finish_chunk(self._kind, self._head, final)]

    def _find_stop(self, searched: int) -> None:
        """Look for stop strings in the text added since ``searched`` characters (and the
        stop-length tail before it)."""
        if self._stop_at is not None or not self._stops:
            return
        begin = max(0, searched - self._hold_chars)
        found = [at for s in self._stops if (at := self._text_so_far.find(s, begin)) >= 0]
        self._stop_at = min(found, default=None)

    def _sendable(self) -> int:
        """How many leading tokens may be sent (see the module docstring)."""
        limit = len(self._text_so_far) - self._hold_chars
        if self._stop_at is not None:
            limit = min(limit, self._stop_at)
        n = min(self._detok.num_committed, len(self._tokens) - 1)
        while n > self.num_sent and self._ends[n - 1] > limit:
            n -= 1
        return n

    def _send(self, upto: int) -> list[Chunk]:
        if upto <= self.num_sent:
            return []
        partial = Choice(self._index, self._tokens, self._pieces, self._logprobs,
                         self._topk if self._topk_k else None, self._topk_k, None, upto)
        out = [openai_render.token_chunk(self._kind, self._head, partial, self._text, i,
                                         self._ends[i - 1] if i else 0)
               for i in range(self.num_sent, upto)]
        self.num_sent = upto
        return out
