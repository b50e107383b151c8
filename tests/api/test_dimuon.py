"""Dimuon through the real tinker SDK 0.38: `DimuonOptimizerConfig` at create, `DimuonParams` per
step (and the later API reference's damping / rank-correction fields, sent through the SDK's
`OptimParamsBase`), the other family's params refused, save_state and resume bitwise."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tinker
from tinker import types
from tinker.types.optimizer import OptimizerConfigBase, OptimParamsBase

from tests.api.conftest import MODEL

Make = Callable[..., tinker.ServiceClient]
DIMUON = types.DimuonParams(learning_rate=0.02)


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": [*tokens[1:], tokens[0]],
                                       "weights": [1.0] * len(tokens)})


DATA = [datum([2 + i, 7, 11 + i, 5, 9]) for i in range(4)]


def dimuon_client(client: tinker.ServiceClient, rank: int = 8) -> tinker.TrainingClient:
    return client.create_lora_training_client(base_model=MODEL, rank=rank, seed=3,
                                              optimizer=types.DimuonOptimizerConfig()).result()


def step(tc: tinker.TrainingClient, params: types.OptimParams = DIMUON) -> float:
    loss = tc.forward_backward(DATA, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(params).result()
    return float(loss)


def logprobs(tc: tinker.TrainingClient) -> list[np.ndarray]:
    out = tc.forward(DATA, "cross_entropy").result()
    return [np.asarray(o["logprobs"].data, dtype=np.float32) for o in out.loss_fn_outputs]


def test_a_dimuon_run_echoes_its_optimizer_and_lowers_the_loss(service_client: Make) -> None:
    tc = dimuon_client(service_client())
    assert tc.get_info().optimizer_config.model_dump() == {"type": "dimuon", "version": 1}
    losses = [step(tc) for _ in range(4)]
    assert losses[-1] < 0.9 * losses[0], losses
    later_fields = OptimParamsBase(type="dimuon", learning_rate=0.02, beta1=0.5, damping=1e-2,
                                   rank_lr_correction_exponent=0.0, grad_clip_norm=1.0)
    result = tc.forward_backward(DATA, "cross_entropy").result()
    metrics = tc.optim_step(later_fields).result().metrics  # type: ignore[arg-type]
    assert result.metrics["loss:sum"] < losses[0]
    assert metrics is not None and metrics["learning_rate:mean"] == 0.02


def test_params_of_the_other_family_are_refused_and_change_nothing(service_client: Make
                                                                    ) -> None:
    client = service_client()
    dimuon, adamw = dimuon_client(client), client.create_lora_training_client(
        base_model=MODEL, rank=8).result()
    for tc, wrong, field in ((dimuon, types.AdamParams(learning_rate=0.01), "adam_params"),
                             (adamw, DIMUON, "optimizer_params.type")):
        step(tc, DIMUON if tc is dimuon else types.AdamParams(learning_rate=0.01))
        before = logprobs(tc)
        with pytest.raises(tinker.RequestFailedError, match=field) as info:
            tc.optim_step(wrong).result()
        assert info.value.category == types.RequestErrorCategory.User
        for a, b in zip(logprobs(tc), before, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("fields", "named"), [
    ({"damping": 0.0}, "optimizer_params.damping"),
    ({"beta1": 1.5}, "optimizer_params.beta1"),
    ({"nesterov": 1.0}, "optimizer_params.nesterov"),
])
def test_bad_dimuon_fields_are_refused_by_name(service_client: Make, fields: dict[str, float],
                                               named: str) -> None:
    tc = dimuon_client(service_client(), rank=4)
    bad = OptimParamsBase(type="dimuon", learning_rate=0.01, **fields)
    with pytest.raises(tinker.RequestFailedError, match=named) as info:
        tc.optim_step(bad).result()  # type: ignore[arg-type]
    assert info.value.category == types.RequestErrorCategory.User


def test_an_unknown_dimuon_version_is_refused_at_create(service_client: Make) -> None:
    with pytest.raises(tinker.BadRequestError, match=r"optimizer_config\.version"):
        service_client().create_lora_training_client(
            base_model=MODEL, rank=4, optimizer=OptimizerConfigBase(type="dimuon", version=2)
        ).result()


def test_save_state_and_resume_with_the_optimizer_is_bitwise(service_client: Make) -> None:
    client = service_client()
    tc = dimuon_client(client)
    for _ in range(2):
        step(tc)
    path = tc.save_state("dimuon-2").result().path
    for _ in range(2):
        step(tc)
    never_stopped = logprobs(tc)
    resumed = client.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.get_info().optimizer_config.model_dump() == {"type": "dimuon", "version": 1}
    for _ in range(2):
        step(resumed)
    for a, b in zip(logprobs(resumed), never_stopped, strict=True):
        np.testing.assert_array_equal(a, b)
    adamw = client.create_lora_training_client(base_model=MODEL, rank=8, seed=3).result()
    with pytest.raises(tinker.RequestFailedError, match="optimizer state is 'dimuon'") as info:
        adamw.load_state_with_optimizer(path).result()
    assert info.value.category == types.RequestErrorCategory.User
