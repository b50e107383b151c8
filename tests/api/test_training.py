"""Training through the real tinker SDK 0.38 against the live server (torch engine by default)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.api.conftest import MODEL, Server

Make = Callable[..., tinker.ServiceClient]


def datum(tokens: list[int], weight: float = 1.0) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": [*tokens[1:], tokens[0]],
                        "weights": [weight] * len(tokens)})


DATA = [datum([2 + i, 7, 11 + i, 5, 9]) for i in range(5)]  # 3 chunks of ≤2 datums
ADAM = types.AdamParams(learning_rate=0.01)  # 0.05 diverges on the real tiny model


def logprobs(out: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].data, dtype=np.float32) for o in out.loss_fn_outputs]


def test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss(
    server: Server, service_client: Make
) -> None:
    tc = service_client().create_lora_training_client(base_model=MODEL, rank=8).result()
    losses = []
    for _ in range(4):
        fb = tc.forward_backward(DATA, "cross_entropy")
        step = tc.optim_step(ADAM)  # submitted before the forward_backward finished
        out = fb.result()
        step.result()
        assert [len(o["logprobs"].data) for o in out.loss_fn_outputs] == [5] * len(DATA)
        losses.append(out.metrics["loss:sum"])
    assert losses[-1] < losses[0]
    # The chunks (seq 1-3, the first submitted last) were run in order, one engine call each.
    run = server.ctx.stores.runs.get(tc.model_id, server.ctx.stores.runs.find(
        tc.model_id).run.tenant)  # type: ignore[union-attr]
    assert run.num_steps == 4 and run.num_trained_tokens == 4 * 25


def test_forward_matches_forward_backward_and_changes_nothing(service_client: Make) -> None:
    tc = service_client().create_lora_training_client(base_model=MODEL, rank=4).result()
    before = logprobs(tc.forward(DATA, "cross_entropy").result())
    again = logprobs(tc.forward(DATA, "cross_entropy").result())
    trained = logprobs(tc.forward_backward(DATA, "cross_entropy").result())
    for a, b, c in zip(before, again, trained, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    tc.optim_step(ADAM).result()
    after = logprobs(tc.forward(DATA, "cross_entropy").result())
    assert not np.array_equal(before[0], after[0]), "optim_step applied the gradient"


def test_forward_backward_custom_equals_the_matching_linear_loss(service_client: Make) -> None:
    client = service_client()
    # One seed: both adapters start from the same random A, so only the losses differ.
    custom = client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
    linear = client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()

    def doubled_nll(data: list[types.Datum], lps: list[torch.Tensor]
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = sum(-2.0 * lp.sum() for lp in lps)
        return loss, {"custom:sum": float(loss.detach())}  # type: ignore[union-attr,arg-type]

    out = custom.forward_backward_custom(DATA, doubled_nll).result()
    assert "custom:sum" in out.metrics
    linear.forward_backward([datum(d.model_input.to_ints(), 2.0) for d in DATA],
                            "cross_entropy").result()
    custom.optim_step(ADAM).result()
    linear.optim_step(ADAM).result()
    for a, b in zip(logprobs(custom.forward(DATA, "cross_entropy").result()),
                    logprobs(linear.forward(DATA, "cross_entropy").result()), strict=True):
        np.testing.assert_array_equal(a, b)


def _train(tc: tinker.TrainingClient, steps: int) -> None:
    for _ in range(steps):
        tc.forward_backward(DATA, "cross_entropy")
        tc.optim_step(ADAM).result()


def test_save_state_then_load_with_and_without_optimizer(service_client: Make) -> None:
    client = service_client()
    tc = client.create_lora_training_client(base_model=MODEL, rank=8).result()
    _train(tc, 2)
    path = tc.save_state("c1").result().path
    assert path == f"tinker://{tc.model_id}/weights/c1"
    _train(tc, 1)
    never_stopped = logprobs(tc.forward(DATA, "cross_entropy").result())

    resumed = client.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.get_info().lora_rank == 8
    _train(resumed, 1)
    for a, b in zip(logprobs(resumed.forward(DATA, "cross_entropy").result()), never_stopped,
                    strict=True):
        np.testing.assert_array_equal(a, b)

    fresh_optimizer = client.create_training_client_from_state(path).result()
    _train(fresh_optimizer, 1)
    assert not np.array_equal(
        logprobs(fresh_optimizer.forward(DATA, "cross_entropy").result())[0], never_stopped[0])

    # Legacy shape: load into an existing client at any point of its run.
    other = client.create_lora_training_client(base_model=MODEL, rank=8).result()
    _train(other, 3)
    other.load_state_with_optimizer(path).result()
    _train(other, 1)
    np.testing.assert_array_equal(logprobs(other.forward(DATA, "cross_entropy").result())[0],
                                  never_stopped[0])


def test_load_refuses_a_checkpoint_of_another_rank(service_client: Make) -> None:
    client = service_client()
    tc = client.create_lora_training_client(base_model=MODEL, rank=8).result()
    path = tc.save_state("r8").result().path
    other = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match="rank") as info:
        other.load_state(path).result()
    assert info.value.category == types.RequestErrorCategory.User
    other.forward(DATA, "cross_entropy").result()  # the client continues


def test_rl_losses_run_and_report_per_token_outputs(service_client: Make) -> None:
    tc = service_client().create_lora_training_client(base_model=MODEL, rank=4).result()
    n = 5
    rl = [types.Datum(model_input=types.ModelInput.from_ints([2, 3, 4, 5, 6]),
                      loss_fn_inputs={"target_tokens": [3, 4, 5, 6, 7],
                                      "logprobs": [-1.0] * n, "advantages": [0.5] * n})]
    for loss_fn, config in [("importance_sampling", None),
                            ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
                            ("cispo", None), ("dro", {"beta": 0.1})]:
        out = tc.forward_backward(rl, loss_fn, config).result()
        assert len(out.loss_fn_outputs[0]["logprobs"].data) == n, loss_fn
        assert np.isfinite(out.metrics["loss:sum"]), loss_fn
    tc.optim_step(ADAM).result()
