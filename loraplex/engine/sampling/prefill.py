"""`PrefillItem` and the prefill forward: one sequence's share of a prefill, the hidden states
of the positions it needs logits for, and those logits window by window.

`prefill_hidden` runs the items' uncached tokens through the model (writing their KV pages) and
keeps the hidden states of each item's `PrefillItem.head_positions` only; `head_windows` turns
them into logits at most `rows_per_window` rows at a time, so an 8,192-token prompt whose
logprobs are asked for never holds ``[8192 × vocab]`` (`score_and_sample_rows` walks those
windows, keeping each finished item's sampling row); `score_rows` turns scored positions'
logits into logprobs with the training forward's arithmetic, and `score_prompt_window` adds
a request's alternative draws (`SampleWork.prompt_alt_tokens_k`). A long prompt is prefilled
in pieces (`PrefillItem.end`): each piece attends to the pages the earlier pieces wrote, with
the same bits as one forward (attention computes each query row alone). Knows nothing about
admission, page allocation or stopping (`PrefillPlanner` and the `Sampler` decide those).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from loraplex.engine.model.head_chunks import rows_per_window
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.stage_pipe import StagePipe
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.lora_stacks import LoraStacks
from loraplex.engine.sampling.random_stream import uniforms
from loraplex.engine.sampling.sequence import SampleRequest, SampleSequence
from loraplex.engine.sampling.token_sampler import draw_alternatives


@dataclass(eq=False)
class PrefillItem:
    """One sequence's share of a prefill forward.

    Attributes:
        seq: computes ``seq.tokens[start:stop]``; when that reaches its last token, samples
            its next token from the last row.
        start: positions before it come from cached pages (or earlier pieces).
        forks: fresh samples that share its prompt pages and first-token distribution.
        first_scored: first prompt position to score (``len(prompt)``: none).
        end: where this piece stops (None: at the sequence's end).
        is_first_piece: no earlier piece of this item ran.
    """

    seq: SampleSequence
    start: int
    forks: list[SampleSequence] = field(default_factory=list)
    first_scored: int = 0
    end: int | None = None
    is_first_piece: bool = True

    @property
    def stop(self) -> int:
        return len(self.seq.tokens) if self.end is None else self.end

    @property
    def is_final(self) -> bool:
        """This piece computes the sequence's last token (it samples the next one)."""
        return self.stop == len(self.seq.tokens)

    @property
    def head_positions(self) -> range:
        """Positions whose logits are needed: scored prompt positions' predecessors, and the
        last position when the piece reaches it."""
        last = len(self.seq.tokens) - 1
        return range(max(self.start, min(self.first_scored - 1, last)), self.stop)

    @property
    def num_scored_rows(self) -> int:
        """Head rows that score a prompt token (all but the sampling row)."""
        return len(self.head_positions) - (1 if self.is_final else 0)

    def rest(self) -> PrefillItem:
        """The item's next piece (after this one ran)."""
        return PrefillItem(self.seq, self.stop, self.forks, self.first_scored,
                           is_first_piece=False)


def prefill_hidden(model: Transformer, stacks: LoraStacks, kv: PagedKVCache,
                   items: list[PrefillItem], pipe: StagePipe | None = None
                   ) -> torch.Tensor | None:
    """Forward the items' pieces (writing their KV into ``kv``); the hidden states ``[N, D]``
    of their `head_positions`, concatenated in item order (None on a pipeline stage before
    the last: it runs its layers and passes them on)."""
    batch = model.pack([SequenceInput(it.seq.tokens[it.start:it.stop],
                                      it.seq.request.work.adapter_id, it.start,
                                      it.seq.block_table, state_key=it.seq,
                                      images=model.image_spans(it.seq.request.work.images))
                        for it in items])
    with torch.no_grad():
        lora = stacks.for_batch(batch)
        if pipe is None:
            hidden_R_D = model.forward(batch, lora, kv)
        else:
            hidden_R_D = pipe.run_layers(model, batch, lora, kv)[1]
            if not pipe.is_last:
                return None
    rows = [batch.seq_row_start[i] + p - it.start
            for i, it in enumerate(items) for p in it.head_positions]
    return hidden_R_D.index_select(0, torch.tensor(rows, dtype=torch.long,
                                                   device=hidden_R_D.device))


def head_windows(model: Transformer, stacks: LoraStacks, items: list[PrefillItem],
                 head_N_D: torch.Tensor, max_rows: int | None = None
                 ) -> Iterator[tuple[int, torch.Tensor]]:
    """``(first head row, logits [w, V])`` of at most ``max_rows`` head rows at a time. Each
    window's rows are re-packed as a batch of their own (rows padded to the row multiple,
    adapter segments, unembed LoRA): the same bits as in a full forward."""
    max_rows = max_rows or rows_per_window(model.spec.vocab_size,
                                           model.options.effective_row_multiple)
    spans: list[tuple[int, int, str | None]] = []  # (first row, rows, adapter) per item
    offset = 0
    for it in items:
        n = len(it.head_positions)
        spans.append((offset, n, it.seq.request.work.adapter_id))
        offset += n
    for start in range(0, offset, max_rows):
        end = min(offset, start + max_rows)
        parts = [(max(a, start), min(a + n, end), adapter) for a, n, adapter in spans
                 if max(a, start) < min(a + n, end)]
        head = model.pack([SequenceInput([0] * (b - a), adapter) for a, b, adapter in parts])
        with torch.no_grad():
            head_R_D = head.scatter_to_rows(head_N_D[start:end])
            yield start, head.gather_from_rows(model.logits(head_R_D, stacks.for_batch(head)))


def score_and_sample_rows(model: Transformer, stacks: LoraStacks, items: list[PrefillItem],
                          head_N_D: torch.Tensor) -> dict[int, torch.Tensor]:
    """Score the items' prompt positions, one head window at a time; the logits row each
    final item samples from, by item index."""
    firsts, offset = [], 0
    for it in items:
        firsts.append(offset)
        offset += len(it.head_positions)
    sample_logits: dict[int, torch.Tensor] = {}
    for w0, logits_W_V in head_windows(model, stacks, items, head_N_D):
        w1 = w0 + logits_W_V.shape[0]
        for i, (it, first) in enumerate(zip(items, firsts, strict=True)):
            lo, hi = max(first, w0), min(first + it.num_scored_rows, w1)
            if lo < hi:
                score_prompt_window(it.seq.request, it.seq.tokens,
                                    it.head_positions[lo - first:hi - first],
                                    logits_W_V[lo - w0:hi - w0])
            last = first + len(it.head_positions) - 1
            if it.is_final and w0 <= last < w1:
                sample_logits[i] = logits_W_V[last - w0].clone()
    return sample_logits


def score_prompt_window(request: SampleRequest, tokens: list[int], positions: range,
                        logits_N_V: torch.Tensor) -> None:
    """Give ``request`` what it asked of these prompt positions' logits (row ``n`` predicts
    ``tokens[positions[n] + 1]``): the scores of positions from its `first_scored`, and its
    alternative draws at all of them (counter ``p · k + j`` of its stream: the same bits
    whatever the window or batch)."""
    work = request.work
    skip = max(0, min(len(positions), request.first_scored - 1 - positions.start))
    if skip < len(positions) and (work.prompt_logprobs or work.topk_prompt_logprobs):
        targets = [tokens[p + 1] for p in positions[skip:]]
        request.add_prompt_scores(*score_rows(logits_N_V[skip:], targets,
                                              work.topk_prompt_logprobs))
    k = work.prompt_alt_tokens_k
    if k:
        u = uniforms(request.alt_stream, positions.start * k, len(positions) * k)
        tokens_N_K, logprobs_N_K = draw_alternatives(
            logits_N_V, work.params.temperature,
            torch.from_numpy(u).view(len(positions), k).to(logits_N_V.device))
        request.add_alt_draws(tokens_N_K.reshape(-1).tolist(),
                              logprobs_N_K.reshape(-1).tolist())


def score_rows(logits_N_V: torch.Tensor, targets: list[int], k: int
               ) -> tuple[list[float], list[tuple[list[int], list[float]]]]:
    """The logprob (and top ``k`` alternatives) of each target from its predecessor's logits:
    the training forward's row-local log_softmax, in fp32."""
    logprobs_N_V = torch.log_softmax(logits_N_V.to(torch.float32), dim=-1)
    targets_N = torch.tensor(targets, device=logits_N_V.device)
    chosen = logprobs_N_V.gather(1, targets_N[:, None]).squeeze(1).tolist()
    if not k:
        return chosen, []
    top_lp, top_ids = logprobs_N_V.topk(k, dim=-1)
    return chosen, list(zip(top_ids.tolist(), top_lp.tolist(), strict=True))
