"""Pricing metered counters in both billing modes, against hand-computed dollars."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from loraplex.config import MeteringConfig
from loraplex.cost.billing import Biller, token_usage
from loraplex.errors import UserError
from loraplex.scheduler.usage import usage_deltas
from loraplex.store.stores import Stores, open_stores
from loraplex.store.usage import UsageCounts, UsageKey
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import drain, make_scheduler, sample

# One GRPO-ish step: a 10-token prompt sampled G=4 times (6 of its tokens were engine cache
# hits), 100 sampled tokens, 200 trained tokens, a 30-token forward pass.
COUNTS = UsageCounts(num_ops=4, engine_s=2.0, trained_tokens=200, forward_tokens=30,
                     prompt_tokens=10, rollout_prompt_tokens=40, cache_hit_tokens=6,
                     sampled_tokens=100, num_sequences=4)
QWEN3_8B = (0.13, 0.40, 0.40)  # tinker-2026-01-05 prefill / sample / train, USD per 1M


def key(kind: str, run: str = "s:train:0", model: str = "Qwen/Qwen3-8B",
        tenant: str = "alice") -> UsageKey:
    return UsageKey(tenant, run, model, kind, 0)


def test_token_usage_counts_each_rollout_and_the_shared_copies_as_hits() -> None:
    usage = token_usage(COUNTS)
    assert usage.prefill_tokens == 40 + 30
    assert usage.cache_hit_tokens == (40 - 10) + 6
    assert (usage.sampled_tokens, usage.trained_tokens) == (100, 200)


def test_both_modes_priced_by_hand() -> None:
    biller = Biller(MeteringConfig())
    summary = biller.summarize("s:train:0", [(key("Sample"), COUNTS)])
    prefill, sample, train = QWEN3_8B
    rollout = summary.bills["per_rollout"]
    assert rollout.prefill_usd == pytest.approx(70 * prefill / 1e6)
    assert rollout.cached_prefill_usd == 0.0
    assert rollout.sample_usd == pytest.approx(100 * sample / 1e6)
    assert rollout.train_usd == pytest.approx(200 * train / 1e6)
    aware = summary.bills["cache_aware"]
    assert aware.prefill_usd == pytest.approx((70 - 36) * prefill / 1e6)
    assert aware.cached_prefill_usd == pytest.approx(36 * prefill * 0.2 / 1e6)
    assert aware.total_usd < rollout.total_usd
    assert summary.engine_s == {"Sample": 2.0}


def test_served_names_map_to_sheet_models() -> None:
    biller = Biller(MeteringConfig(model_map={"my-llama": "meta-llama/Llama-3.1-70B"}))
    assert biller.sheet_model("Qwen/Qwen3-32B") == "Qwen/Qwen3-32B"
    assert biller.sheet_model("my-llama") == "meta-llama/Llama-3.1-70B"
    assert biller.sheet_model("builtin-tiny") == "Qwen/Qwen3-8B"
    train_only = UsageCounts(trained_tokens=1_000_000)
    summary = biller.summarize(None, [(key("ForwardBackward", model="my-llama"), train_only),
                                      (key("ForwardBackward"), train_only)])
    assert summary.bills["per_rollout"].train_usd == pytest.approx(3.16 + 0.40)
    assert summary.base_models == ("Qwen/Qwen3-8B", "my-llama")


def test_a_custom_price_table_and_bad_configs() -> None:
    table = {"name": "lab", "prices": {"tiny": {"prefill": 1.0, "sample": 2.0, "train": 3.0}}}
    biller = Biller(MeteringConfig(price_table=table, default_model="tiny"))
    bill = biller.summarize(None, [(key("ForwardBackward", model="x"),
                                    UsageCounts(trained_tokens=2_000_000))]).bills["per_rollout"]
    assert bill.train_usd == pytest.approx(6.0) and biller.sheet_json()["name"] == "lab"
    with pytest.raises(UserError, match="no price"):
        Biller(MeteringConfig(default_model="not/a-model"))
    with pytest.raises(UserError, match="unknown sheet"):
        Biller(MeteringConfig(price_sheet="nope"))


def test_tenants_get_totals_and_runs_with_base_sampling_last() -> None:
    rows = [(key("ForwardBackward", run="s:train:1"), UsageCounts(num_ops=1, trained_tokens=5)),
            (key("Sample", run=""), UsageCounts(num_ops=1, sampled_tokens=3)),
            (key("ForwardBackward", run="s:train:0"), UsageCounts(num_ops=2, trained_tokens=7)),
            (key("Sample", tenant="bob"), UsageCounts(num_ops=1, sampled_tokens=1))]
    alice, bob = Biller(MeteringConfig()).tenants(rows)
    assert (alice.tenant, bob.tenant) == ("alice", "bob")
    assert [r.run_id for r in alice.runs] == ["s:train:0", "s:train:1", None]
    assert alice.totals.counts == UsageCounts(num_ops=4, trained_tokens=12, sampled_tokens=3)
    assert bob.totals.counts.sampled_tokens == 1


class PrefixCachingToy(ToyExecutor):
    """Reports as cache hits the longest prefix a prompt shares with an earlier prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[int]] = []

    def _result(self, run):  # type: ignore[no-untyped-def]
        prompt = list(run.work.prompt)
        hits = max((_common(prompt, p) for p in self.seen), default=0)
        self.seen.append(prompt)
        return replace(super()._result(run), prompt_cache_hit_tokens=hits)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = open_stores(str(tmp_path / "data"))
    yield s
    s.close()


