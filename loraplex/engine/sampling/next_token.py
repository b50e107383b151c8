"""Each sampling sequence's next token: drawn from its logits row with its request's parameters
and random stream (`token_sampler`), recorded on the sequence, and checked against its stops.

On a pipeline the last stage draws the tokens and broadcasts them (`StagePipe.from_last`); the
other stages record the same draw. Knows nothing about pages, queues or the forward (the
`Sampler` releases the sequences that stopped and returns their requests).
"""

from __future__ import annotations

from typing import Any

import torch

from loraplex.domain.sampling import StopReason
from loraplex.engine.model.stage_pipe import StagePipe
from loraplex.engine.sampling.random_stream import uniform
from loraplex.engine.sampling.sequence import SampleSequence
from loraplex.engine.sampling.stop_rule import StopStringMatcher
from loraplex.engine.sampling.token_sampler import RowParams, sample_tokens

#: Per sequence: the token, its logprob, and (when asked for) the top ids and their logprobs.
Drawn = tuple[list[int], list[float], list[list[int]] | None, list[list[float]] | None]


def draw_next_tokens(seqs: list[SampleSequence], logits_B_V: torch.Tensor | None,
                     pipe: StagePipe | None) -> Drawn:
    """One token per sequence from its logits row (on the last pipeline stage; the others,
    whose ``logits_B_V`` is None, receive its draw): tokens, logprobs, top ids and logprobs."""
    if logits_B_V is None:
        assert pipe is not None
        drawn: Any = pipe.from_last()
        return drawn
    params = RowParams.build(
        [s.request.work.params.temperature for s in seqs],
        [s.request.work.params.top_k for s in seqs],
        [s.request.work.params.top_p for s in seqs],
        [uniform(s.stream, s.num_completion) for s in seqs],
        [s.request.work.topk_sample_logprobs for s in seqs], logits_B_V.device)
    sampled = sample_tokens(logits_B_V, params)
    out = (sampled.tokens_B.tolist(), sampled.logprobs_B.tolist(),
           sampled.topk_ids_B_K.tolist() if sampled.topk_ids_B_K is not None else None,
           (sampled.topk_logprobs_B_K.tolist()
            if sampled.topk_logprobs_B_K is not None else None))
    if pipe is not None:
        pipe.from_last(out)
    return out


def record_next_tokens(seqs: list[SampleSequence], drawn: Drawn,
                       stop_strings: StopStringMatcher
                       ) -> list[tuple[SampleSequence, StopReason]]:
    """Append each sequence's drawn token (and its logprobs); the sequences that are done,
    with why: a stop token, a stop string, or the length limit."""
    tokens, logprobs, top_ids, top_lps = drawn
    stopped: list[tuple[SampleSequence, StopReason]] = []
    check_strings: list[SampleSequence] = []
    for b, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
        seq.tokens.append(token)
        seq.logprobs.append(logprobs[b])
        k = seq.request.work.topk_sample_logprobs
        if k and top_ids is not None and top_lps is not None:
            seq.topk_ids.append(top_ids[b][:k])
            seq.topk_logprobs.append(top_lps[b][:k])
        if token in seq.request.stop.token_ids:
            stopped.append((seq, "stop"))
        elif seq.request.stop.strings:
            check_strings.append(seq)
        elif seq.num_completion >= seq.request.max_new:
            stopped.append((seq, "length"))
    matched = stop_strings.matches([s.completion for s in check_strings],
                                   [s.request.stop for s in check_strings])
    for seq, is_match in zip(check_strings, matched, strict=True):
        if is_match:
            stopped.append((seq, "stop"))
        elif seq.num_completion >= seq.request.max_new:
            stopped.append((seq, "length"))
    return stopped
