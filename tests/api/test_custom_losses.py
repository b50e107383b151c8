"""Server-side custom losses through the real SDK 0.38: ``create_custom_loss`` uploads the
traced graph, ``forward_backward_custom`` runs it on the server in one forward_backward. Each
loss is checked against the SDK's own client-side path (the same LossHandle without its
``loss_id``: forward, local autograd, a weighted cross-entropy backward) on two training runs
with identical weights: loss, metrics and the adapters' gradients agree."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import tinker
import torch
import torch.nn.functional as F
from tinker import types

from tests.api.conftest import MODEL, Server, engine_only

pytestmark = engine_only

Make = Callable[..., tinker.ServiceClient]
BETA = 0.1


def dpo(logprobs, weights, ref_logprob, rejected_logratio):  # type: ignore[no-untyped-def]
    """The cookbook's DPO arithmetic (``-logsigmoid(β·(chosen − rejected log-ratio))`` with
    reward and accuracy metrics), per datum: a datum is a pair's chosen completion, and its
    rejected completion's log-ratio comes as an input (the SDK's create_custom_loss takes
    per-datum losses, so the pair cannot span two datums)."""
    chosen_logratio = (logprobs * weights).sum() - ref_logprob
    margin = BETA * (chosen_logratio - rejected_logratio)
    loss = -F.logsigmoid(margin)
    return loss, {"custom/accuracy:mean": (margin > 0).float(),
                  "custom/chosen_reward:mean": (BETA * chosen_logratio).detach(),
                  "custom/margin:sum": margin.detach()}


def ppo(logprobs, sampling_logprobs, advantages):  # type: ignore[no-untyped-def]
    ratio = torch.exp(logprobs - sampling_logprobs)
    clipped = torch.clamp(ratio, 0.8, 1.2)
    loss = -torch.minimum(ratio * advantages, clipped * advantages).sum()
    return loss, {"custom/ratio:mean": ratio.mean().detach()}


def anchored_nll(logprobs, weights, ref_logprobs):  # type: ignore[no-untyped-def]
    nll = -(logprobs * weights).sum() / weights.sum().clamp(min=1.0)
    anchor = ((logprobs - ref_logprobs) ** 2 * weights).sum()
    spread = torch.logsumexp(logprobs, dim=0) + F.softplus(logprobs[1:]).mean()
    return nll + 0.5 * anchor + 0.01 * spread, {"custom/nll:mean": nll.detach()}


def datum(tokens: list[int], **inputs: Any) -> types.Datum:
    fields: dict[str, Any] = {"target_tokens": [*tokens[1:], tokens[0]]}
    for key, value in inputs.items():
        values = [value] if isinstance(value, float) else value
        shape = [] if isinstance(value, float) else [len(value)]
        fields[key] = types.TensorData(data=values, dtype="float32", shape=shape)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=fields)


def dpo_data() -> list[types.Datum]:
    return [datum([2 + i, 7, 11 + i, 5, 9], weights=[0.0, 0.0, 1.0, 1.0, 1.0],
                  ref_logprob=-20.0 - i, rejected_logratio=0.5 * i - 1.0) for i in range(4)]


def ppo_data() -> list[types.Datum]:
    return [datum([3 + i, 8, 12, 6 + i], sampling_logprobs=[-6.0, -5.5, -6.2, -5.9],
                  advantages=[1.0, -0.5, 0.25 * i, 2.0]) for i in range(4)]


def nll_data() -> list[types.Datum]:
    return [datum([4, 9 + i, 13, 7, 2 + i, 6], weights=[1.0, 1.0, 0.0, 1.0, 1.0, 0.5],
                  ref_logprobs=[-5.0 - 0.1 * i] * 6) for i in range(4)]


CASES = {
    "dpo": (dpo, {"logprobs": 1, "weights": 1, "ref_logprob": 0, "rejected_logratio": 0},
            dpo_data),
    "ppo": (ppo, {"logprobs": 1, "sampling_logprobs": 1, "advantages": 1}, ppo_data),
    "anchored_nll": (anchored_nll, {"logprobs": 1, "weights": 1, "ref_logprobs": 1}, nll_data),
}


def grads(server: Server, model_id: str) -> list[torch.Tensor]:
    engine = server.ctx.catalog.get(MODEL).lanes.schedulers()[0][1].executor
    return [p.grad.clone() for p in engine.bank.get(model_id).parameters()]  # type: ignore


@pytest.mark.parametrize("case", list(CASES))
def test_server_side_loss_matches_the_client_side_path(server: Server, service_client: Make,
                                                       case: str) -> None:
    fn, ranks, make_data = CASES[case]
    client = service_client()
    handle = client.create_custom_loss(fn, ranks).result()
    assert handle.loss_id is not None, "uploaded: custom_loss_server_side is on"
    first = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    state = first.save_state("init").result().path
    second = client.create_training_client_from_state(state).result()
    data = make_data()
    on_server = first.forward_backward_custom(data, handle).result()
    on_client = second.forward_backward_custom(data, dataclasses.replace(handle, loss_id=None)
                                               ).result()
    assert "surrogate_loss:sum" in on_client.metrics and "surrogate_loss:sum" not in \
        on_server.metrics, "one ran client-side, the other on the server"
    for key, value in on_client.metrics.items():
        if key != "surrogate_loss:sum":
            assert on_server.metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    server_grads, client_grads = grads(server, first.model_id), grads(server, second.model_id)
    for a, b in zip(server_grads, client_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(server_grads, client_grads, strict=True)), \
        "bitwise: both backpropagate the same dC/dlogprobs through the same packed batch"
    assert [o["logprobs"].data for o in on_server.loss_fn_outputs] == \
        [o["logprobs"].data for o in on_client.loss_fn_outputs]


def test_loss_handles_belong_to_their_session(server: Server, service_client: Make,
                                              new_key: Callable[[], str]) -> None:
    owner = service_client()
    handle = owner.create_custom_loss(ppo, CASES["ppo"][1]).result()
    other_session = service_client()  # another session (and tenant)
    tc = other_session.create_lora_training_client(base_model=MODEL, rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match="no custom loss"):
        tc.forward_backward(ppo_data(), "custom", {"loss_id": handle.loss_id}).result()
    tc.forward_backward([datum([2, 3, 4], weights=[1.0] * 3)], "cross_entropy").result()
    request = {"session_id": owner.holder.get_session_id(), "custom_loss_seq_id": 99,
               "name": "x", "inputs": [{"name": "logprobs", "rank": 1}],
               "graph": {"nodes": []}, "type": "create_custom_loss"}
    stranger = httpx.post(f"{server.url}/api/v1/create_custom_loss", json=request,
                          headers={"X-API-Key": new_key()}, trust_env=False, timeout=30)
    assert stranger.status_code == 404


def test_a_datum_missing_an_input_fails_only_its_request(service_client: Make) -> None:
    client = service_client()
    handle = client.create_custom_loss(ppo, CASES["ppo"][1]).result()
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    bad = [datum([3, 8, 12, 6], sampling_logprobs=[-6.0] * 4)]
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn_inputs\.advantages"):
        tc.forward_backward(bad, "custom", {"loss_id": handle.loss_id}).result()
    assert tc.forward_backward_custom(ppo_data(), handle).result().metrics["loss:sum"] != 0


def test_a_retried_create_keeps_its_loss_and_a_reused_seq_id_fails(server: Server,
                                                                   service_client: Make,
                                                                   new_key: Callable[[], str]
                                                                   ) -> None:
    from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

    key = new_key()
    sid = service_client(key).holder.get_session_id()

    def create(fn: Any, ranks: dict[str, int]) -> dict[str, Any]:
        graph = encode_graph(trace_loss(fn, ranks, sid)).model_dump(mode="json")
        body = {"session_id": sid, "custom_loss_seq_id": 5, "name": fn.__name__,
                "inputs": [{"name": n, "rank": r} for n, r in ranks.items()], "graph": graph}
        headers = {"X-API-Key": key}
        submitted = httpx.post(f"{server.url}/api/v1/create_custom_loss", json=body,
                               headers=headers, trust_env=False, timeout=30).json()
        return dict(httpx.post(f"{server.url}/api/v1/retrieve_future", json=submitted,
                               headers=headers, trust_env=False, timeout=30).json())

    first = create(ppo, CASES["ppo"][1])
    assert first == {"type": "create_custom_loss", "loss_id": f"{sid}:loss:5"}
    assert create(ppo, CASES["ppo"][1]) == first, "a retry gets the same loss"
    other = create(anchored_nll, CASES["anchored_nll"][1])
    assert other["category"] == "user" and "custom_loss_seq_id" in other["error"]
