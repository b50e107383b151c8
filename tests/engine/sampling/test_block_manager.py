"""BlockManager: refcounts, the hash-chained prefix index, reuse order (LRU eviction of cached
pages, unregistered pages first) and invalidation by adapter."""

from __future__ import annotations

import pytest

from loraplex.engine.sampling.block_manager import BlockManager, chain_hash


def test_chain_hash_depends_on_the_adapter_key_the_tokens_and_everything_before() -> None:
    first = chain_hash(None, "base", [1, 2])
    assert chain_hash(None, "base", [1, 2]) == first
    assert chain_hash(None, "lora:0:a", [1, 2]) != first
    assert chain_hash(None, "base", [1, 3]) != first
    assert chain_hash(first, "base", [5, 6]) != chain_hash(chain_hash(None, "base", [1, 3]),
                                                           "base", [5, 6])


def register_prefix(manager: BlockManager, key: str, tokens: list[int]) -> list[int]:
    """Allocate and register pages for every full block of ``tokens`` (key ``lora:0:<id>``
    belongs to adapter ``<id>``)."""
    previous, pages = None, []
    for b in range(len(tokens) // manager.block_size):
        previous = chain_hash(previous, key, tokens[b * 2:(b + 1) * 2])
        page = manager.allocate()
        manager.register(page, previous, None if key == "base" else key.split(":")[-1])
        pages.append(page)
    return pages


def test_refcounts_keep_shared_pages_out_of_the_free_pool() -> None:
    manager = BlockManager(4, block_size=2)
    page = manager.allocate()
    manager.acquire(page)
    assert manager.num_free == 3
    manager.release([page])
    assert manager.num_free == 3 and manager.blocks[page].ref_count == 1
    manager.release([page])
    assert manager.num_free == 4
    with pytest.raises(AssertionError):
        manager.release([page])


def test_prefix_matches_stop_at_the_first_unknown_block_and_at_the_cap() -> None:
    manager = BlockManager(8, block_size=2)
    pages = register_prefix(manager, "base", [1, 2, 3, 4, 5, 6])
    assert [b for b, _ in manager.match_prefix("base", [1, 2, 3, 4, 5, 6, 7], 9)] == pages
    assert [b for b, _ in manager.match_prefix("base", [1, 2, 3, 4, 5, 6], 2)] == pages[:2]
    assert [b for b, _ in manager.match_prefix("base", [1, 2, 9, 4, 5, 6], 9)] == pages[:1]
    assert manager.match_prefix("lora:0:a", [1, 2, 3, 4], 9) == []


def test_released_cached_pages_stay_findable_and_are_evicted_least_recent_first() -> None:
    manager = BlockManager(4, block_size=2)
    old = register_prefix(manager, "base", [1, 2])
    new = register_prefix(manager, "base", [7, 8])
    scratch = manager.allocate()  # never registered
    manager.release(old)
    manager.release(new)
    manager.release([scratch])
    assert manager.match_prefix("base", [1, 2], 1)[0][0] == old[0]
    # Unregistered pages go first, then cached ones in release order.
    assert manager.allocate() in (scratch, 3)
    assert manager.allocate() in (scratch, 3)
    assert manager.allocate() == old[0]
    assert manager.match_prefix("base", [1, 2], 1) == []
    assert manager.match_prefix("base", [7, 8], 1)[0][0] == new[0]


def test_a_cache_hit_on_a_free_page_takes_it_out_of_the_pool() -> None:
    manager = BlockManager(2, block_size=2)
    [page] = register_prefix(manager, "base", [1, 2])
    manager.release([page])
    assert manager.num_free_among([page]) == 1
    manager.acquire(page)
    assert manager.num_free == 1 and manager.num_free_among([page]) == 0


def test_registering_a_known_prefix_keeps_the_first_page() -> None:
    manager = BlockManager(4, block_size=2)
    [first] = register_prefix(manager, "base", [1, 2])
    [second] = register_prefix(manager, "base", [1, 2])
    assert manager.match_prefix("base", [1, 2], 1)[0][0] == first
    assert manager.blocks[second].hash is None


def test_invalidate_forgets_one_adapters_pages_and_recycles_them_first() -> None:
    manager = BlockManager(6, block_size=2)
    mine = register_prefix(manager, "lora:0:a", [1, 2, 3, 4])
    theirs = register_prefix(manager, "lora:0:b", [1, 2])
    base = register_prefix(manager, "base", [1, 2])
    manager.release(mine[:1] + theirs + base)  # mine[1] is still referenced
    assert manager.invalidate("a") == 2
    assert manager.match_prefix("lora:0:a", [1, 2, 3, 4], 2) == []
    assert manager.match_prefix("lora:0:b", [1, 2], 1) != []
    assert manager.match_prefix("base", [1, 2], 1) != []
    assert manager.blocks[mine[1]].ref_count == 1
    assert manager.allocate() in (mine[0], 5)


def test_allocating_from_an_empty_pool_is_a_bug() -> None:
    manager = BlockManager(1, block_size=2)
    manager.allocate()
    with pytest.raises(RuntimeError):
        manager.allocate()
