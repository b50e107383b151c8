"""Running an uploaded custom loss (`CustomLoss`, checked by `domain.custom_loss.check_graph`)
inside the trainer's packed forward_backward, and validating a request's data against it.

The graph is interpreted node by node: each call is looked up in `FUNCTIONS` / `METHODS`,
tables built here from the domain's allow-lists (importing fails if a name has no function),
so nothing a client sends is ever resolved by name, evaluated or compiled. Before each call
the elements its tensor arguments imply (their total, and their broadcast) are checked against
`MAX_ELEMENTS`, and after it the result; any failure is a `UserError` naming the node.

Budgets, so that one tenant's graph cannot hold the shared training thread or its memory:
every operand and result of a node is a tensor within `MAX_ELEMENTS`, a bool, a float, an int
of at most 63 bits, a dtype, a slice, a short string (attribute names) or a short tuple/list
(`MAX_SEQUENCE` entries: shapes);
Python integer powers and sequence repetitions are refused before they are computed; advanced
indexing is bounded before it allocates; the values a request's graphs make together are
bounded (`GraphBudget`: a multiple of the request's own inputs); and a datum's graph that runs
longer than `MAX_SECONDS_PER_DATUM` fails, naming the node it got to.

Semantics are the SDK's ``run_loss_handle``: the graph runs once per datum on that datum's
target logprobs ``[T]`` and its inputs; losses are summed in datum order, metrics summed in
Python floats (``:mean`` ones divided by the number of datums). The loss is not per token, so
``elementwise_loss`` is zero.
"""

from __future__ import annotations

import contextlib
import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loraplex.domain.custom_loss import (
    ALLOWED_FUNCTIONS,
    ALLOWED_METHODS,
    MAX_ELEMENTS,
    CustomLoss,
    LossNode,
)
from loraplex.domain.data import Datum
from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.validation import ValidatedLoss, as_array, concatenate, datum_arrays
from loraplex.errors import UserError, user_error


def _safe_getattr(value: Any, name: str) -> Any:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"getattr of a {type(value).__name__}")
    return getattr(value, name)  # name ∈ ALLOWED_ATTRIBUTES (check_graph)


def _function(qualified: str) -> Callable[..., Any]:
    if qualified == "getattr":
        return _safe_getattr
    module, _, name = qualified.rpartition(".")
    roots = {"torch": torch, "torch._C._nn": torch._C._nn,
             "torch.nn.functional": torch.nn.functional, "operator": operator, "math": math}
    function: Callable[..., Any] = getattr(roots[module], name)
    return function


FUNCTIONS: dict[str, Callable[..., Any]] = {q: _function(q) for q in sorted(ALLOWED_FUNCTIONS)}
METHODS: dict[str, Callable[..., Any]] = {m: getattr(torch.Tensor, m)
                                          for m in sorted(ALLOWED_METHODS)}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "int32": torch.int32, "bool": torch.bool}
MAX_SEQUENCE = 64
"""Most entries of a tuple or list a node may take or make (shapes, dims, stack inputs)."""
MAX_INT_BITS = 63
MAX_SECONDS_PER_DATUM = 5.0
"""Longest a datum's graph may run (checked between nodes)."""
ELEMENTS_PER_INPUT = 256
"""`GraphBudget`: a request's graphs may make this many elements per input element (plus
`MAX_ELEMENTS` × 4)."""


class GraphBudget:
    """The elements one request's graphs may make together, over all its datums (autograd
    keeps them until the backward): ``ELEMENTS_PER_INPUT`` × the request's input elements
    (logprobs and loss inputs) + 4 × `MAX_ELEMENTS`."""

    def __init__(self, input_elements: int) -> None:
        self.limit = ELEMENTS_PER_INPUT * input_elements + 4 * MAX_ELEMENTS
        self.used = 0

    def spend(self, node: LossNode, elements: int) -> None:
        self.used += elements
        if self.used > self.limit:
            raise _node_error(node, f"the request's graphs make {self.used} elements "
                              f"together (limit {self.limit})")


