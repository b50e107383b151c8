"""`BlockManager`: which KV-cache pages are free, who references them, which prefixes they hold.

Paged rather than one contiguous buffer per sequence (nano-vllm / vLLM's design), because:
* prefixes are shared by reference: the G samples of a request, and later requests with the same
  adapter version and prompt prefix, point at the same pages (refcounts) instead of copies;
* memory is bounded by `EngineConfig.kv_cache_blocks` whatever the request mix, and a sequence
  holds only the pages it has filled so far (no reservation of its maximum length);
* no fragmentation: every page has the same size, so any free page serves any sequence.

Prefix cache: a *full* page is registered under a hash chained over (adapter version key, all
tokens up to the page's end), so equal hashes mean equal KV. Pages whose refcount drops to zero
stay findable until reused; reuse takes never-registered pages first, then registered ones in
least-recently-released order (LRU eviction). Knows nothing about tensors or requests.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def chain_hash(previous: bytes | None, adapter_key: str, tokens: Sequence[int]) -> bytes:
    """Hash of one full block given the hash of the block before it (None for the first).

    128-bit BLAKE2b over the previous hash, the adapter version key and the block's tokens: a
    collision would need ~2^64 blocks, so hits are not re-verified token by token.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(previous or b"\0" * 16)
    h.update(adapter_key.encode())
    h.update(b"\0")
    h.update(array("q", tokens).tobytes())
    return h.digest()


@dataclass
class Block:
    """One page.

    Attributes:
        block_id: index into the cache tensors.
        ref_count: sequences whose block table holds this page.
        hash: chain hash when registered in the prefix cache (full pages only).
        adapter_id: the adapter whose KV the registered page holds (None: base model).
    """

    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    adapter_id: str | None = None


class BlockManager:
    """Refcounted pages plus the prefix-cache index over them."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Unreferenced pages in reuse order: first = next to hand out (unregistered pages are
        # put in front, registered ones at the back, so cached prefixes are evicted last, LRU).
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._by_hash: dict[bytes, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Pages that can be handed out now (cached but unreferenced pages included)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Registered pages (referenced or not)."""
        return len(self._by_hash)

    def match_prefix(self, adapter_key: str, tokens: Sequence[int], max_blocks: int
                     ) -> list[tuple[int, bytes]]:
        """Leading full blocks of ``tokens`` already cached: ``(block_id, hash)`` each, at most
        ``max_blocks``. Nothing is acquired."""
        hits: list[tuple[int, bytes]] = []
        previous: bytes | None = None
        size = self.block_size
        for b in range(min(max_blocks, len(tokens) // size)):
            previous = chain_hash(previous, adapter_key, tokens[b * size:(b + 1) * size])
            block_id = self._by_hash.get(previous)
            if block_id is None:
                break
            hits.append((block_id, previous))
        return hits

    def num_free_among(self, block_ids: Sequence[int]) -> int:
        """How many of these pages sit in the free pool (acquiring them consumes free pages)."""
        return sum(1 for b in block_ids if self.blocks[b].ref_count == 0)

    def acquire(self, block_id: int) -> None:
        """Take one more reference to a page (a prefix hit or a shared page)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def allocate(self) -> int:
        """A fresh page with one reference; evicts the least recently released cached page when
        no unregistered page is free.

        Raises:
            RuntimeError: no free page (callers check `num_free` first: a bug otherwise).
        """
        if not self._free:
            raise RuntimeError("KV cache exhausted: the caller must check num_free first")
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        self._unregister(block)
        block.ref_count = 1
        return block_id

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each page; pages reaching zero become reusable."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} released more often than acquired"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.hash is None:
                    self._free.move_to_end(block_id, last=False)

    def register(self, block_id: int, block_hash: bytes, adapter_id: str | None) -> None:
        """Make a full page findable under ``block_hash``. If another page already holds that
        prefix, the index keeps pointing there (this page stays private to its sequence)."""
        if block_hash in self._by_hash:
            return
        block = self.blocks[block_id]
        self._unregister(block)
        block.hash, block.adapter_id = block_hash, adapter_id
        self._by_hash[block_hash] = block_id

    def invalidate(self, adapter_id: str) -> int:
        """Unregister every page computed with this adapter (deleted, or its weights changed);
        free ones move to the front of the reuse order. Pages still referenced keep serving
        their sequences. Returns the number of pages unregistered."""
        dropped = 0
        for block in self.blocks:
            if block.hash is not None and block.adapter_id == adapter_id:
                self._unregister(block)
                dropped += 1
                if block.ref_count == 0:
                    self._free.move_to_end(block.block_id, last=False)
        return dropped

    def forget(self, block_ids: Sequence[int]) -> None:
        """Unregister pages whose contents cannot be trusted (their forward failed)."""
        for block_id in block_ids:
            self._unregister(self.blocks[block_id])

    def _unregister(self, block: Block) -> None:
        if block.hash is not None and self._by_hash.get(block.hash) == block.block_id:
            del self._by_hash[block.hash]
        block.hash, block.adapter_id = None, None
