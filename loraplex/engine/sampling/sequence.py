"""`SampleRequest` (one admitted asample) and `SampleSequence` (one of its samples).

A sequence's tokens are the prompt followed by its completion. Between steps a running
sequence has the KV of every token but the last sampled one (``num_computed == len(tokens) - 1``):
the next forward feeds that token and yields the logits of the next. A preempted sequence keeps
its tokens, logprobs and random stream and drops its blocks (``num_computed == 0``); resuming
recomputes its KV (bitwise the same in batch-invariant mode), mostly from the prefix cache.
`prefix_key` is the key a request's pages are cached under.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from loraplex.domain.sampling import (
    PromptAltTokens,
    SampledSequence,
    SampleResult,
    SequenceDelta,
    StopReason,
    TopkLogprobs,
)
from loraplex.domain.work import SampleWork
from loraplex.engine.sampling.stop_rule import StopRule

#: The SDK's empty top-k slot: (token 0, logprob -99999.0).
TOPK_SENTINEL = (0, -99999.0)


@dataclass(eq=False)
class SampleSequence:
    """One sample of a request.

    Attributes:
        request: the owning request.
        index: sample index within the request (its random stream derives from it).
        tokens: prompt + completion so far.
        stream: key of its counter-based random stream.
        block_table: KV pages covering positions ``0 .. len(tokens)-1`` as they are written.
        block_hashes: chain hashes of its leading full pages (prefix-cache identities).
        num_computed: positions whose KV is in the cache.
        logprobs, topk_ids, topk_logprobs: per completion token.
        stop_reason: set once finished.
        reported: completion tokens already handed out as `SequenceDelta`s (streaming).
        decoded_at: the sampler step it last decoded in (`StepShare` serves the longest
            waiting first).
    """

    request: SampleRequest
    index: int
    tokens: list[int]
    stream: int
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed: int = 0
    logprobs: list[float] = field(default_factory=list)
    topk_ids: list[list[int]] = field(default_factory=list)
    topk_logprobs: list[list[float]] = field(default_factory=list)
    stop_reason: StopReason | None = None
    reported: int = 0
    decoded_at: int = 0

    @property
    def num_completion(self) -> int:
        return len(self.tokens) - self.request.num_prompt

    @property
    def completion(self) -> list[int]:
        return self.tokens[self.request.num_prompt:]

    def take_delta(self) -> SequenceDelta | None:
        """The completion tokens sampled since the last call (None: none)."""
        start, end = self.reported, self.num_completion
        if end == start:
            return None
        self.reported = end
        k = self.request.work.topk_sample_logprobs
        topk = None
        if k:
            topk = TopkLogprobs(k, end - start,
                                array("i", [t for row in self.topk_ids[start:] for t in row]),
                                array("f", [lp for row in self.topk_logprobs[start:]
                                            for lp in row]))
        first = self.request.num_prompt + start
        return SequenceDelta(self.request.work.request_id, self.index, start,
                             array("i", self.tokens[first:]), array("f", self.logprobs[start:]),
                             topk)

    def result(self) -> SampledSequence:
        assert self.stop_reason is not None
        k = self.request.work.topk_sample_logprobs
        topk = None
        if k:
            topk = TopkLogprobs(k, len(self.topk_ids),
                                array("i", [t for row in self.topk_ids for t in row]),
                                array("f", [lp for row in self.topk_logprobs for lp in row]))
        return SampledSequence(array("i", self.completion), array("f", self.logprobs),
                               self.stop_reason, topk)


@dataclass(eq=False)
class SampleRequest:
    """One admitted request.

    Attributes:
        work: the request as submitted.
        adapter_key: prefix-cache key of the adapter version it samples (``base``: no adapter).
        max_new: completion length limit (``max_tokens`` bounded by the context).
        stop: its stop tokens and strings.
        order: admission counter (later requests are preempted first).
        sequences: its samples, in sample order.
        prompt_logprobs, topk_prompt: filled by the prefill that scores the prompt.
        cache_hit_tokens: prompt tokens whose KV was not computed for this request.
        scored, scored_topk: prompt scores gathered so far (a long prompt's are computed
            window by window, over several prefill forwards).
        alt_stream: key of the random stream of its prompt-alternative draws.
        alt_tokens, alt_logprobs: those draws so far, row-major ``[positions, k]``.
    """

    work: SampleWork
    adapter_key: str
    max_new: int
    stop: StopRule
    order: int
    sequences: list[SampleSequence] = field(default_factory=list)
    prompt_logprobs: array | None = None
    topk_prompt: TopkLogprobs | None = None
    cache_hit_tokens: int = 0
    scored: list[float] = field(default_factory=list)
    scored_topk: list[tuple[list[int], list[float]]] = field(default_factory=list)
    alt_stream: int = 0
    alt_tokens: array = field(default_factory=lambda: array("q"))
    alt_logprobs: array = field(default_factory=lambda: array("f"))

    @property
    def num_prompt(self) -> int:
        return len(self.work.prompt)

    @property
    def first_scored(self) -> int:
        """First prompt position whose logprob is returned (``num_prompt``: none)."""
        w = self.work
        if not (w.prompt_logprobs or w.topk_prompt_logprobs):
            return self.num_prompt
        if w.prompt_logprobs_last_n is None:
            return 1
        return max(1, self.num_prompt - w.prompt_logprobs_last_n)

    @property
    def first_head(self) -> int:
        """First prompt position whose predecessor's logits the prefill computes: 1 for
        alternative draws (every position), else `first_scored`."""
        return 1 if self.work.prompt_alt_tokens_k else self.first_scored

    @property
    def is_finished(self) -> bool:
        return all(s.stop_reason is not None for s in self.sequences)

    def add_prompt_scores(self, logprobs: list[float],
                          topk: list[tuple[list[int], list[float]]]) -> None:
        """Scores of the next scored prompt positions (a prefill window's share); the last
        ones complete `prompt_logprobs` / `topk_prompt`."""
        self.scored += logprobs
        self.scored_topk += topk
        if len(self.scored) == self.num_prompt - self.first_scored:
            self.set_prompt_scores(self.scored, self.scored_topk)
            self.scored, self.scored_topk = [], []

    def set_prompt_scores(self, logprobs: list[float], topk: list[tuple[list[int], list[float]]]
                          ) -> None:
        """Scores of prompt positions ``first_scored ..`` (logprob of the token there, and the
        top alternatives); earlier positions get NaN and sentinel rows."""
        num_unscored = self.num_prompt - len(logprobs)
        if self.work.prompt_logprobs:
            self.prompt_logprobs = array("f", [math.nan] * num_unscored + logprobs)
        k = self.work.topk_prompt_logprobs
        if k:
            ids = array("i", [TOPK_SENTINEL[0]] * (k * num_unscored))
            lps = array("f", [TOPK_SENTINEL[1]] * (k * num_unscored))
            for row_ids, row_lps in topk:
                ids.extend(row_ids[:k])
                lps.extend(row_lps[:k])
            self.topk_prompt = TopkLogprobs(k, self.num_prompt, ids, lps)

    def add_alt_draws(self, tokens: list[int], logprobs: list[float]) -> None:
        """The alternative draws of the next prompt positions (row-major, k per position)."""
        self.alt_tokens.extend(tokens)
        self.alt_logprobs.extend(logprobs)

    def result(self) -> SampleResult:
        k = self.work.prompt_alt_tokens_k
        alt = None
        if k:  # every row on the stage that computes the head; none on a stage before it
            alt = PromptAltTokens(k, len(self.alt_tokens) // k, self.alt_tokens,
                                  self.alt_logprobs)
        return SampleResult(tuple(s.result() for s in self.sequences), self.prompt_logprobs,
                            self.topk_prompt, self.cache_hit_tokens, alt)


def prefix_key(adapter_key: str, work: SampleWork) -> str:
    """A request's prefix-cache key: its adapter version's, and its images' digests (equal
    placeholder tokens of other images must never share pages)."""
    if not work.images:
        return adapter_key
    return adapter_key + "|images:" + ",".join(i.digest for i in work.images)
