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
Which prompt work each prefill forward takes is `PrefillPlanner`'s; the prefill forward itself
is `prefill`, each next token's draw and stop check `next_token`. Never loads an adapter (the
engine makes requests' adapters resident before admitting them); knows nothing about HTTP,
tenants, sequence ids or stability records.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.config import EngineConfig
from loraplex.domain.results import SampleOutcome
from loraplex.domain.sampling import SequenceDelta, StopReason
from loraplex.domain.work import SampleWork
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import PackedBatch, SequenceInput
from loraplex.engine.model.stage_pipe import StagePipe
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.kv_budget import kv_cache_blocks
from loraplex.engine.sampling.kv_pool import KVPool
from loraplex.engine.sampling.lora_stacks import AdapterVersions, LoraStacks
from loraplex.engine.sampling.next_token import draw_next_tokens, record_next_tokens
from loraplex.engine.sampling.prefill import PrefillItem, prefill_hidden, score_and_sample_rows
from loraplex.engine.sampling.prefill_planner import PrefillPlanner
from loraplex.engine.sampling.random_stream import PROMPT_ALT_STREAM, stream_key
from loraplex.engine.sampling.sequence import SampleRequest, SampleSequence, prefix_key
from loraplex.engine.sampling.step_share import SHARED_STEPS_PER_CALL, StepShare
from loraplex.engine.sampling.stop_rule import StopRule, StopStringMatcher
from loraplex.engine.sampling.validation import SampleLimits, check_sample_work
from loraplex.errors import LoraplexError, NotFoundError


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
                 model_dir: str, pipe: StagePipe | None = None) -> None:
        """Args:
            model: the frozen base model (its compute options decide invariant vs fast mode).
            bank: resident adapters; sampled rows read their LoRA from here. The sampler never
                loads one: the caller makes a request's adapter resident before admitting it
                (`Engine.sample_step`), and a request whose adapter is not fails alone.
            config: the engine slice (kv_block_size, the KV cache's size, max_context).
            model_dir: the model directory; ``tokenizer.json`` there detokenizes stop strings.
            pipe: a pipeline stage's links (None: one device). Every stage runs this same
                bookkeeping; the last stage draws the tokens and broadcasts them.
        """
        self._model = model
        self._bank = bank
        self._pipe = pipe
        block_size = model.options.kv_block_size
        num_blocks = kv_cache_blocks(config.kv_cache_blocks, config.kv_cache_memory, model.spec,
                                     len(model.spec.attention_layers), block_size,
                                     model.device, model.dtype)
        self.pool = KVPool(model.spec, num_blocks, block_size, model.device, model.dtype)
        self._stop_strings = StopStringMatcher(model_dir)
        info = model.model_info(config.max_context)
        self._eos_token_ids = info.eos_token_ids
        self.limits = SampleLimits(
            vocab_size=info.vocab_size,
            max_context=min(info.max_context, num_blocks * block_size),
            num_blocks=num_blocks, block_size=block_size,
            has_tokenizer=self._stop_strings.is_available)
        self._versions = AdapterVersions(bank)
        self._stacks = LoraStacks(bank, self._versions, model.rank_multiple, model.dtype)
        self._requests: dict[str, SampleRequest] = {}
        self._running: list[SampleSequence] = []  # (re)admission order: last = newest
        self._num_admitted = 0
        self._share = StepShare(config.sample_shared_decode_kv_tokens,
                                config.sample_shared_prefill_tokens,
                                config.sample_shared_linger_steps)
        self._planner = PrefillPlanner(self.pool, self._versions, self._share,
                                       config.sample_prefill_tokens_per_step)
        self.stats = SamplerStats()

    # ---- public surface ------------------------------------------------------------------

    def step(self, admit: Sequence[SampleWork], max_decode_steps: int) -> list[SampleOutcome]:
        """Admit ``admit`` (validate, prefill), run up to ``max_decode_steps`` decode steps for
        every running sequence, and return finished requests ``(request_id, outcome)``.

        A request that fails validation or whose adapter is not resident is returned at once
        with its error; requests that do not finish keep running on the next call. An
        unexpected exception (a bug) drops every request and the prefix cache, then propagates.
        """
        finished: list[SampleOutcome] = []
        self._planner.prefilled = 0
        try:
            for work in admit:
                rejected = self._admit(work)
                if rejected is not None:
                    finished.append(rejected)
            finished += self._fail_lost_adapters()
            finished += self._prefill_waiting()
            for i in range(max_decode_steps):
                if not self._running:
                    break
                tenants = self._tenants_running() if self._share.shared else set()
                finished += self._decode()
                if self._planner.has_work:
                    finished += self._prefill_waiting()
                if self._share.shared and (i + 1 >= SHARED_STEPS_PER_CALL
                                           or tenants - self._tenants_running()):
                    break  # a tenant's last result leaves now; a new request joins soon
        except Exception:
            self._reset()
            raise
        return finished

    def cancel(self, request_ids: Sequence[str], error: LoraplexError) -> list[SampleOutcome]:
        """Drop the named requests wherever they are (their KV pages are freed at once);
        their outcomes are ``error``. Ids not running here (finished meanwhile) are skipped."""
        return [self._abort(self._requests[rid], error) for rid in dict.fromkeys(request_ids)
                if rid in self._requests]

    def progress(self) -> list[SequenceDelta]:
        """New completion tokens of the running requests that stream (``work.stream``)."""
        deltas = (seq.take_delta() for request in self._requests.values() if request.work.stream
                  for seq in request.sequences)
        return [d for d in deltas if d is not None]

    def num_running(self) -> int:
        """Requests admitted (running, or waiting for KV pages) and not yet returned."""
        return len(self._requests)

    def adapter_ids(self) -> list[str]:
        """Adapters of the admitted requests, in admission order: they must be resident for
        the next `step`."""
        return list(dict.fromkeys(r.work.adapter_id for r in self._requests.values()
                                  if r.work.adapter_id is not None))

    def drop_stacks(self, adapter_id: str) -> None:
        """Forget stacked LoRA tensors of ``adapter_id`` (it paged out, so that memory is
        freed). Its version and cached prefix pages stay valid: it comes back bit for bit."""
        self._stacks.drop(adapter_id)

    def invalidate_adapter(self, adapter_id: str) -> None:
        """Forget cached prefix pages and LoRA stacks of ``adapter_id``: the engine calls this
        when the adapter is deleted or its weights change (optim_step on a live id, load).
        Running sequences keep their pages."""
        self._versions.bump(adapter_id)
        self.pool.blocks.invalidate(adapter_id)
        self._stacks.drop(adapter_id)

    # ---- admission -----------------------------------------------------------------------

    def _admit(self, work: SampleWork) -> SampleOutcome | None:
        """Queue a request; its outcome instead when it is done at once (an error, or nothing
        to compute)."""
        try:
            check_sample_work(work, self.limits)
            adapter_key = self._versions.key(work.adapter_id)  # NotFoundError: not resident
            self._model.image_spans(work.images)  # decoded and encoded once, here
        except LoraplexError as exc:
            return work.request_id, exc
        params = work.params
        room = self.limits.max_context - len(work.prompt)
        max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        self._num_admitted += 1
        request = SampleRequest(work, prefix_key(adapter_key, work), max_new,
                                StopRule.of(params.stop, self._eos_token_ids), self._num_admitted)
        seed = secrets.randbits(63) if params.seed is None else params.seed
        prompt = list(work.prompt)
        request.sequences = [SampleSequence(request, i, list(prompt), stream_key(seed, i))
                             for i in range(work.num_samples)]
        request.alt_stream = stream_key(seed, PROMPT_ALT_STREAM)
        if max_new == 0 and request.first_head == request.num_prompt:
            for seq in request.sequences:
                seq.stop_reason = "length"
            return work.request_id, request.result()
        self._requests[work.request_id] = request
        self._planner.waiting.append(request)
        return None

    def _fail_lost_adapters(self) -> list[SampleOutcome]:
        """Requests whose adapter left the bank fail alone (their pages are released)."""
        failed: list[SampleOutcome] = []
        for request in list(self._requests.values()):
            adapter_id = request.work.adapter_id
            if adapter_id is None or adapter_id in self._bank:
                continue
            error = NotFoundError(f"adapter {adapter_id!r} was unloaded while sampling",
                                  field="adapter_id")
            failed.append(self._abort(request, error))
        return failed

    def _abort(self, request: SampleRequest, error: LoraplexError) -> SampleOutcome:
        """Drop a request wherever it is (its pages are released); its failed outcome."""
        for seq in request.sequences:
            self.pool.release(seq)
        members = set(request.sequences)
        self._running = [s for s in self._running if s not in members]
        self._planner.drop(request)
        del self._requests[request.work.request_id]
        return request.work.request_id, error

    def _reset(self) -> None:
        """Forget everything after a bug: no page content or refcount can be trusted."""
        self.pool.reset()
        self._stacks = LoraStacks(self._bank, self._versions, self._model.rank_multiple,
                                  self._model.dtype)
        self._requests.clear()
        self._planner.reset()
        self._running = []

    # ---- prefill -------------------------------------------------------------------------

    def _prefill_waiting(self) -> list[SampleOutcome]:
        """Prefill forwards until nothing waiting fits (FIFO: resumed sequences first) or,
        while sequences are decoding, until this step's prefill budget is spent (while
        several tenants sample, also this decode step's `StepShare` budget)."""
        finished: list[SampleOutcome] = []
        spent = 0
        while True:
            limit = self._planner.limit(self._running, spent)
            # A spent limit still takes short prompts (`PrefillPlanner.plan`).
            items, rejected = self._planner.plan(len(self._running), limit)
            finished += [self._abort(request, error) for request, error in rejected]
            if not items:
                return finished
            computed = sum(it.stop - it.start for it in items)
            self._planner.prefilled += computed
            spent += computed
            finished += self._run_prefill(items)

    def _run_prefill(self, items: list[PrefillItem]) -> list[SampleOutcome]:
        """One forward over the items' pieces; score prompts window by window; sample the
        first tokens of the items that reached their last token."""
        for it in items:
            self.stats.prefill_tokens += it.stop - it.start
            if it.is_first_piece:
                self.stats.cached_tokens += it.start
            if it.is_final:
                self.stats.cached_tokens += len(it.forks) * len(it.seq.tokens)
        self.pool.prepare_forward()
        head_N_D = prefill_hidden(self._model, self._stacks, self.pool.kv, items, self._pipe)
        for it in items:
            it.seq.num_computed = it.stop
            if it.is_final:
                for seq in it.forks:
                    seq.num_computed = it.seq.num_computed
            else:
                self._planner.partial = it
        self.pool.copy_partial_pages([(it.seq, f) for it in items if it.is_final
                                      for f in it.forks])
        sample_logits = ({} if head_N_D is None
                         else score_and_sample_rows(self._model, self._stacks, items, head_N_D))
        finished: list[SampleOutcome] = []
        samplers: list[SampleSequence] = []
        rows: list[torch.Tensor] = []
        for i, it in enumerate(items):
            if not it.is_final:
                continue
            for seq in [it.seq, *it.forks]:
                if seq.request.max_new > 0:
                    samplers.append(seq)
                    if head_N_D is not None:
                        rows.append(sample_logits[i])
                elif (outcome := self._finish(seq, "length")) is not None:
                    finished.append(outcome)
        self._running.extend(samplers)
        if samplers:
            finished += self._take_tokens(samplers, torch.stack(rows) if rows else None)
        return finished

    # ---- decode --------------------------------------------------------------------------

    def _decode(self) -> list[SampleOutcome]:
        """One decode step: every running sequence (while several tenants sample, those
        `StepShare` picks) feeds its last token, then samples."""
        self._grow_tables()
        self.pool.prepare_forward()
        seqs = self._share.decode_set(self._running, self._planner.queued())
        model = self._model
        batch = model.pack([SequenceInput([s.tokens[-1]], s.request.work.adapter_id,
                                          s.num_computed, s.block_table, state_key=s,
                                          images=model.image_spans(s.request.work.images))
                            for s in seqs])
        self.stats.decode_steps += 1
        self.stats.decode_tokens += len(seqs)
        with torch.no_grad():
            lora = self._stacks.for_batch(batch)
            hidden_R_D = self._layers(batch, lora)
            logits = (None if hidden_R_D is None else
                      _sequence_rows(model.logits(hidden_R_D, lora), batch.seq_row_start))
        size = self.pool.block_size
        for seq in seqs:
            seq.num_computed += 1
            if seq.num_computed % size == 0:
                self.pool.register_full_pages(seq, seq.num_computed)
        return self._take_tokens(list(seqs), logits)

    def _tenants_running(self) -> set[str]:
        return {seq.request.work.tenant for seq in self._running}

    def _layers(self, batch: PackedBatch, lora: LoraBatch | None) -> torch.Tensor | None:
        """The forward's hidden states; None on a pipeline stage before the last (it runs
        its layers and passes them on)."""
        if self._pipe is None:
            return self._model.forward(batch, lora, self.pool.kv)
        _, hidden_R_D = self._pipe.run_layers(self._model, batch, lora, self.pool.kv)
        return hidden_R_D if self._pipe.is_last else None

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
                self._planner.resume.appendleft(victim)
            else:
                self.pool.grow(seq)
                i += 1

    # ---- per-token bookkeeping -----------------------------------------------------------

    def _take_tokens(self, seqs: list[SampleSequence], logits_B_V: torch.Tensor | None
                     ) -> list[SampleOutcome]:
        """Sample one token per sequence, record it, and stop the sequences that are done;
        the requests that finished with them."""
        stopped = record_next_tokens(seqs, draw_next_tokens(seqs, logits_B_V, self._pipe),
                                     self._stop_strings)
        finished = [o for seq, reason in stopped if (o := self._finish(seq, reason)) is not None]
        self._running = [s for s in self._running if s.stop_reason is None]
        return finished

    def _finish(self, seq: SampleSequence, reason: StopReason) -> SampleOutcome | None:
        """Stop a sequence and release its pages (registered full pages stay cached); the
        request's outcome when it was the request's last running sequence."""
        seq.stop_reason = reason
        self.pool.release(seq)
        request = seq.request
        if not request.is_finished:
            return None
        del self._requests[request.work.request_id]
        return request.work.request_id, request.result()


def _sequence_rows(logits_R_V: torch.Tensor, row_start: tuple[int, ...]) -> torch.Tensor:
    """The logits rows of the sequences ``[B, V]``: a view when they are the first B rows in
    order (the usual decode layout), else a gathered copy."""
    if row_start == tuple(range(len(row_start))):
        return logits_R_V[:len(row_start)]
    return logits_R_V.index_select(0, torch.tensor(row_start, device=logits_R_V.device))
