"""`Sampler`: continuous batching of sample requests over a paged KV cache with prefix sharing.

Each `step` admits new requests (validated; a bad one fails alone), prefills the prompt tokens
that no cached page covers, then runs decode steps in which ONE forward carries every running
sequence of every adapter and of the bare base model (LoRA applied per row as in training).
Prefix sharing: the G samples of a request, and same-step requests with the same adapter
version and prompt, are one prefill whose pages the others reference (the partial last page is
copied, which is exact); across requests, full pages are found by hash (`BlockManager`).
Memory: pages are taken as sequences grow; when none is free the most recently admitted
sequence is preempted (pages released, recomputed later: bitwise the same in batch-invariant
mode, and its random stream is counter-based), so running sequences are never corrupted.
Knows nothing about HTTP, tenants, sequence ids or stability records.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from loraplex.config import EngineConfig
from loraplex.domain.sampling import SampleResult, StopReason
from loraplex.domain.work import SampleWork
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.kv_pool import KVPool
from loraplex.engine.sampling.lora_stacks import AdapterVersions, LoraStacks
from loraplex.engine.sampling.random_stream import stream_key, uniform
from loraplex.engine.sampling.sequence import SampleRequest, SampleSequence
from loraplex.engine.sampling.stop_rule import StopRule, StopStringMatcher
from loraplex.engine.sampling.token_sampler import RowParams, sample_tokens
from loraplex.engine.sampling.validation import SampleLimits, check_sample_work
from loraplex.errors import LoraplexError, NotFoundError

SampleOutcome = tuple[str, SampleResult | LoraplexError]

#: Prompt tokens per prefill forward (more waiting requests run in further forwards).
MAX_PREFILL_TOKENS = 4096


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


@dataclass
class SamplerStats:
    """Counters since construction (for tests, benchmarks and the stats endpoint).

    Attributes:
        prefill_tokens: prompt (or recomputed) tokens run through a prefill forward.
        cached_tokens: prompt tokens whose KV came from cached pages or a fork instead.
        decode_steps, decode_tokens: decode forwards and the sequences they carried.
        preempted: sequences whose pages were taken back to let older ones grow.
    """

    prefill_tokens: int = 0
    cached_tokens: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    preempted: int = 0


class Sampler:
    """The engine's sampling half: running requests, their KV pages, the prefix cache."""

    def __init__(self, model: Transformer, bank: AdapterBank, config: EngineConfig,
                 model_dir: str, ensure_adapter: Callable[[str, str | None], None]) -> None:
        """Args:
            model: the frozen base model (its compute options decide invariant vs fast mode).
            bank: resident adapters; sampled rows read their LoRA from here.
            config: the engine slice (kv_block_size, kv_cache_blocks, max_context).
            model_dir: the model directory; ``tokenizer.json`` there detokenizes stop strings.
            ensure_adapter: ``(adapter_id, adapter_dir)`` makes the adapter resident (loading
                it from ``adapter_dir`` if needed) or raises a `LoraplexError` that fails that
                request alone.
        """
        self._model = model
        self._bank = bank
        self._ensure_adapter = ensure_adapter
        block_size = model.options.kv_block_size
        self.pool = KVPool(model.spec, config.kv_cache_blocks, block_size, model.device,
                           model.dtype)
        self._stop_strings = StopStringMatcher(model_dir)
        info = model.model_info(config.max_context)
        self._eos_token_ids = info.eos_token_ids
        self.limits = SampleLimits(
            vocab_size=info.vocab_size,
            max_context=min(info.max_context, config.kv_cache_blocks * block_size),
            num_blocks=config.kv_cache_blocks, block_size=block_size,
            has_tokenizer=self._stop_strings.is_available)
        self._versions = AdapterVersions(bank)
        self._stacks = LoraStacks(bank, self._versions, model.rank_multiple, model.dtype)
        self._requests: dict[str, SampleRequest] = {}
        self._waiting: deque[SampleRequest] = deque()  # admitted, prompt not yet computed
        self._resume: deque[SampleSequence] = deque()  # preempted, to be recomputed
        self._running: list[SampleSequence] = []  # (re)admission order: last = newest
        self._num_admitted = 0
        self.stats = SamplerStats()

    # ---- public surface ------------------------------------------------------------------

    def step(self, admit: Sequence[SampleWork], max_decode_steps: int) -> list[SampleOutcome]:
        """Admit ``admit`` (validate, prefill), run up to ``max_decode_steps`` decode steps for
        every running sequence, and return finished requests ``(request_id, outcome)``.

        A request whose validation or adapter load fails is returned at once with its error;
        requests that do not finish keep running on the next call. An unexpected exception
        (a bug) drops every request and the prefix cache, then propagates.
        """
        finished: list[SampleOutcome] = []
        try:
            for work in admit:
                self._admit(work, finished)
            self._fail_lost_adapters(finished)
            self._prefill_waiting(finished)
            for _ in range(max_decode_steps):
                if not self._running:
                    break
                self._decode(finished)
                if self._waiting or self._resume:
                    self._prefill_waiting(finished)
        except Exception:
            self._reset()
            raise
        return finished

    def num_running(self) -> int:
        """Requests admitted (running, or waiting for KV pages) and not yet returned."""
        return len(self._requests)

    def invalidate_adapter(self, adapter_id: str) -> None:
        """Forget cached prefix pages and LoRA stacks of ``adapter_id``: the engine calls this
        when the adapter is deleted or its weights change (optim_step on a live id, load).
        Running sequences keep their pages."""
        self._versions.bump(adapter_id)
        self.pool.blocks.invalidate(adapter_id)
        self._stacks.drop(adapter_id)

    # ---- admission -----------------------------------------------------------------------

    def _admit(self, work: SampleWork, finished: list[SampleOutcome]) -> None:
        try:
            check_sample_work(work, self.limits)
            if work.adapter_id is not None:
                self._ensure_adapter(work.adapter_id, work.adapter_dir)
            adapter_key = self._versions.key(work.adapter_id)
        except LoraplexError as exc:
            finished.append((work.request_id, exc))
            return
        params = work.params
        room = self.limits.max_context - len(work.prompt)
        max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        self._num_admitted += 1
        request = SampleRequest(work, adapter_key, max_new,
                                StopRule.of(params.stop, self._eos_token_ids), self._num_admitted)
        seed = secrets.randbits(63) if params.seed is None else params.seed
        prompt = list(work.prompt)
        request.sequences = [SampleSequence(request, i, list(prompt), stream_key(seed, i))
                             for i in range(work.num_samples)]
        if max_new == 0 and request.first_scored == request.num_prompt:
            for seq in request.sequences:
                seq.stop_reason = "length"
            finished.append((work.request_id, request.result()))
            return
        self._requests[work.request_id] = request
        self._waiting.append(request)

    def _fail_lost_adapters(self, finished: list[SampleOutcome]) -> None:
        """Requests whose adapter left the bank fail alone (their pages are released)."""
        for request in list(self._requests.values()):
            adapter_id = request.work.adapter_id
            if adapter_id is None or adapter_id in self._bank:
                continue
            error = NotFoundError(f"adapter {adapter_id!r} was unloaded while sampling",
                                  field="adapter_id")
            self._abort(request, error, finished)

    def _abort(self, request: SampleRequest, error: LoraplexError,
               finished: list[SampleOutcome]) -> None:
        for seq in request.sequences:
            self.pool.release(seq)
        members = set(request.sequences)
        self._running = [s for s in self._running if s not in members]
        self._resume = deque(s for s in self._resume if s not in members)
        if request in self._waiting:
            self._waiting.remove(request)
        del self._requests[request.work.request_id]
        finished.append((request.work.request_id, error))

    def _reset(self) -> None:
        """Forget everything after a bug: no page content or refcount can be trusted."""
        self.pool.reset()
        self._stacks = LoraStacks(self._bank, self._versions, self._model.rank_multiple,
                                  self._model.dtype)
        self._requests.clear()
        self._waiting.clear()
        self._resume.clear()
        self._running = []

    # ---- prefill -------------------------------------------------------------------------

    def _prefill_waiting(self, finished: list[SampleOutcome]) -> None:
        """Prefill forwards until nothing waiting fits (FIFO: resumed sequences first)."""
        while True:
            items = self._plan_prefill(finished)
            if not items:
                return
            self._run_prefill(items, finished)

    def _plan_prefill(self, finished: list[SampleOutcome]) -> list[PrefillItem]:
        """Pick and allocate the next prefill forward's sequences (the admission policy).

        A sequence is admitted when its pages fit while leaving one free page per running
        sequence (each may need one for its next token); the queue head blocks the rest, so
        admission stays FIFO. A forward takes about `MAX_PREFILL_TOKENS` (at least one item).
        Fresh requests whose adapter version and prompt equal an item of this forward fork
        from it instead of computing anything.
        """
        items: list[PrefillItem] = []
        parents: dict[tuple[str, tuple[int, ...]], PrefillItem] = {}
        budget = MAX_PREFILL_TOKENS
        reserve = len(self._running)
        while self._resume and budget > 0:
            seq = self._resume[0]
            if not self.pool.try_allocate(seq, len(seq.tokens) - 1, 0, reserve):
                return items
            self._resume.popleft()
            items.append(PrefillItem(seq, seq.num_computed, first_scored=len(seq.tokens)))
            budget -= len(seq.tokens) - seq.num_computed
            reserve += 1
        while self._waiting and budget > 0:
            request = self._waiting[0]
            try:
                request.adapter_key = self._versions.key(request.work.adapter_id)
            except LoraplexError as exc:
                self._abort(request, exc, finished)
                continue
            group = (request.adapter_key, tuple(request.work.prompt))
            parent = parents.get(group) if request.first_scored == request.num_prompt else None
            if parent is not None:
                if not self.pool.try_fork(parent.seq, request.sequences, reserve):
                    return items
                parent.forks.extend(request.sequences)
                request.cache_hit_tokens = request.num_prompt
            else:
                seq, forks = request.sequences[0], request.sequences[1:]
                if not self.pool.try_allocate(seq, request.first_scored - 1, len(forks),
                                              reserve):
                    return items
                self.pool.try_fork(seq, forks, 0)
                item = PrefillItem(seq, seq.num_computed, list(forks), request.first_scored)
                items.append(item)
                parents.setdefault(group, item)
                request.cache_hit_tokens = seq.num_computed
                budget -= request.num_prompt - seq.num_computed
            self._waiting.popleft()
            reserve += request.work.num_samples
        return items

    def _run_prefill(self, items: list[PrefillItem], finished: list[SampleOutcome]) -> None:
        """One forward over the items' uncached tokens; score prompts; sample first tokens."""
        for it in items:
            self.stats.prefill_tokens += len(it.seq.tokens) - it.start
            self.stats.cached_tokens += it.start + len(it.forks) * len(it.seq.tokens)
        logits_H_V = self._prefill_logits(items)
        for it in items:
            it.seq.num_computed = len(it.seq.tokens)
            for seq in it.forks:
                seq.num_computed = it.seq.num_computed
        self.pool.copy_partial_pages([(it.seq, f) for it in items for f in it.forks])
        samplers: list[SampleSequence] = []
        sample_rows: list[int] = []
        offset = 0
        for it in items:
            num_head = len(it.head_positions)
            if num_head > 1:
                self._score_prompt(it, logits_H_V[offset:offset + num_head - 1])
            for seq in [it.seq, *it.forks]:
                if seq.request.max_new > 0:
                    samplers.append(seq)
                    sample_rows.append(offset + num_head - 1)
                else:
                    self._finish(seq, "length", finished)
            offset += num_head
        self._running.extend(samplers)
        if samplers:
            rows = torch.tensor(sample_rows, device=logits_H_V.device)
            self._take_tokens(samplers, logits_H_V.index_select(0, rows), finished)

    def _prefill_logits(self, items: list[PrefillItem]) -> torch.Tensor:
        """Forward the items (writing their KV), then logits of their `head_positions` only,
        concatenated in item order. The head rows are re-packed as a batch of their own (rows
        padded to 16, adapter segments, unembed LoRA): the same bits as in a full forward."""
        model = self._model
        self.pool.prepare_forward()
        batch = model.pack([SequenceInput(it.seq.tokens[it.start:], it.seq.request.work.adapter_id,
                                          it.start, it.seq.block_table) for it in items])
        with torch.no_grad():
            hidden_R_D = model.forward(batch, self._stacks.for_batch(batch), self.pool.kv)
            rows = [batch.seq_row_start[i] + p - it.start
                    for i, it in enumerate(items) for p in it.head_positions]
            head = model.pack([SequenceInput([0] * len(it.head_positions),
                                             it.seq.request.work.adapter_id) for it in items])
            head_R_D = head.scatter_to_rows(hidden_R_D.index_select(
                0, torch.tensor(rows, device=hidden_R_D.device)))
            return head.gather_from_rows(model.logits(head_R_D, self._stacks.for_batch(head)))

    def _score_prompt(self, item: PrefillItem, logits_N_V: torch.Tensor) -> None:
        """Logprob (and top alternatives) of prompt tokens ``first_scored ..`` from the logits
        of their predecessors: the training forward's row-local log_softmax, in fp32."""
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

    # ---- decode --------------------------------------------------------------------------

    def _decode(self, finished: list[SampleOutcome]) -> None:
        """One decode step: every running sequence feeds its last token, then samples."""
        self._grow_tables()
        self.pool.prepare_forward()
        seqs = self._running
        model = self._model
        batch = model.pack([SequenceInput([s.tokens[-1]], s.request.work.adapter_id,
                                          s.num_computed, s.block_table) for s in seqs])
        self.stats.decode_steps += 1
        self.stats.decode_tokens += len(seqs)
        with torch.no_grad():
            lora = self._stacks.for_batch(batch)
            logits_R_V = model.logits(model.forward(batch, lora, self.pool.kv), lora)
        rows = torch.tensor(batch.seq_row_start, device=logits_R_V.device)
        size = self.pool.block_size
        for seq in seqs:
            seq.num_computed += 1
            if seq.num_computed % size == 0:
                self.pool.register_full_pages(seq, seq.num_computed)
        self._take_tokens(list(seqs), logits_R_V.index_select(0, rows), finished)

    def _grow_tables(self) -> None:
        """A page for every running sequence whose next write starts one; when none is free,
        preempt the newest sequence (possibly the one asking) and retry."""
        i = 0
        while i < len(self._running):
            seq = self._running[i]
            if not self.pool.needs_page(seq):
                i += 1
            elif self.pool.num_free == 0:
                self.stats.preempted += 1
                victim = self._running.pop()
                self.pool.release(victim)
                self._resume.appendleft(victim)
            else:
                self.pool.grow(seq)
                i += 1

    # ---- per-token bookkeeping -----------------------------------------------------------

    def _take_tokens(self, seqs: list[SampleSequence], logits_B_V: torch.Tensor,
                     finished: list[SampleOutcome]) -> None:
        """Sample one token per sequence, record it, and stop the sequences that are done."""
        params = RowParams.build(
            [s.request.work.params.temperature for s in seqs],
            [s.request.work.params.top_k for s in seqs],
            [s.request.work.params.top_p for s in seqs],
            [uniform(s.stream, s.num_completion) for s in seqs],
            [s.request.work.topk_sample_logprobs for s in seqs], logits_B_V.device)
        sampled = sample_tokens(logits_B_V, params)
        tokens, logprobs = sampled.tokens_B.tolist(), sampled.logprobs_B.tolist()
        top_ids = sampled.topk_ids_B_K.tolist() if sampled.topk_ids_B_K is not None else None
        top_lps = (sampled.topk_logprobs_B_K.tolist()
                   if sampled.topk_logprobs_B_K is not None else None)
        check_strings: list[SampleSequence] = []
        for b, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
            seq.tokens.append(token)
            seq.logprobs.append(logprobs[b])
            k = seq.request.work.topk_sample_logprobs
            if k and top_ids is not None and top_lps is not None:
                seq.topk_ids.append(top_ids[b][:k])
                seq.topk_logprobs.append(top_lps[b][:k])
            if token in seq.request.stop.token_ids:
                self._finish(seq, "stop", finished)
            elif seq.request.stop.strings:
                check_strings.append(seq)
            elif seq.num_completion >= seq.request.max_new:
                self._finish(seq, "length", finished)
        matched = self._stop_strings.matches([s.completion for s in check_strings],
                                             [s.request.stop for s in check_strings])
        for seq, is_match in zip(check_strings, matched, strict=True):
            if is_match:
                self._finish(seq, "stop", finished)
            elif seq.num_completion >= seq.request.max_new:
                self._finish(seq, "length", finished)
        self._running = [s for s in self._running if s.stop_reason is None]

    def _finish(self, seq: SampleSequence, reason: StopReason,
                finished: list[SampleOutcome]) -> None:
        """Stop a sequence and release its pages (registered full pages stay cached)."""
        seq.stop_reason = reason
        self.pool.release(seq)
        request = seq.request
        if request.is_finished:
            del self._requests[request.work.request_id]
            finished.append((request.work.request_id, request.result()))