def run_graph(loss: CustomLoss, args: Sequence[torch.Tensor],
              budget: GraphBudget | None = None
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One datum: ``(loss, metrics)`` of the graph on ``args`` (logprobs first)."""
    budget = budget or GraphBudget(sum(a.numel() for a in args))
    env: dict[str, Any] = {}
    placeholders = iter(args)
    started = time.monotonic()
    for node in loss.nodes:
        if node.op == "placeholder":
            env[node.name] = next(placeholders)
        elif node.op == "output":
            return _output(node, env)
        else:
            env[node.name] = _call(node, env, budget)
            if time.monotonic() - started > MAX_SECONDS_PER_DATUM:
                raise _node_error(node, f"the graph ran past {MAX_SECONDS_PER_DATUM} s for "
                                  "one datum")
    raise AssertionError("check_graph guarantees an output node")


def _call(node: LossNode, env: dict[str, Any], budget: GraphBudget) -> Any:
    args = [_value(a, env) for a in node.args]
    kwargs = {k: _value(v, env) for k, v in node.kwargs.items()}
    for value in (*args, *kwargs.values()):
        _check_operand(node, value)
    _check_size(node, [*args, *kwargs.values()])
    _check_python_arithmetic(node, args)
    _check_indexing(node, args)
    try:
        if node.op == "call_method":
            if not args or not isinstance(args[0], torch.Tensor):
                raise TypeError("a tensor method needs a tensor")
            result = METHODS[node.target](*args, **kwargs)
        else:
            result = FUNCTIONS[node.target](*args, **kwargs)
    except UserError:
        raise
    except Exception as exc:  # torch's shape / dtype errors are the graph's fault
        raise _node_error(node, f"{type(exc).__name__}: {str(exc)[:300]}") from None
    if isinstance(result, torch.Tensor) and result.numel() > MAX_ELEMENTS:
        raise _node_error(node, f"makes {result.numel()} elements (limit {MAX_ELEMENTS})")
    _check_operand(node, result, "makes")
    budget.spend(node, sum(t.numel() for t in _tensors(result)))
    return result


def _check_operand(node: LossNode, value: Any, verb: str = "takes") -> None:
    """A value a node takes or makes is one of the kinds the module docstring lists."""
    if isinstance(value, (torch.Tensor, float, bool, torch.dtype, slice)) or value is None \
            or value is Ellipsis:
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise _node_error(node, f"{verb} an integer of {value.bit_length()} bits "
                              f"(limit {MAX_INT_BITS})")
        return
    if isinstance(value, str):  # attribute names, reduction modes
        if len(value) > MAX_SEQUENCE:
            raise _node_error(node, f"{verb} a string of {len(value)} characters (limit "
                              f"{MAX_SEQUENCE})")
        return
    if isinstance(value, (tuple, list)):
        if len(value) > MAX_SEQUENCE:
            raise _node_error(node, f"{verb} a sequence of {len(value)} entries (limit "
                              f"{MAX_SEQUENCE})")
        for item in value:
            _check_operand(node, item, verb)
        return
    if isinstance(value, dict) and verb == "takes":
        for item in value.values():
            _check_operand(node, item, verb)
        return
    raise _node_error(node, f"{verb} a {type(value).__name__}, which a loss graph may not use")


def _check_python_arithmetic(node: LossNode, args: list[Any]) -> None:
    """Refuse, before computing it, a Python integer power of more than 63 bits and a
    sequence repeated past `MAX_SEQUENCE` (Python would build them holding the GIL)."""
    if node.op != "call_function" or len(args) != 2:
        return
    left, right = args
    if node.target in ("operator.pow", "math.pow") and isinstance(left, int) \
            and isinstance(right, int) and right > 0 \
            and max(abs(left).bit_length() - 1, 0) * right > MAX_INT_BITS:
        raise _node_error(node, f"{left} ** {right} has more than {MAX_INT_BITS} bits")
    if node.target == "operator.mul":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, tuple, list)) and isinstance(times, int) \
                    and len(seq) * max(times, 0) > MAX_SEQUENCE:
                raise _node_error(node, f"repeats a sequence to {len(seq) * times} entries "
                                  f"(limit {MAX_SEQUENCE})")


def _check_indexing(node: LossNode, args: list[Any]) -> None:
    """Bound ``x[index]`` before it allocates when the index holds integer tensors (advanced
    indexing: the result has the index's shape times the dimensions it leaves)."""
    if node.target not in ("operator.getitem", "__getitem__") or len(args) != 2 \
            or not isinstance(args[0], torch.Tensor):
        return
    source, index = args
    entries = index if isinstance(index, tuple) else (index,)
    tensors = [e for e in entries if isinstance(e, torch.Tensor) and e.dtype != torch.bool]
    if not tensors:
        return  # slices, ints and masks never make more than the source holds
    with contextlib.suppress(RuntimeError):  # not broadcastable: the call will say so
        indexed = math.prod(torch.broadcast_shapes(*(t.shape for t in tensors)))
        consumed = sum(e.ndim if isinstance(e, torch.Tensor) else 0 if e is None else 1
                       for e in entries if e is not Ellipsis)
        left = math.prod(source.shape[consumed:]) if consumed <= source.ndim else 1
        if indexed * left > MAX_ELEMENTS:
            raise _node_error(node, f"indexing makes {indexed * left} elements (limit "
                              f"{MAX_ELEMENTS})")


def _check_size(node: LossNode, args: list[Any]) -> None:
    """Refuse a call whose tensor arguments imply more than `MAX_ELEMENTS` (so an outer
    product or a concatenation too large is never allocated)."""
    shapes = [t.shape for t in _tensors(args)]
    if not shapes:
        return
    total = sum(math.prod(s) for s in shapes)
    with contextlib.suppress(RuntimeError):  # not broadcastable: the call will say so
        total = max(total, math.prod(torch.broadcast_shapes(*shapes)))
    if total > MAX_ELEMENTS:
        raise _node_error(node, f"its arguments imply {total} elements (limit {MAX_ELEMENTS})")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _value(arg: Any, env: dict[str, Any]) -> Any:
    """Decode one argument (the SDK's encoding; its shape was checked by `check_graph`)."""
    if isinstance(arg, list):
        return [_value(a, env) for a in arg]
    if not isinstance(arg, dict):
        return arg
    (kind, value), = arg.items()
    if kind == "ref":
        return env[value]
    if kind == "tuple":
        return tuple(_value(a, env) for a in value)
    if kind == "dict":
        return {k: _value(v, env) for k, v in value.items()}
    if kind == "slice":
        return slice(*(_value(a, env) for a in value))
    if kind == "float":
        return float(value)
    if kind == "dtype":
        return DTYPES[value]
    return Ellipsis


def _output(node: LossNode, env: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss_arg, metrics_arg = node.args[0]["tuple"]
    loss = env[loss_arg["ref"]]
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise _node_error(node, f"the loss must be a scalar tensor, got {shape}")
    metrics = {key: env[ref["ref"]] for key, ref in metrics_arg["dict"].items()}
    for key, value in metrics.items():
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise _node_error(node, f"metric {key!r} must be a one-element tensor")
    return loss, metrics


def _node_error(node: LossNode, problem: str) -> UserError:
    return user_error("loss_fn_config.loss_id",
                      f"custom loss node {node.name!r} ({node.op} {node.target!r}): {problem}")


# ---- a request's data → a ValidatedLoss the trainer runs --------------------------------------


@dataclass(frozen=True)
class _BoundCustomLoss:
    """The loss function of one request: the graph and each datum's inputs."""

    loss: CustomLoss
    inputs_per_datum: tuple[tuple[torch.Tensor, ...], ...]

    def __call__(self, logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput:
        total: torch.Tensor | None = None
        sums: dict[str, float] = {}
        budget = GraphBudget(logprobs_T.numel() + sum(
            t.numel() for extra in self.inputs_per_datum for t in extra))
        for logprobs, extra in zip(inputs.split(logprobs_T), self.inputs_per_datum,
                                   strict=True):
            loss, metrics = run_graph(self.loss, [logprobs, *(x.to(logprobs.device)
                                                              for x in extra)], budget)
            total = loss if total is None else total + loss
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach().reshape(()).item())
        assert total is not None  # a request with datums (empty ones never reach the loss)
        n = len(self.inputs_per_datum)
        out = {key: torch.tensor(v / n if key.endswith(":mean") else v, dtype=torch.float64)
               for key, v in sums.items()}
        out["loss:sum"] = total.detach()
        return LossOutput(total, torch.zeros_like(logprobs_T.detach()), out)


def validate_custom(loss: CustomLoss, data: Sequence[Datum], vocab_size: int) -> ValidatedLoss:
    """Check each datum against the loss's declared inputs (present, declared rank, float32 or
    int64, finite floats, within `MAX_ELEMENTS` together), as the SDK's ``check_loss_inputs``
    does on the client.

    Raises:
        UserError: naming ``data[i].loss_fn_inputs.<key>``.
    """
    spec = LossSpec(name="custom", fn=_unbound, required_inputs=())
    arrays = [datum_arrays(i, d, spec, vocab_size) for i, d in enumerate(data)]
    per_datum = tuple(_datum_inputs(i, d, loss) for i, d in enumerate(data))
    numel = sum(t.numel() for extra in per_datum for t in extra)
    if numel > MAX_ELEMENTS:
        raise user_error("data", f"custom loss inputs hold {numel} elements "
                         f"(limit {MAX_ELEMENTS})")
    bound = _BoundCustomLoss(loss, per_datum)
    inputs = concatenate(spec, {}, arrays, [d.length for d in data])
    return ValidatedLoss(LossSpec(name="custom", fn=bound, required_inputs=()), inputs)


def _datum_inputs(index: int, datum: Datum, loss: CustomLoss) -> tuple[torch.Tensor, ...]:
    out = []
    for name, rank in loss.inputs[1:]:
        field = f"data[{index}].loss_fn_inputs.{name}"
        tensor = datum.loss_fn_inputs.get(name)
        if tensor is None:
            raise user_error(field, f"missing (custom loss {loss.name!r} takes it)")
        shape = tuple(tensor.shape)
        if rank == 0 and shape == (1,):
            shape = ()  # the wire has no 0-d shape: a scalar arrives as [1]
        if len(shape) != rank:
            raise user_error(field, f"rank {len(shape)}, but {loss.name!r} declared {rank}")
        if tensor.numel != len(tensor.data) or tensor.numel > MAX_ELEMENTS:
            raise user_error(field, f"shape {list(shape)} holds {len(tensor.data)} values")
        values = as_array(tensor.data, tensor.dtype).reshape(shape)
        if tensor.dtype == "float32" and not np.isfinite(values).all():
            raise user_error(field, "non-finite value")
        out.append(torch.from_numpy(values.copy()))
    return tuple(out)


def _unbound(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    raise AssertionError("validate_custom binds the loss before it runs")
