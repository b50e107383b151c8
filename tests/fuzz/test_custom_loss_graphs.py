"""Hostile custom-loss graphs thrown at ``POST /api/v1/create_custom_loss`` of a live server
(plus a hypothesis fuzz of random targets and arguments): each is refused with an HTTP 400
naming the node or field, nothing in them runs (sentinel files stay absent), a size bomb made
of allowed operations fails its future before allocating, and the server keeps serving."""

from __future__ import annotations

import copy
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinker import types
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from loraplex.config import DEFAULT_MODEL_NAME
from loraplex.domain.custom_loss import MAX_ARG_DEPTH, MAX_NODES

RANKS = {"logprobs": 1, "advantages": 1}


def ppo_like(logprobs, advantages):  # type: ignore[no-untyped-def]
    ratio = torch.exp(logprobs - logprobs.detach())
    loss = -(ratio * advantages).sum()
    return loss, {"custom/ratio:mean": ratio.mean()}


def outer_product(logprobs, advantages):  # type: ignore[no-untyped-def]
    """Allowed operations only, but [T] × [N] → [T, N] elements: a size bomb for large N."""
    grid = logprobs.unsqueeze(1) * advantages.unsqueeze(0)
    return grid.sum(), {}


@pytest.fixture(scope="module")
def session(fuzz_server: str) -> Iterator[tuple[tinker.ServiceClient, str]]:
    key = f"tml-fuzz-{uuid.uuid4().hex[:10]}"
    client = tinker.ServiceClient(base_url=fuzz_server, api_key=key)
    yield client, key
    client.close("success").result(timeout=90)


def body(session_id: str, nodes: list[dict[str, Any]], seq: int = 0) -> dict[str, Any]:
    return {"session_id": session_id, "custom_loss_seq_id": seq, "name": "hostile",
            "inputs": [{"name": n, "rank": r} for n, r in RANKS.items()],
            "graph": {"format": 1, "nodes": nodes}, "type": "create_custom_loss"}


def valid_nodes() -> list[dict[str, Any]]:
    graph = encode_graph(trace_loss(ppo_like, RANKS, "fuzz"))
    return [n.model_dump(mode="json") for n in graph.nodes]


def with_node(op: str, target: str, args: list[Any], kwargs: dict[str, Any] | None = None,
              ) -> list[dict[str, Any]]:
    """The valid graph with one extra node before its output (named ``evil``)."""
    nodes = valid_nodes()
    nodes.insert(-1, {"op": op, "name": "evil", "target": target, "args": args,
                      "kwargs": kwargs or {}})
    return nodes


def post(url: str, key: str, payload: Any) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/create_custom_loss", json=payload, trust_env=False,
                      headers={"X-API-Key": key}, timeout=30)


def hostile_nodes(sentinel: Path) -> dict[str, list[dict[str, Any]]]:
    lp = {"ref": "logprobs"}
    touch = f"touch {sentinel}"
    return {
        "builtins.eval": with_node("call_function", "builtins.eval",
                                   [f"open({str(sentinel)!r}, 'w')"]),
        "eval": with_node("call_function", "eval", [f"open({str(sentinel)!r}, 'w')"]),
        "exec": with_node("call_function", "builtins.exec", ["import os"]),
        "__import__": with_node("call_function", "builtins.__import__", ["os"]),
        "os.system": with_node("call_function", "os.system", [touch]),
        "posix.system": with_node("call_function", "posix.system", [touch]),
        "subprocess.run": with_node("call_function", "subprocess.run", [["touch", str(sentinel)]]),
        "subprocess.Popen": with_node("call_function", "subprocess.Popen", [touch],
                                      {"shell": True}),
        "subprocess.check_output": with_node("call_function", "subprocess.check_output",
                                             [["touch", str(sentinel)]]),
        "torch.load": with_node("call_function", "torch.load", [str(sentinel)]),
        "torch.save": with_node("call_function", "torch.save", [lp, str(sentinel)]),
        "torch.from_file": with_node("call_function", "torch.from_file", [str(sentinel)]),
        "torch.empty huge": with_node("call_function", "torch.empty", [1 << 40]),
        "torch.empty cube": with_node("call_function", "torch.empty", [4096, 4096, 4096]),
        "torch.ops": with_node("call_function", "torch.ops.aten.empty.memory_format",
                               [[1 << 40]]),
        "importlib": with_node("call_function", "importlib.import_module", ["os"]),
        "getattr __class__": with_node("call_function", "getattr", [lp, "__class__"]),
        "getattr __dict__": with_node("call_function", "getattr", [lp, "__dict__"]),
        "method __class__": with_node("call_method", "__class__", [lp]),
        "method __reduce_ex__": with_node("call_method", "__reduce_ex__", [lp, 2]),
        "method item": with_node("call_method", "item", [lp]),
        "method numpy": with_node("call_method", "numpy", [lp]),
        "method backward": with_node("call_method", "backward", [lp]),
        "method share_memory_": with_node("call_method", "share_memory_", [lp]),
        "method to cuda": with_node("call_method", "to", [lp, {"device": "cuda"}]),
        "operator.attrgetter": with_node("call_function", "operator.attrgetter", ["__class__"]),
        "call_module": with_node("call_module", "torch.nn.Linear", [lp]),
        "get_attr": with_node("get_attr", "weight", []),
        "unknown encoding": with_node("call_function", "torch.exp", [{"code": "os.system"}]),
        "object dtype": with_node("call_function", "torch.zeros_like", [lp],
                                  {"dtype": {"dtype": "object"}}),
        "dunder kwarg": with_node("call_function", "torch.exp", [lp], {"__class__": 1}),
    }


