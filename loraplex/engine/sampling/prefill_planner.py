"""`PrefillPlanner`: the sampler's prompt work still to compute, and which of it the next prefill
forward takes (the admission policy).

It holds the admitted requests whose prompt is not computed yet, the preempted sequences to
recompute, and a long sequence's piece in progress; each `plan` picks the next forward's items
and allocates their pages (`KVPool`), forking same-prompt requests from one item. Knows nothing
about the forward itself (`prefill`), decoding or stopping (the `Sampler` runs those).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from loraplex.engine.sampling.kv_pool import KVPool
from loraplex.engine.sampling.lora_stacks import AdapterVersions
from loraplex.engine.sampling.prefill import PrefillItem
from loraplex.engine.sampling.sequence import SampleRequest, SampleSequence, prefix_key
from loraplex.engine.sampling.step_share import StepShare
from loraplex.errors import LoraplexError

#: Prompt tokens per prefill forward (more waiting requests run in further forwards; a longer
#: sequence is prefilled in pieces).
MAX_PREFILL_TOKENS = 4096
#: The smallest piece a long sequence is cut to when less of a forward's budget is left.
MIN_PREFILL_PIECE = 512
#: Prompts this short may be admitted past a sequence waiting for pages.
SHORT_PROMPT = 512


@dataclass
class _Draft:
    """The prefill forward being planned.

    Attributes:
        budget: tokens it may still take; strict: the budget is a caller's limit.
        reserve: pages that must stay free (one per sequence running or taken so far).
        items: its pieces; rejected: requests whose adapter is gone, with their errors.
        parents: the fresh items by (adapter key, prompt): equal requests fork from them.
        blocked: a sequence ahead did not fit: only short prompts may pass it.
    """

    budget: int
    strict: bool
    reserve: int
    items: list[PrefillItem] = field(default_factory=list)
    rejected: list[tuple[SampleRequest, LoraplexError]] = field(default_factory=list)
    parents: dict[tuple[str, tuple[int, ...]], PrefillItem] = field(default_factory=dict)
    blocked: bool = False

    def add(self, item: PrefillItem) -> None:
        self.items.append(item)
        self.budget -= item.stop - item.start


class PrefillPlanner:
    """Queues of prompt work and the choice of each prefill forward's items.

    Args:
        pool: the KV pages the planned items are allocated from.
        versions: adapter versions (a request's prefix-cache key when it is planned).
        share: the step's share while several tenants sample (the sampler's own).
        prefill_per_step: prompt tokens a step prefills while sequences decode.
    """

    def __init__(self, pool: KVPool, versions: AdapterVersions, share: StepShare,
                 prefill_per_step: int) -> None:
        self._pool = pool
        self._versions = versions
        self._share = share
        self.waiting: deque[SampleRequest] = deque()  # admitted, prompt not yet computed
        self.resume: deque[SampleSequence] = deque()  # preempted, to be recomputed
        self.partial: PrefillItem | None = None  # a long sequence's piece in progress
        self._prefill_per_step = max(MIN_PREFILL_PIECE, prefill_per_step)
        self.prefilled = 0  # prompt tokens computed in the current step
        self._min_piece = MIN_PREFILL_PIECE  # the shortest piece `cut` makes now

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.resume or self.partial is not None)

    def queued(self) -> list[SampleRequest]:
        """Requests with prompt tokens still to compute (`StepShare` counts their tenants)."""
        partial = [self.partial.seq.request] if self.partial is not None else []
        return [*self.waiting, *partial, *(seq.request for seq in self.resume)]

    def drop(self, request: SampleRequest) -> None:
        """Forget ``request`` wherever it waits (the caller releases its pages)."""
        members = set(request.sequences)
        self.resume = deque(s for s in self.resume if s not in members)
        if request in self.waiting:
            self.waiting.remove(request)
        if self.partial is not None and self.partial.seq.request is request:
            self.partial = None

    def reset(self) -> None:
        """Forget every queue (after a bug)."""
        self.waiting.clear()
        self.resume.clear()
        self.partial = None

    def limit(self, running: Sequence[SampleSequence], spent: int) -> int | None:
        """Prompt tokens the next prefill forward may compute (None: no bound); sets the
        shortest piece a long prompt is cut to. While tenants share the sampler even a step
        with nothing decoding prefills one short forward: another tenant's next request
        should not find a long one in progress."""
        self._min_piece = MIN_PREFILL_PIECE
        limit = self._prefill_per_step - self.prefilled if running else None
        if not self._share.refresh(running, self.queued()):
            return limit
        if not running and spent == 0:
            self._share.tick()  # a prefill-only forward is a step of the linger too
        self._min_piece = max(1, min(MIN_PREFILL_PIECE, self._share.prefill_tokens))
        shared = self._share.prefill_tokens - spent
        return shared if limit is None else min(limit, shared)

    def plan(self, num_running: int, limit: int | None = None
             ) -> tuple[list[PrefillItem], list[tuple[SampleRequest, LoraplexError]]]:
        """Pick and allocate the next prefill forward's sequences (the admission policy), and
        the requests rejected on the way (their adapter is gone; taken off the queue, for the
        caller to abort).

        A sequence is admitted when its pages fit while leaving one free page per running
        sequence (each may need one for its next token); a sequence that does not fit blocks
        the longer prompts behind it, so admission stays FIFO among them, while requests of at
        most `SHORT_PROMPT` tokens may pass it (a short sample beside a heavy sampler waits
        for a few pages, not for the heavy requests to finish). A forward takes about
        `MAX_PREFILL_TOKENS`: a sequence with more uncomputed tokens than that is prefilled in
        pieces, one per forward (the piece in progress goes first). Fresh requests whose
        adapter version and prompt equal an item of this forward fork from it instead of
        computing anything. ``limit``: at most this many tokens (pieces cut to fit); prompts
        of at most `SHORT_PROMPT` tokens are taken past it (they cost little and would
        otherwise wait a whole step behind a long prompt's pieces).
        """
        draft = _Draft(MAX_PREFILL_TOKENS if limit is None else min(MAX_PREFILL_TOKENS, limit),
                       limit is not None, num_running)
        if self._take_partial(draft) and self._take_resumed(draft):
            self._take_waiting(draft)
        return draft.items, draft.rejected

    def cut(self, item: PrefillItem, budget: int, strict: bool = False) -> PrefillItem:
        """``item`` as a piece of at most ``max(budget, MIN_PREFILL_PIECE)`` tokens (while
        several tenants sample, the `StepShare` prefill budget instead of the minimum) when it has
        more than `MAX_PREFILL_TOKENS` (``strict``: more than ``budget``); it then stays in
        progress (`partial`)."""
        remaining = item.stop - item.start
        if strict and budget <= 0:
            # A short prompt taken past a spent budget: whole (a piece would be a second
            # partial, and the one in progress would be dropped).
            return item
        piece = max(budget, self._min_piece)
        if remaining <= (piece if strict else MAX_PREFILL_TOKENS):
            return item
        item.end = item.start + piece
        return item

    def _take_partial(self, draft: _Draft) -> bool:
        """The piece in progress goes first; False: it fills the forward."""
        if self.partial is None or draft.budget <= 0:
            return True
        item, self.partial = self.partial.rest(), None
        draft.add(self.cut(item, draft.budget, draft.strict))
        draft.reserve += item.seq.request.work.num_samples
        return item.is_final

    def _take_resumed(self, draft: _Draft) -> bool:
        """Preempted sequences, FIFO, while their pages fit; False: a piece fills the forward."""
        while self.resume and draft.budget > 0:
            seq = self.resume[0]
            if not self._pool.try_allocate(seq, len(seq.tokens) - 1, 0, draft.reserve):
                draft.blocked = True
                return True
            self.resume.popleft()
            item = self.cut(PrefillItem(seq, seq.num_computed, first_scored=len(seq.tokens)),
                            draft.budget, draft.strict)
            draft.add(item)
            draft.reserve += 1
            if not item.is_final:
                return False
        return True

    def _take_waiting(self, draft: _Draft) -> None:
        """Waiting requests in order, short prompts past the ones that do not fit."""
        for request in list(self.waiting):
            if (draft.blocked or draft.budget <= 0) and request.num_prompt > SHORT_PROMPT:
                continue
            try:
                request.adapter_key = prefix_key(self._versions.key(request.work.adapter_id),
                                                 request.work)
            except LoraplexError as exc:
                self.waiting.remove(request)
                draft.rejected.append((request, exc))
                continue
            if not self._place(draft, request):
                draft.blocked = True
                continue
            self.waiting.remove(request)
            draft.reserve += request.work.num_samples
            if not draft.items[-1].is_final:
                break

    def _place(self, draft: _Draft, request: SampleRequest) -> bool:
        """Fork ``request`` from an equal item of this forward, or allocate its pages and add
        its item; False (nothing taken) when its pages do not fit."""
        group = (request.adapter_key, tuple(request.work.prompt))
        parent = draft.parents.get(group) if request.first_head == request.num_prompt else None
        if parent is not None:
            if not self._pool.try_fork(parent.seq, request.sequences, draft.reserve):
                return False
            parent.forks.extend(request.sequences)
            request.cache_hit_tokens = request.num_prompt
            return True
        seq, forks = request.sequences[0], request.sequences[1:]
        if not self._pool.try_allocate(seq, request.first_head - 1, len(forks), draft.reserve):
            return False
        self._pool.try_fork(seq, forks, 0)
        item = self.cut(PrefillItem(seq, seq.num_computed, list(forks), request.first_head),
                        draft.budget, draft.strict)
        draft.add(item)
        draft.parents.setdefault(group, item)
        request.cache_hit_tokens = seq.num_computed
        return True