def test_engine_cache_hits_flow_from_the_scheduler_to_the_bill(stores: Stores) -> None:
    toy = PrefixCachingToy()
    s = make_scheduler(toy, stores)
    history = [2, 3, 4, 5, 6, 7, 8, 9]  # turn 1: 8 tokens; turn 2 re-sends them + 4 new
    s.submit(sample(history, num_samples=2, max_tokens=3))
    drain(s)
    s.submit(sample([*history, 10, 11, 12, 13], num_samples=2, max_tokens=3))
    drain(s)
    stores.usage.add(usage_deltas(s.usage.drain_ops()))
    [(_, counts)] = stores.usage.rows("alice")
    assert (counts.prompt_tokens, counts.rollout_prompt_tokens, counts.cache_hit_tokens) == (
        8 + 12, 2 * 8 + 2 * 12, 8)
    bills = Biller(MeteringConfig()).summarize(None, stores.usage.rows("alice")).bills
    shared = (40 - 20) + 8
    assert bills["per_rollout"].prefill_usd == pytest.approx(40 * 0.13 / 1e6)
    assert bills["cache_aware"].prefill_usd == pytest.approx((40 - shared) * 0.13 / 1e6)
    assert bills["cache_aware"].cached_prefill_usd == pytest.approx(shared * 0.13 * 0.2 / 1e6)


def test_an_unlisted_moe_is_priced_by_its_active_parameters() -> None:
    """A MoE the sheet does not list takes the rates of the sheet model nearest in active
    parameters (3.3B of 30.5B active → Qwen3-30B-A3B, cheaper than the dense 8B default);
    a dense unknown name still gets the default."""
    biller = Biller(MeteringConfig(), {"local/moe-a3b": 3_300_000_000,
                                       "local/moe-a5b": 5_500_000_000})
    assert biller.sheet_model("local/moe-a3b") == "Qwen/Qwen3-30B-A3B"
    assert biller.sheet_model("local/moe-a5b") == "openai/gpt-oss-120b"  # 5.7B active
    assert biller.sheet_model("local/dense") == "Qwen/Qwen3-8B"
    assert biller.sheet_model("Qwen/Qwen3-30B-A3B") == "Qwen/Qwen3-30B-A3B"
    rows = [(key("ForwardBackward", model="local/moe-a3b"), COUNTS)]
    bill = biller.summarize("s:train:0", rows).bills["per_rollout"]
    assert bill.train_usd == pytest.approx(200 * 0.36 / 1e6)  # Qwen3-30B-A3B's train rate


def test_a_model_only_later_sheets_list_takes_the_newest_listing_rates() -> None:
    """The January 2026 default predates Qwen3.5: a served ``Qwen/Qwen3.5-4B`` is billed at
    its catalogue rates of the June sheet, ``Qwen/Qwen3.6-35B-A3B`` at October's; the default
    sheet's own rates do not change."""
    biller = Biller(MeteringConfig())
    assert biller.sheet.name == "tinker-2026-01-05"
    train_only = UsageCounts(trained_tokens=1_000_000)

    def train_usd(model: str) -> float:
        rows = [(key("ForwardBackward", model=model), train_only)]
        return biller.summarize(None, rows).bills["per_rollout"].train_usd

    assert train_usd("Qwen/Qwen3.5-4B") == pytest.approx(0.67)
    assert train_usd("Qwen/Qwen3.6-35B-A3B") == pytest.approx(1.605)
    assert train_usd("openai/gpt-oss-20b") == pytest.approx(0.36)
    assert train_usd("Qwen/Qwen3-30B-A3B") == pytest.approx(0.36)  # the sheet's own
    assert "tinker-2026-06" in (biller.sheet.inferred or {})["Qwen/Qwen3.5-4B"]