def structural_graphs() -> dict[str, list[dict[str, Any]]]:
    nodes = valid_nodes()
    cycle = copy.deepcopy(nodes)
    cycle[2]["args"] = [{"ref": cycle[3]["name"]}]  # detach ↔ sub refer to each other
    forward = copy.deepcopy(nodes)
    forward[2]["args"] = [{"ref": "output"}]
    deep: Any = {"ref": "logprobs"}
    for _ in range(MAX_ARG_DEPTH + 2):
        deep = [deep]
    duplicate = copy.deepcopy(nodes)
    duplicate[3]["name"] = duplicate[2]["name"]
    many = nodes[:2] + [{"op": "call_function", "name": f"n{i}", "target": "torch.exp",
                         "args": [{"ref": "logprobs"}], "kwargs": {}}
                        for i in range(MAX_NODES)] + nodes[2:]
    return {"cycle": cycle, "forward ref": forward,
            "deep args": with_node("call_function", "torch.stack", [deep]),
            "duplicate name": duplicate, "too many nodes": many,
            "no output": nodes[:-1], "output not last": nodes[-1:] + nodes[:-1]}


def test_hostile_graphs_are_refused_and_never_run(fuzz_server: str,
                                                  session: tuple[tinker.ServiceClient, str],
                                                  tmp_path: Path) -> None:
    client, key = session
    sid = client.holder.get_session_id()
    sentinel = tmp_path / "pwned"
    for label, nodes in {**hostile_nodes(sentinel), **structural_graphs()}.items():
        response = post(fuzz_server, key, body(sid, nodes))
        assert response.status_code == 400, (label, response.text)
        message = response.json()["error"]
        assert "graph.nodes" in message, (label, message)
        if label in hostile_nodes(sentinel):
            assert "'evil'" in message, (label, message)
    nested = "[" * 5000 + '{"ref": "logprobs"}' + "]" * 5000  # beyond any JSON encoder
    raw = json.dumps(body(sid, with_node("call_function", "torch.exp", ["DEEP"])))
    response = httpx.post(f"{fuzz_server}/api/v1/create_custom_loss", trust_env=False,
                          content=raw.replace('"DEEP"', nested), timeout=30,
                          headers={"X-API-Key": key, "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert not sentinel.exists(), "nothing ran"
    assert httpx.get(f"{fuzz_server}/api/v1/healthz", trust_env=False).status_code == 200


def test_a_size_bomb_of_allowed_operations_fails_before_allocating(
        session: tuple[tinker.ServiceClient, str]) -> None:
    client, _ = session
    handle = client.create_custom_loss(outer_product, RANKS).result()
    tc = client.create_lora_training_client(base_model=DEFAULT_MODEL_NAME, rank=4).result()
    wide = types.TensorData(data=[1.0] * 1_500_000, dtype="float32", shape=[1_500_000])
    datum = types.Datum(model_input=types.ModelInput.from_ints([2, 3, 4, 5]),
                        loss_fn_inputs={"target_tokens": [3, 4, 5, 6], "advantages": wide})
    with pytest.raises(tinker.RequestFailedError, match=r"node 'mul'.*imply 6000000 elements"):
        tc.forward_backward([datum], "custom", {"loss_id": handle.loss_id}).result()
    small = types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": [3, 4, 5, 6],
        "advantages": types.TensorData(data=[1.0] * 8, dtype="float32", shape=[8])})
    out = tc.forward_backward_custom([small], handle).result()  # the server keeps serving
    assert out.metrics["loss:sum"] == pytest.approx(sum(out.loss_fn_outputs[0]["logprobs"].data)
                                                    * 8, rel=1e-5)


