"""Sampling requests of every tenant: waiting → running in the engine's decode batch → done.

Admission is bounded by a KV budget: a request reserves ``prompt + num_samples × max_new``
tokens (its prompt KV is shared by its samples; ``max_new`` is ``max_tokens`` clamped to the
rest of the context, which is all a sequence can ever hold) from the moment it is admitted
until it finishes, so what the engine is handed stays within ``kv_budget_tokens`` of
worst-case sequences (the engine's own paging and preemption handle the rest) and the rest
waits here, in fair order, not in the engine's FIFO. Waiting requests are admitted by deficit
round-robin on that reservation across tenants, so one tenant's burst of rollouts cannot keep
another tenant's requests out of the decode batch. Two more bounds keep a heavy sampler from
holding others back: one step admits at most ``prefill_tokens_per_step`` prompt tokens to
prefill (the first request always; a prompt admitted recently with the same adapter counts as
none: the engine's prefix cache holds it), so a burst of long prompts is prefilled over
several steps instead of ahead of everything admitted with it; and while other tenants
sampled within the fairness window, a tenant's running requests reserve at most
``max_tenant_share`` of the budget, so another tenant's request finds room at the next step
instead of waiting for the heavy one's requests to finish. A request larger than the whole
budget is admitted alone once nothing else runs. Engine time of each decode step is shared by
the requests running in it, in proportion to their sequences.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable

from loraplex.domain.ops import WorkItem
from loraplex.scheduler.fairness import DeficitRoundRobin
from loraplex.scheduler.residency import sample_op

RECENT_PROMPTS = 1024
"""Prompts (with their adapter) remembered as admitted recently, most recent last."""


class SampleQueue:
    """Waiting and running sampling requests.

    Args:
        kv_budget_tokens: most KV tokens reserved by running requests.
        quantum: DRR credit per tenant per admission round (KV tokens).
        max_context: the model's context length (bounds ``max_new`` when unset).
        prefill_tokens_per_step: most prompt tokens admitted per step (the first always).
        max_tenant_share: most of the budget one tenant reserves while others sample.
        fair_window_s: how recently another tenant must have sampled for that cap to apply.
    """

    def __init__(self, kv_budget_tokens: int, quantum: int, max_context: int,
                 prefill_tokens_per_step: int | None = None, max_tenant_share: float = 1.0,
                 fair_window_s: float = 0.0) -> None:
        self.kv_budget_tokens = kv_budget_tokens
        self.max_context = max_context
        self.prefill_tokens_per_step = prefill_tokens_per_step or kv_budget_tokens
        self.max_tenant_share = max_tenant_share
        self.fair_window_s = fair_window_s
        self._last_seen: dict[str, float] = {}
        self._recent_prompts: OrderedDict[tuple[str | None, int], None] = OrderedDict()
        self._waiting: dict[str, deque[WorkItem]] = defaultdict(deque)
        self._running: dict[str, WorkItem] = {}
        self._reserved: dict[str, int] = {}
        self._engine_s: dict[str, float] = {}
        self._fairness = DeficitRoundRobin(quantum, cost=self.reservation)
        self.num_reserved = 0

    def reservation(self, item: WorkItem) -> int:
        """KV tokens ``item`` may occupy while it runs."""
        op = sample_op(item)
        prompt = len(op.work.prompt)
        room = max(1, self.max_context - prompt)
        max_new = op.work.params.max_tokens
        max_new = room if max_new is None else min(max_new, room)
        return prompt + op.work.num_samples * max_new

    def add(self, item: WorkItem) -> None:
        self._waiting[item.tenant].append(item)

    def has_work(self) -> bool:
        return bool(self._running) or self.num_waiting() > 0

    def num_waiting(self, tenant: str | None = None) -> int:
        if tenant is not None:
            return len(self._waiting.get(tenant, ()))
        return sum(len(q) for q in self._waiting.values())

    def num_running(self) -> int:
        return len(self._running)

    def waiting_by_tenant(self) -> Counter[str]:
        return Counter({t: len(q) for t, q in self._waiting.items() if q})

    def running_by_tenant(self) -> Counter[str]:
        return Counter(item.tenant for item in self._running.values())

    def waiting_items(self) -> list[WorkItem]:
        return [item for queue in self._waiting.values() for item in queue]

    def admit(self, is_ready: Callable[[WorkItem], bool] = lambda item: True,
              now: float = 0.0) -> list[WorkItem]:
        """Move the ready requests that fit in the KV budget (and this step's prompt tokens,
        and their tenant's share) from waiting to running (a request waiting for its adapter
        to be read is skipped, not blocking its tenant)."""
        room = self.kv_budget_tokens - self.num_reserved
        caps = self._share_caps(now)
        ready = {t: [it for it in q if is_ready(it)] for t, q in self._waiting.items()
                 if caps.get(t, 1) > 0}
        chosen = self._fairness.select(ready, room, allow_oversize=not self._running,
                                       caps={t: c for t, c in caps.items() if t in ready},
                                       also=(self._prefill_tokens,
                                             self.prefill_tokens_per_step))
        for item in chosen:
            self._remember_prompt(item)
            self._remove_waiting(item)
            self._running[item.request_id] = item
            self._reserved[item.request_id] = self.reservation(item)
            self._engine_s[item.request_id] = 0.0
            self.num_reserved += self._reserved[item.request_id]
        return chosen

    def _prefill_tokens(self, item: WorkItem) -> int:
        """Prompt tokens the engine will likely compute for ``item``: none for a prompt
        admitted recently with the same adapter (cached pages or a fork), else all."""
        return 0 if _prompt_key(item) in self._recent_prompts else _prompt_tokens(item)

    def _remember_prompt(self, item: WorkItem) -> None:
        key = _prompt_key(item)
        self._recent_prompts[key] = None
        self._recent_prompts.move_to_end(key)
        while len(self._recent_prompts) > RECENT_PROMPTS:
            self._recent_prompts.popitem(last=False)

    def _share_caps(self, now: float) -> dict[str, int]:
        """Per tenant, the KV tokens it may still reserve: ``max_tenant_share`` of the budget
        less what it holds, for the tenants another tenant sampled beside within the window
        (the others are uncapped)."""
        held: Counter[str] = Counter()
        for rid, item in self._running.items():
            held[item.tenant] += self._reserved[rid]
        for tenant in (*held, *self._waiting):
            self._last_seen[tenant] = now
        self._last_seen = {t: at for t, at in self._last_seen.items()
                           if now - at <= self.fair_window_s}
        if len(self._last_seen) < 2 or self.max_tenant_share >= 1:
            return {}
        share = int(self.kv_budget_tokens * self.max_tenant_share)
        return {t: share - held[t] for t in self._waiting}

    def take_waiting(self, matches: Callable[[WorkItem], bool]) -> list[WorkItem]:
        """Remove and return the waiting requests ``matches`` selects (to fail them)."""
        taken = [it for it in self.waiting_items() if matches(it)]
        for item in taken:
            self._remove_waiting(item)
        return taken

    def take_all(self) -> list[WorkItem]:
        """Remove and return every waiting and running request (a lost worker's)."""
        taken = [*self.waiting_items(), *self._running.values()]
        self._waiting.clear()
        self._running.clear()
        self._reserved.clear()
        self._engine_s.clear()
        self.num_reserved = 0
        return taken

    def _remove_waiting(self, item: WorkItem) -> None:
        queue = self._waiting[item.tenant]
        queue.remove(item)
        if not queue:
            del self._waiting[item.tenant]

    def charge(self, engine_s: float) -> None:
        """Share one decode step's engine time among the running requests by sequences."""
        sequences = {rid: _num_sequences(item) for rid, item in self._running.items()}
        total = sum(sequences.values())
        for rid, n in sequences.items():
            self._engine_s[rid] += engine_s * n / total

    def finish(self, request_id: str) -> tuple[WorkItem, float] | None:
        """Remove a finished request; returns it and its accumulated engine seconds."""
        item = self._running.pop(request_id, None)
        if item is None:
            return None
        self.num_reserved -= self._reserved.pop(request_id)
        return item, self._engine_s.pop(request_id)

    def running_ids(self) -> list[str]:
        return list(self._running)

    def is_running(self, request_id: str) -> bool:
        return request_id in self._running

    def any_streaming(self) -> bool:
        """Whether a running request streams its tokens."""
        return any(sample_op(it).work.stream for it in self._running.values())


def _prompt_tokens(item: WorkItem) -> int:
    return len(sample_op(item).work.prompt)


def _prompt_key(item: WorkItem) -> tuple[str | None, int]:
    work = sample_op(item).work
    return work.adapter_id, hash(work.prompt.tobytes())


def _num_sequences(item: WorkItem) -> int:
    return max(1, sample_op(item).work.num_samples)
