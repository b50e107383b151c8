"""The usage table: deltas add up per key, rows filter by tenant and hour, and survive a reopen."""

from __future__ import annotations

from pathlib import Path

from loraplex.domain.usage import OpUsage
from loraplex.scheduler.usage import usage_deltas
from loraplex.store.db import Database
from loraplex.store.stores import open_stores
from loraplex.store.usage import SCHEMA, UsageCounts, UsageKey, UsageStore

HOUR = 3600 * 480_000  # some UTC hour boundary


def op(tenant: str, kind: str, at: float, run: str | None = "s:train:0", **counts: int
       ) -> OpUsage:
    return OpUsage(f"r{at}", tenant, kind, run, "Qwen/Qwen3-8B", at,
                   UsageCounts(num_ops=1, engine_s=0.5, **counts))


def test_deltas_fold_ops_per_tenant_run_model_kind_and_hour() -> None:
    deltas = usage_deltas([
        op("alice", "ForwardBackward", HOUR + 1, trained_tokens=100),
        op("alice", "ForwardBackward", HOUR + 3599, trained_tokens=50),
        op("alice", "ForwardBackward", HOUR + 3600, trained_tokens=7),
        op("alice", "Sample", HOUR + 5, run=None, prompt_tokens=10, rollout_prompt_tokens=40,
           sampled_tokens=33, num_sequences=4),
        op("bob", "ForwardBackward", HOUR + 2, trained_tokens=1),
    ])
    key = UsageKey("alice", "s:train:0", "Qwen/Qwen3-8B", "ForwardBackward", HOUR)
    assert deltas[key] == UsageCounts(num_ops=2, engine_s=1.0, trained_tokens=150)
    assert deltas[UsageKey("alice", "", "Qwen/Qwen3-8B", "Sample", HOUR)] == UsageCounts(
        num_ops=1, engine_s=0.5, prompt_tokens=10, rollout_prompt_tokens=40, sampled_tokens=33,
        num_sequences=4)
    assert len(deltas) == 4


def test_adds_accumulate_and_rows_filter(tmp_path: Path) -> None:
    store = UsageStore(Database(str(tmp_path / "u.sqlite3"), (SCHEMA,)))
    key = UsageKey("alice", "s:train:0", "Qwen/Qwen3-8B", "ForwardBackward", HOUR)
    store.add({key: UsageCounts(num_ops=1, trained_tokens=10, engine_s=0.25)})
    store.add({key: UsageCounts(num_ops=2, trained_tokens=5, engine_s=0.5),
               UsageKey("bob", "", "Qwen/Qwen3-8B", "Sample", HOUR + 3600):
               UsageCounts(num_ops=1, sampled_tokens=3)})
    assert store.rows("alice") == [(key, UsageCounts(num_ops=3, trained_tokens=15,
                                                     engine_s=0.75))]
    assert [k.tenant for k, _ in store.rows()] == ["alice", "bob"]
    assert [k.tenant for k, _ in store.rows(since=HOUR + 3600 + 17)] == ["bob"]
    store.add({})


def test_usage_survives_a_reopen_of_the_data_dir(tmp_path: Path) -> None:
    stores = open_stores(str(tmp_path / "data"))
    key = UsageKey("alice", "s:train:0", "Qwen/Qwen3-8B", "Sample", HOUR)
    stores.usage.add({key: UsageCounts(num_ops=1, prompt_tokens=12, cache_hit_tokens=8)})
    stores.close()
    again = open_stores(str(tmp_path / "data"))
    try:
        assert again.usage.rows("alice") == [
            (key, UsageCounts(num_ops=1, prompt_tokens=12, cache_hit_tokens=8))]
    finally:
        again.close()