TARGETS = st.sampled_from(["os.system", "builtins.eval", "subprocess.run", "torch.save",
                           "torch.load", "torch.empty", "getattr", "__class__", "posix.popen",
                           "torch.exp", "operator.getitem", "sum", "item", "pty.spawn"])
ARGS = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=20) | st.sampled_from([{"ref": "logprobs"},
                                                              {"ref": "nope"}]),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["ref", "tuple", "dict", "code"]),
                                      inner, min_size=1, max_size=1),
                    max_leaves=12)


@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["call_function", "call_method", "get_attr", "call_module"]),
       target=TARGETS, args=st.lists(ARGS, max_size=3))
def test_random_nodes_get_a_user_error_or_a_loss_never_a_crash(
        fuzz_server: str, session: tuple[tinker.ServiceClient, str], tmp_path: Path, op: str,
        target: str, args: list[Any]) -> None:
    client, key = session
    response = post(fuzz_server, key, body(client.holder.get_session_id(),
                                           with_node(op, target, args), seq=1000))
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]
    assert not os.path.exists(tmp_path / "pwned")


def repeat_bomb(logprobs, advantages):  # type: ignore[no-untyped-def]
    """Allowed operations only: a [T] input repeated a million times."""
    return logprobs.repeat(1_000_000).sum() + advantages.sum(), {}


def concat_bomb(logprobs, advantages):  # type: ignore[no-untyped-def]
    """Allowed operations only: concatenations doubling a [N] input 24 times."""
    x = advantages
    for _ in range(24):
        x = torch.cat([x, x])
    return logprobs.sum() * x.sum(), {}


def big_int(logprobs, advantages):  # type: ignore[no-untyped-def]
    """A constant past 63 bits (what a Python big-int pow leaves in a graph)."""
    return (logprobs * advantages).sum() * (7 ** 40), {}


def test_hostile_losses_beside_a_training_tenant_leave_it_bitwise_unaffected(
        fuzz_server: str, reference_server: str, tmp_path: Path) -> None:
    """While another tenant trains, one tenant throws size bombs made of allowed operations
    (outer product, repeat, repeated concatenation), a >63-bit constant and the refused
    graphs above: each fails its own request (a user error, or a 400 at creation), and the
    trainer's every step is bitwise its replay on a server nobody attacked."""
    from tests.fuzz.trainer import ConcurrentTrainer, assert_unaffected, replay

    key = f"tml-fuzz-{uuid.uuid4().hex[:10]}"
    client = tinker.ServiceClient(base_url=fuzz_server, api_key=key)
    trainer = ConcurrentTrainer(fuzz_server)
    trainer.start()
    started = time.monotonic()
    tc = client.create_lora_training_client(base_model=DEFAULT_MODEL_NAME, rank=4).result()
    wide = types.Datum(model_input=types.ModelInput.from_ints([2, 3, 4, 5]), loss_fn_inputs={
        "target_tokens": [3, 4, 5, 6],
        "advantages": types.TensorData(data=[1.0] * 1_500_000, dtype="float32",
                                       shape=[1_500_000])})
    outcomes: dict[str, str] = {}
    handles = {}
    for bomb in (outer_product, repeat_bomb, concat_bomb, big_int):
        try:
            handles[bomb.__name__] = client.create_custom_loss(bomb, RANKS).result()
        except tinker.BadRequestError as exc:  # refused when uploaded: nothing runs
            outcomes[bomb.__name__] = f"refused: {exc}"
    for _ in range(2):
        for name, handle in handles.items():
            with pytest.raises(tinker.RequestFailedError) as info:
                tc.forward_backward([wide], "custom", {"loss_id": handle.loss_id}).result()
            assert info.value.category == types.RequestErrorCategory.User, name
            outcomes[name] = f"failed: {info.value}"
        sid = client.holder.get_session_id()
        for label, nodes in hostile_nodes(tmp_path / "pwned").items():
            assert post(fuzz_server, key, body(sid, nodes)).status_code == 400, label
    window = (started, time.monotonic())
    trace = trainer.stop()
    client.close("success").result(timeout=90)
    assert "elements" in outcomes["outer_product"], outcomes
    assert "elements" in outcomes["concat_bomb"] or "refused" in outcomes["concat_bomb"]
    assert outcomes["big_int"].startswith("refused"), outcomes
    assert not (tmp_path / "pwned").exists()
    assert_unaffected(trainer, trace, replay(reference_server, len(trace.steps)), window)
