"""The custom-loss interpreter against torch.fx itself: the graph the SDK traces and encodes,
rebuilt by `run_graph` from the allow-list, gives bitwise the loss, metrics and gradients of
the SDK's own traced GraphModule; oversized and failing nodes are user errors naming them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from loraplex.domain.custom_loss import CustomLoss, LossNode, check_graph
from loraplex.engine.losses.custom_graph import FUNCTIONS, METHODS, run_graph
from loraplex.errors import UserError


def clipped(logprobs, old, advantages):  # type: ignore[no-untyped-def]
    ratio = torch.exp(logprobs - old)
    loss = -torch.minimum(ratio * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages).sum()
    n = logprobs.shape[0]
    return loss / n + F.softplus(logprobs[1:]).mean(), {"custom/ratio:mean": ratio.mean()}


def pairwise(logprobs, other):  # type: ignore[no-untyped-def]
    grid = logprobs.unsqueeze(1) - other.unsqueeze(0)
    return -F.logsigmoid(grid).sum(), {}


def rebuilt(fn, ranks) -> tuple[CustomLoss, torch.fx.GraphModule]:  # type: ignore[no-untyped-def]
    handle = trace_loss(fn, ranks, "s")
    nodes = [LossNode(n.op, n.name, n.target, tuple(n.args), dict(n.kwargs))
             for n in encode_graph(handle).nodes]
    inputs = list(ranks.items())
    check_graph(nodes, inputs)
    return CustomLoss("s:loss:0", "t", "s", fn.__name__, tuple(inputs), tuple(nodes)), \
        handle.graph


def test_rebuilt_graph_matches_the_sdk_traced_module_bitwise() -> None:
    loss, module = rebuilt(clipped, {"logprobs": 1, "old": 1, "advantages": 1})
    generator = torch.Generator().manual_seed(0)
    args = [-torch.rand(7, generator=generator) * 5 for _ in range(2)]
    advantages = torch.randn(7, generator=generator)
    ours = args[0].clone().requires_grad_(True)
    theirs = args[0].clone().requires_grad_(True)
    value, metrics = run_graph(loss, [ours, args[1], advantages])
    expected, expected_metrics = module(theirs, args[1], advantages)
    value.backward()
    expected.backward()
    assert torch.equal(value, expected)
    assert torch.equal(metrics["custom/ratio:mean"], expected_metrics["custom/ratio:mean"])
    assert ours.grad is not None and theirs.grad is not None
    assert torch.equal(ours.grad, theirs.grad)


def test_an_oversized_broadcast_is_refused_before_it_is_computed() -> None:
    loss, _ = rebuilt(pairwise, {"logprobs": 1, "other": 1})
    small, _ = run_graph(loss, [torch.zeros(4), torch.zeros(3)])
    assert small.item() == pytest.approx(12 * 0.6931471805599453)
    with pytest.raises(UserError, match=r"node 'sub'.*imply 8388608 elements"):
        run_graph(loss, [torch.zeros(2048), torch.zeros(4096)])


def test_a_failing_node_is_a_user_error_naming_it() -> None:
    loss, _ = rebuilt(pairwise, {"logprobs": 1, "other": 1})
    with pytest.raises(UserError, match=r"node 'sub' \(call_function 'operator.sub'\): "
                       r"RuntimeError"):
        run_graph(loss, [torch.zeros(4), torch.zeros(2, 3)])  # [4, 1] - [1, 2, 3]


def test_every_allowed_name_has_its_function() -> None:
    assert FUNCTIONS["torch.exp"] is torch.exp and METHODS["sum"] is torch.Tensor.sum
    assert not any(name.startswith(("os.", "subprocess.", "builtins.")) for name in FUNCTIONS)


def hand_built(*calls: tuple[str, str, tuple[object, ...]]) -> CustomLoss:
    """``logprobs`` then one call per entry (name, target, args), the last one the loss."""
    nodes = [LossNode("placeholder", "logprobs", "logprobs", (), {})]
    nodes += [LossNode("call_function", name, target, args, {}) for name, target, args in calls]
    nodes.append(LossNode("output", "output", "output",
                          ({"tuple": [{"ref": calls[-1][0]}, {"dict": {}}]},), {}))
    return CustomLoss("s:loss:0", "t", "s", "hostile", (("logprobs", 1),), tuple(nodes))


@pytest.mark.parametrize(("calls", "message"), [
    ((("big", "operator.pow", (10, 10**7)),), r"node 'big'.*more than 63 bits"),
    ((("many", "operator.mul", ([0], 10**8)),), r"node 'many'.*repeats a sequence"),
    ((("text", "operator.mul", ("ab", 10**8)),), r"node 'text'.*repeats a sequence"),
])
def test_python_arithmetic_bombs_are_refused_before_they_are_computed(
        calls: tuple[tuple[str, str, tuple[object, ...]], ...], message: str) -> None:
    """Big-int powers held the GIL for seconds; list and string repetition escaped the size
    checks (+1.5 GB in two nodes)."""
    with pytest.raises(UserError, match=message):
        run_graph(hand_built(*calls), [torch.zeros(3)])


def gather_rows(logprobs, table, index):  # type: ignore[no-untyped-def]
    return table[index].sum() + logprobs.sum(), {}


def test_advanced_indexing_is_bounded_before_it_allocates() -> None:
    """``table[index]`` of a [64, 32768] table by 32,768 row ids would make 2^30 elements
    from arguments of 2.1M: refused on the shapes."""
    loss, _ = rebuilt(gather_rows, {"logprobs": 1, "table": 2, "index": 1})
    table = torch.zeros(64, 32)
    small, _ = run_graph(loss, [torch.zeros(3), table, torch.zeros(5, dtype=torch.int64)])
    assert small.item() == 0.0
    with pytest.raises(UserError, match=r"indexing makes 1073741824 elements"):
        run_graph(loss, [torch.zeros(3), torch.zeros(64, 32768),
                         torch.zeros(32768, dtype=torch.int64)])


def doubling(logprobs, a, b):  # type: ignore[no-untyped-def]
    grid = a.unsqueeze(1) - b.unsqueeze(0)
    for _ in range(6):
        grid = grid * 2.0
    return grid.sum() + logprobs.sum(), {}


def test_what_a_request_s_graphs_make_together_is_bounded() -> None:
    """Each node within the per-value bound, but 7 of them at 4M elements from 4K inputs:
    memory grew as nodes × datums with no total (~8.8 GB per datum at 512 nodes)."""
    loss, _ = rebuilt(doubling, {"logprobs": 1, "a": 1, "b": 1})
    run_graph(loss, [torch.zeros(3), torch.zeros(64), torch.zeros(64)])
    with pytest.raises(UserError, match=r"graphs make \d+ elements together"):
        run_graph(loss, [torch.zeros(3), torch.zeros(2048), torch.zeros(2048)])


def test_a_graph_past_its_time_fails_naming_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from loraplex.engine.losses import custom_graph

    loss, _ = rebuilt(pairwise, {"logprobs": 1, "other": 1})
    monkeypatch.setattr(custom_graph, "MAX_SECONDS_PER_DATUM", -1.0)
    with pytest.raises(UserError, match=r"node 'unsqueeze'.*ran past -1.0 s"):
        run_graph(loss, [torch.zeros(4), torch.zeros(3)])
