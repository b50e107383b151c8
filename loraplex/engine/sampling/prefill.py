"""`PrefillItem` and the prefill forward: one sequence's share of a prefill, the logits of the
positions it needs, and the scores of its prompt tokens.

`prefill_logits` runs the items' uncached tokens through the model (writing their KV pages) and
returns the logits of each item's `PrefillItem.head_positions` only; `score_prompt` turns the
logits of scored prompt positions into logprobs with the training forward's arithmetic. Knows
nothing about admission, page allocation or stopping (the `Sampler` decides those).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.lora_stacks import LoraStacks
from loraplex.engine.sampling.sequence import SampleSequence


@dataclass(eq=False)
class PrefillItem:
    """One sequence's share of a prefill forward.

    Attributes:
        seq: computes ``seq.tokens[start:]`` and samples its next token from the last row.
        start: positions before it come from cached pages.
        forks: fresh samples that share its prompt pages and first-token distribution.
        first_scored: first prompt position to score (``len(prompt)``: none).
    """

    seq: SampleSequence
    start: int
    forks: list[SampleSequence] = field(default_factory=list)
    first_scored: int = 0

    @property
    def head_positions(self) -> range:
        """Positions whose logits are needed: scored prompt positions' predecessors + last."""
        last = len(self.seq.tokens) - 1
        return range(min(self.first_scored - 1, last), last + 1)


def prefill_logits(model: Transformer, stacks: LoraStacks, kv: PagedKVCache,
                   items: list[PrefillItem]) -> torch.Tensor:
    """Forward the items (writing their KV into ``kv``), then logits ``[N, V]`` of their
    `head_positions` only, concatenated in item order. The head rows are re-packed as a batch
    of their own (rows padded to the row multiple, adapter segments, unembed LoRA): the same
    bits as in a full forward."""
    batch = model.pack([SequenceInput(it.seq.tokens[it.start:], it.seq.request.work.adapter_id,
                                      it.start, it.seq.block_table) for it in items])
    with torch.no_grad():
        hidden_R_D = model.forward(batch, stacks.for_batch(batch), kv)
        rows = [batch.seq_row_start[i] + p - it.start
                for i, it in enumerate(items) for p in it.head_positions]
        head = model.pack([SequenceInput([0] * len(it.head_positions),
                                         it.seq.request.work.adapter_id) for it in items])
        head_R_D = head.scatter_to_rows(hidden_R_D.index_select(
            0, torch.tensor(rows, device=hidden_R_D.device)))
        return head.gather_from_rows(model.logits(head_R_D, stacks.for_batch(head)))


def score_prompt(item: PrefillItem, logits_N_V: torch.Tensor) -> None:
    """Record the logprob (and top alternatives) of prompt tokens ``first_scored ..`` from the
    logits of their predecessors: the training forward's row-local log_softmax, in fp32."""
    request = item.seq.request
    targets = torch.tensor(item.seq.tokens[item.first_scored:], device=logits_N_V.device)
    logprobs_N_V = torch.log_softmax(logits_N_V.to(torch.float32), dim=-1)
    chosen = logprobs_N_V.gather(1, targets[:, None]).squeeze(1).tolist()
    k = request.work.topk_prompt_logprobs
    topk: list[tuple[list[int], list[float]]] = []
    if k:
        top_lp, top_ids = logprobs_N_V.topk(k, dim=-1)
        topk = list(zip(top_ids.tolist(), top_lp.tolist(), strict=True))
    request.set_prompt_scores(chosen, topk)
