"""`KVPool`: the sampler's KV cache seen per sequence: page tables, prefix hits, forks, growth.

Owns the cache tensors (`PagedKVCache`) and the page bookkeeping (`BlockManager`) and keeps
them consistent: a page handed out again is zeroed before the next forward writes into it (a
stale non-finite key or value would turn masked-out attention terms into NaN), a fork's partial
last page is copied exactly, and every full page a sequence has filled is registered under its
chain hash. A hybrid model's linear-attention states (`LinearStates`) follow the sequences:
a fork copies its parent's, a release drops them; cached prefix pages are never reused for
such a model (a page does not hold the recurrent state at its end). Knows nothing about
requests' parameters, sampling or queues.
"""

from __future__ import annotations

import torch

from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.sampling.block_manager import BlockManager, chain_hash
from loraplex.engine.sampling.sequence import SampleSequence


class KVPool:
    """Pages of one model's KV cache and the sequences holding them."""

    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        # Resident from here on: num_blocks × (layers · 2 · kv_heads · block · head_dim)
        # values (`kv_budget` sizes it; the small model's 2048 pages: 1 GiB in fp32).
        self.kv = PagedKVCache.allocate(spec, num_blocks, block_size, device, dtype)
        self.blocks = BlockManager(num_blocks, block_size)
        self.block_size = block_size
        self._device = device
        self._fresh: list[int] = []  # handed out since the last `prepare_forward`

    @property
    def num_free(self) -> int:
        return self.blocks.num_free

    def try_allocate(self, seq: SampleSequence, max_hit_tokens: int, num_forks: int,
                     reserve: int) -> bool:
        """Pages for all of ``seq``'s tokens, reusing cached full pages of its prefix that end
        at or before ``max_hit_tokens`` (later positions need logits, so they are computed),
        plus ``num_forks`` pages for forks' private copies of a partial last page. Sets
        ``seq.num_computed`` to the cached prefix. False (nothing taken) unless ``reserve``
        pages stay free afterwards."""
        size = self.block_size
        num_tokens = len(seq.tokens)
        key = seq.request.adapter_key
        reusable = 0 if self.kv.linear is not None else max_hit_tokens // size
        hits = self.blocks.match_prefix(key, seq.tokens, reusable)
        num_new = -(-num_tokens // size) - len(hits)
        forks = num_forks if num_tokens % size else 0
        needed = num_new + forks + self.blocks.num_free_among([b for b, _ in hits])
        if needed + reserve > self.blocks.num_free:
            return False
        for block_id, block_hash in hits:
            self.blocks.acquire(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(block_hash)
        for _ in range(num_new):
            seq.block_table.append(self._allocate())
        seq.num_computed = len(hits) * size
        # Registered before the forward that fills them: a sequence of the same forward with
        # the same prefix reads them after that forward's per-layer write (a failed forward
        # resets the whole pool).
        self.register_full_pages(seq, num_tokens)
        return True

    def try_fork(self, parent: SampleSequence, forks: list[SampleSequence], reserve: int
                 ) -> bool:
        """Let fresh sequences with ``parent``'s tokens share its pages; each gets a private
        page for a partial last page (filled by `copy_partial_pages` after the forward). False
        (nothing taken) unless ``reserve`` pages stay free afterwards."""
        table = parent.block_table
        has_tail = len(parent.tokens) % self.block_size != 0
        if has_tail and len(forks) + reserve > self.blocks.num_free:
            return False
        shared = table[:-1] if has_tail else table
        for seq in forks:
            for block_id in shared:
                self.blocks.acquire(block_id)
            seq.block_table = list(shared)
            if has_tail:
                seq.block_table.append(self._allocate())
            seq.block_hashes = list(parent.block_hashes)
        return True

    def copy_partial_pages(self, pairs: list[tuple[SampleSequence, SampleSequence]]) -> None:
        """Copy-on-write: each fork's private last page becomes an exact copy of its parent's
        (every layer's keys and values), once the parent's forward has written it; its
        linear-attention states start as its parent's."""
        if self.kv.linear is not None:
            for parent, fork in pairs:
                self.kv.linear.copy(parent, fork)
        moves = [(p.block_table[-1], f.block_table[-1]) for p, f in pairs
                 if p.block_table[-1] != f.block_table[-1]]
        if not moves:
            return
        src = torch.tensor([s for s, _ in moves], device=self._device)
        dst = torch.tensor([d for _, d in moves], device=self._device)
        for pages in self.kv.paged:
            pages.index_copy_(0, dst, pages.index_select(0, src))

    def needs_page(self, seq: SampleSequence) -> bool:
        """Whether the next write (position ``num_computed``) starts a new page."""
        return seq.num_computed >= len(seq.block_table) * self.block_size

    def grow(self, seq: SampleSequence) -> None:
        """Append one page (the caller checked `num_free`)."""
        seq.block_table.append(self._allocate())

    def release(self, seq: SampleSequence) -> None:
        """Drop the sequence's pages (registered full pages stay cached) and its KV state."""
        if self.kv.linear is not None:
            self.kv.linear.drop(seq)
        self.blocks.release(seq.block_table)
        seq.block_table, seq.block_hashes, seq.num_computed = [], [], 0

    def register_full_pages(self, seq: SampleSequence, upto: int) -> None:
        """Register the sequence's pages that positions ``< upto`` fill completely."""
        size = self.block_size
        request = seq.request
        while (len(seq.block_hashes) + 1) * size <= upto:
            j = len(seq.block_hashes)
            block_hash = chain_hash(seq.block_hashes[-1] if j else None, request.adapter_key,
                                    seq.tokens[j * size:(j + 1) * size])
            self.blocks.register(seq.block_table[j], block_hash, request.work.adapter_id)
            seq.block_hashes.append(block_hash)

    def prepare_forward(self) -> None:
        """Zero the pages handed out since the last forward."""
        if self._fresh:
            self.kv.zero_blocks(torch.tensor(self._fresh, device=self._device))
            self._fresh = []

    def reset(self) -> None:
        """Forget all pages and cached prefixes (after a bug: nothing can be trusted)."""
        self.blocks = BlockManager(self.blocks.num_blocks, self.block_size)
        if self.kv.linear is not None:
            self.kv.linear.clear()
        self.kv.zero_blocks(torch.arange(self.blocks.num_blocks, device=self._device))
        self._fresh = []

    def _allocate(self) -> int:
        block_id = self.blocks.allocate()
        self._fresh.append(block_id)
        return block_id
