"""How one decode step is shared when several tenants are sampling at once.

Continuous batching puts every running sequence into every decode step, so a step lasts as long
as its heaviest tenant makes it: beside a tenant decoding 32 sequences at 6,000 tokens of
context (36 ms a step on ``builtin:tiny``), another tenant's 8-token sample takes 8 of those
steps. While more than one tenant has sequences in the sampler, `StepShare` bounds each
tenant's part of a step instead:

- **Decode**: deficit round-robin over KV positions read. Each step every tenant with running
  sequences earns ``decode_kv_tokens`` of credit; its sequences decode, longest-waiting first,
  while their cost (context length + `ROW_COST`) fits its credit, and what is left carries
  over (a sequence longer than one step's credit decodes once enough has accumulated). The
  rest wait for a later step; a step decodes one row at least. A tenant using less than its
  credit (a short sample) decodes every sequence every step.
- **Prefill**: at most ``prefill_tokens`` prompt tokens per decode step, long prompts cut into
  pieces that small, so a prompt being prefilled does not hold the others' next token.

A tenant counts as sampling for ``linger_steps`` decode steps after its last sequence left: a
client sampling one request at a time sends its next one moments after the last finished, and
it should find short steps, not one with a full prefill budget. While shared, a sampler step
also returns as soon as a decode step finished a tenant's last running request (`Sampler.step`),
so its result leaves at once (its client is waiting for it before it sends the next), and after
at most `SHARED_STEPS_PER_CALL` decode steps, so a request that arrives during one is admitted
soon.

Alone, a tenant's sequences all decode every step and prefill runs at the sampler's usual
budget: one tenant's throughput, and every sequence's bits, are unchanged. Which step a token
is computed in never changes it (the batch-invariant kernels compute a row the same in any
batch), so sharing moves latency between tenants and never changes what is sampled.
"""

from __future__ import annotations

from collections.abc import Iterable

from loraplex.engine.sampling.sequence import SampleRequest, SampleSequence

#: While shared, a sampler step (one engine call) runs at most this many decode steps: another
#: tenant's next request waits for the call in progress, so calls stay short.
SHARED_STEPS_PER_CALL = 2
#: A decode row's cost beyond its context (the row's share of the step's GEMMs), in KV
#: positions: a one-token sequence is not free.
ROW_COST = 64


class StepShare:
    """Per-step decode sets and prefill budgets while several tenants sample.

    Args:
        decode_kv_tokens: KV positions one tenant's decode rows may read per step while
            another tenant samples too (0: off, every sequence decodes every step).
        prefill_tokens: prompt tokens prefilled per decode step while several tenants sample.
        linger_steps: decode steps a tenant still counts as sampling after its last
            sequence left.
    """

    def __init__(self, decode_kv_tokens: int, prefill_tokens: int, linger_steps: int) -> None:
        self.decode_kv_tokens = decode_kv_tokens
        self.prefill_tokens = prefill_tokens
        self.linger_steps = linger_steps
        self._credit: dict[str, int] = {}
        self._seen: dict[str, int] = {}  # tenant → the last step it had work in the sampler
        self._step = 0
        self.shared = False  # as of the last `refresh`
        self.deferred = 0  # decode rows held back for a later step, in total

    @property
    def enabled(self) -> bool:
        return self.decode_kv_tokens > 0

    def refresh(self, running: Iterable[SampleSequence], queued: Iterable[SampleRequest]
                ) -> bool:
        """Note who has work now; whether more than one tenant is sampling (has sequences
        running or requests queued, or had within ``linger_steps``)."""
        if not self.enabled:
            return False
        for tenant in {s.request.work.tenant for s in running} | {r.work.tenant
                                                                   for r in queued}:
            self._seen[tenant] = self._step
        self._seen = {t: at for t, at in self._seen.items()
                      if self._step - at <= self.linger_steps}
        self.shared = len(self._seen) > 1
        return self.shared

    def tick(self) -> None:
        """A step without decoding (a prefill-only forward) passed."""
        self._step += 1

    def decode_set(self, running: list[SampleSequence], queued: Iterable[SampleRequest]
                   ) -> list[SampleSequence]:
        """The running sequences that decode in this step (in ``running``'s order)."""
        self._step += 1
        if not self.refresh(running, queued):
            self._credit.clear()
            self._mark(running)
            return running
        by_tenant: dict[str, list[SampleSequence]] = {}
        for seq in running:
            by_tenant.setdefault(seq.request.work.tenant, []).append(seq)
        self._credit = {t: c for t, c in self._credit.items() if t in by_tenant}
        chosen: set[int] = set()
        for tenant, seqs in by_tenant.items():
            credit = self._credit.get(tenant, 0) + self.decode_kv_tokens
            waiting = sorted(seqs, key=lambda s: s.decoded_at)  # stable: admission order
            taken = 0
            for seq in waiting:
                cost = seq.num_computed + ROW_COST
                if cost > credit:
                    break
                chosen.add(id(seq))
                credit -= cost
                taken += 1
            # Credit carries over only while sequences wait: an idle tenant saves up nothing.
            self._credit[tenant] = credit if taken < len(waiting) else 0
        if not chosen:  # every tenant is saving up: a step decodes one row at least
            chosen.add(id(min(running, key=lambda s: s.decoded_at)))
        out = [s for s in running if id(s) in chosen]
        self.deferred += len(running) - len(out)
        self._mark(out)
        return out

    def _mark(self, seqs: list[SampleSequence]) -> None:
        for seq in seqs:
            seq.decoded_at = self._step
