"""client_bench.py's workload and result helpers: the same fixed workload for every server, real
SDK datums, and the NLL it reports read back from forward_backward outputs."""

from __future__ import annotations

import math

import pytest
from tinker import types

from benchmarks.peers import client_bench


def test_default_train_batch_is_eight_sequences_averaging_256_tokens() -> None:
    lengths = list(client_bench.DEFAULT_TRAIN_LENGTHS)
    assert len(lengths) == 8
    assert sum(lengths) / len(lengths) == 256
    assert len(set(lengths)) > 1


def test_workload_is_deterministic_per_seed_and_within_vocab_limit() -> None:
    a = client_bench.train_token_lists([5, 9], vocab_limit=50, seed=3)
    assert a == client_bench.train_token_lists([5, 9], vocab_limit=50, seed=3)
    assert a != client_bench.train_token_lists([5, 9], vocab_limit=50, seed=4)
    assert [len(t) for t in a] == [6, 10]
    prompts = client_bench.prompt_token_lists(4, 7, vocab_limit=50, seed=3)
    assert prompts == client_bench.prompt_token_lists(4, 7, vocab_limit=50, seed=3)
    assert all(1 <= tok < 50 for seq in a + prompts for tok in seq)


def test_datums_shift_targets_by_one_with_unit_weights() -> None:
    tokens = [[11, 12, 13, 14]]
    (datum,) = client_bench.make_datums(types, tokens)
    assert datum.model_input.to_ints() == [11, 12, 13]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [12, 13, 14]
    assert datum.loss_fn_inputs["weights"].tolist() == [1.0, 1.0, 1.0]


class _Output:
    def __init__(self, logprobs: list[list[float]]) -> None:
        self.loss_fn_outputs = [
            {"logprobs": types.TensorData(data=lp, dtype="float32", shape=[len(lp)])}
            for lp in logprobs
        ]


def test_mean_nll_is_the_token_mean_over_all_datums() -> None:
    out = _Output([[-1.0, -2.0], [-3.0]])
    assert client_bench.mean_nll(out) == pytest.approx(2.0)
    assert client_bench.mean_nll(_Output([])) is None
    assert math.isclose(client_bench.mean_nll(_Output([[-0.5]])) or 0.0, 0.5)


class _Future:
    def __init__(self, client: object) -> None:
        self._client = client

    def result(self) -> object:
        return self._client


def test_resolved_unwraps_client_futures_and_keeps_clients() -> None:
    client = object()
    assert client_bench.resolved(_Future(client)) is client
    assert client_bench.resolved(client) is client
