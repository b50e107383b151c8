"""`ChoiceStream` against the stream of the whole result (`openai_render.chunks`): whatever way a
completion's tokens arrive (any split into deltas, multi-byte characters cut across tokens,
stop strings, a final EOS, top-k logprobs), the chunks sent while sampling and at the end are
exactly the chunks of the whole result, and tokens do go out before the end."""

from __future__ import annotations

import itertools
import random
from array import array
from pathlib import Path
from typing import Any

import pytest

from loraplex.api import openai_render
from loraplex.api.openai_render import Kind
from loraplex.api.openai_responses import ResponseHead, wire
from loraplex.api.openai_stream import ChoiceStream
from loraplex.api.openai_text import ModelText
from loraplex.domain.sampling import (
    SampledSequence,
    SampleResult,
    SequenceDelta,
    StopReason,
    TopkLogprobs,
)

EOS = 1021
WORDS = ["héllo", " 世界", " 🎉", " naïve", " the", " cat", "\n", " ünïcödé", " ok", "!!"]
HEAD = ResponseHead(id="cmpl-test", created=0, model="m")


@pytest.fixture(scope="module")
def text(tiny_model_dir: Path) -> ModelText:
    return ModelText(str(tiny_model_dir))


def _completion(text: ModelText, rng: random.Random) -> list[int]:
    tokens: list[int] = []
    while len(tokens) < rng.randint(1, 40):
        tokens += text.encode_as(rng.choice(WORDS), False) if rng.random() < 0.7 \
            else [rng.randrange(1000)]
    return tokens


def _with_stop(text: ModelText, tokens: list[int], rng: random.Random
               ) -> tuple[list[int], list[str] | None, StopReason]:
    """The completion as the engine ends it: at the token completing a stop string (one of
    the text's own substrings, or one it never contains), at an EOS, or at the length."""
    full = text.decode(tokens)
    choice = rng.random()
    if choice < 0.4 and len(full) > 2:
        at = rng.randrange(len(full) - 1)
        stop = full[at:at + rng.randint(1, 4)]
        for t in range(len(tokens)):
            if stop in text.decode(tokens[:t + 1]):
                return tokens[:t + 1], [stop, "never-there"], "stop"
    if choice < 0.7:
        return [*tokens, EOS], None, "stop"
    return tokens, (["zzzz"] if choice < 0.85 else None), "length"


def _sequence(tokens: list[int], reason: StopReason, k: int, rng: random.Random
              ) -> SampledSequence:
    logprobs = array("f", [-rng.random() * 5 for _ in tokens])
    topk = None
    if k:
        ids = array("i", [rng.randrange(1000) for _ in range(k * len(tokens))])
        lps = array("f", [-rng.random() * 5 if rng.random() < 0.8 else -99999.0
                          for _ in range(k * len(tokens))])
        topk = TopkLogprobs(k, len(tokens), ids, lps)
    return SampledSequence(array("i", tokens), logprobs, reason, topk)


def _deltas(seq: SampledSequence, rng: random.Random) -> list[SequenceDelta]:
    """A prefix of the tokens (what arrived before the request finished) in random pieces."""
    arrived = rng.randint(0, len(seq.tokens))
    cuts = sorted({0, arrived, *(rng.randint(0, arrived) for _ in range(3))})
    out = []
    for a, b in itertools.pairwise(cuts):
        topk = None
        if seq.topk_logprobs is not None:
            k = seq.topk_logprobs.k
            topk = TopkLogprobs(k, b - a, seq.topk_logprobs.token_ids[a * k:b * k],
                                seq.topk_logprobs.logprobs[a * k:b * k])
        out.append(SequenceDelta("r", 0, a, seq.tokens[a:b], seq.logprobs[a:b], topk))
    return out


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streamed_chunks_are_the_whole_results_chunks(text: ModelText, kind: Kind) -> None:
    rng = random.Random(7 if kind == "chat" else 3)
    sent_early = 0
    for _ in range(300):
        tokens, stops, reason = _with_stop(text, _completion(text, rng), rng)
        topk_k = rng.choice([None, 0, 2])
        seq = _sequence(tokens, reason, topk_k or 0, rng)
        result = SampleResult((seq,))
        made = openai_render.choices([result], text, [EOS], stops, topk_k)
        whole = [wire(c) for c in openai_render.chunks(kind, HEAD, made, text, None)]
        whole = [c for c in whole if kind == "completion" or "role" not in c["choices"][0]["delta"]]
        stream = ChoiceStream(kind, HEAD, 0, text, stops, topk_k)
        got: list[dict[str, Any]] = []
        for delta in _deltas(seq, rng):
            got += map(wire, stream.feed(delta))
        sent_early += len(got)
        got += map(wire, stream.finish(made[0]))
        assert got == whole, (tokens, stops, reason)
    assert sent_early > 1000, "most tokens go out before the request finishes"


def test_a_token_waits_while_a_stop_string_may_begin_in_it(text: ModelText) -> None:
    tokens = text.encode_as(" the cat", False)
    stream = ChoiceStream("completion", HEAD, 0, text, [" cat sat"], None)
    sent = stream.feed(SequenceDelta("r", 0, 0, array("i", tokens), array("f", [0.0] * 2)))
    assert sent == [] and stream.num_sent == 0, "' cat' may start ' cat sat'"
    free = ChoiceStream("completion", HEAD, 0, text, None, None)
    sent = free.feed(SequenceDelta("r", 0, 0, array("i", tokens), array("f", [0.0] * 2)))
    assert [wire(c)["choices"][0]["text"] for c in sent] == [" the"], "the newest token waits"
