"""Server-side custom losses (`CustomLoss`): a torch.fx-traced per-datum loss the SDK uploads as
plain data (``CustomLossGraph``), and the structural checks that run before anything of it is
rebuilt.

Nothing here executes: a graph is a list of nodes naming functions by string. `check_graph`
accepts only the allow-listed names below, bounded counts and nesting, references to earlier
nodes only (so no cycles, no forward references), and the SDK's output shape ``(loss,
{metric: tensor})``; the engine maps each allowed name to its function from its own table.
Every rejection is a `UserError` naming the node. Pure Python (no torch).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from loraplex.errors import UserError, user_error

CustomLossFn = Literal["custom"]
CUSTOM_LOSS_FN: CustomLossFn = "custom"
"""The Tinker ``loss_fn`` of a forward_backward that runs an uploaded loss; its
``loss_fn_config`` is ``{"loss_id": ...}``."""

MAX_NODES = 512
MAX_ARG_ITEMS = 64
"""Most items in one node's (nested) arguments."""
MAX_ARG_DEPTH = 6
MAX_INPUTS = 16
MAX_NAME_CHARS = 64
MAX_STRING_CHARS = 64
MAX_ELEMENTS = 1 << 22
"""Most elements any one value of a running loss may have (inputs included): 16 MiB in fp32.
Checked before each call from its tensor arguments' shapes, and after it on its result."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_INPUT_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_KEYWORD = re.compile(r"[a-z][a-z0-9_]{0,31}")
METRIC_KEY = re.compile(r"custom/[a-z0-9_./-]{1,64}:(sum|mean)")

ELEMENTWISE = ("abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt",
               "rsqrt", "sigmoid", "tanh", "relu", "sign", "square", "reciprocal", "floor",
               "ceil", "round", "trunc", "logit", "erf", "sin", "cos", "isnan", "isfinite",
               "isinf", "logical_not", "nan_to_num")
BINARY = ("add", "sub", "mul", "div", "true_divide", "pow", "maximum", "minimum", "fmax",
          "fmin", "atan2", "logaddexp", "xlogy", "eq", "ne", "lt", "le", "gt", "ge",
          "logical_and", "logical_or", "remainder", "fmod")
REDUCTIONS = ("sum", "mean", "prod", "amax", "amin", "max", "min", "logsumexp", "cumsum",
              "std", "var", "norm", "argmax", "argmin", "all", "any", "count_nonzero")
SHAPING = ("clamp", "clip", "where", "masked_fill", "softmax", "log_softmax", "stack", "cat",
           "zeros_like", "ones_like", "full_like", "squeeze", "unsqueeze", "flatten",
           "reshape", "gather", "diff", "flip", "roll", "transpose")

ALLOWED_FUNCTIONS = frozenset(
    [f"torch.{n}" for n in (*ELEMENTWISE, *BINARY, *REDUCTIONS, *SHAPING)]
    + [f"torch._C._nn.{n}" for n in ("softplus", "log_sigmoid", "smooth_l1_loss",
                                     "huber_loss", "mse_loss", "l1_loss")]
    + [f"torch.nn.functional.{n}" for n in ("logsigmoid", "softplus", "relu", "sigmoid",
                                            "softmax", "log_softmax")]
    + [f"operator.{n}" for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow",
                                 "neg", "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge",
                                 "and_", "or_", "invert", "getitem")]
    + [f"math.{n}" for n in ("log", "log1p", "exp", "expm1", "sqrt", "tanh", "fabs", "floor",
                             "ceil", "isfinite", "isnan", "pow")]
    + ["getattr"]
)
"""Functions by the qualified name the SDK sends (``torch.exp``, ``operator.mul``; ``getattr``
for ``tensor.shape``). Nothing that reads or writes files, allocates by a size argument,
leaves torch (``item``), changes device or storage, or reaches Python internals."""

ALLOWED_METHODS = frozenset(
    (*ELEMENTWISE, *BINARY, *REDUCTIONS,
     *(n for n in SHAPING if n not in ("stack", "cat") and not n.endswith("_like")),
     "float", "double", "detach", "clone", "size", "dim", "numel", "view", "view_as",
     "reshape_as", "type_as", "t", "contiguous", "__getitem__", "masked_select"))
"""Tensor methods (``x.sum()``): the same arithmetic, no host, device, storage or
in-place methods."""

ALLOWED_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "T"})
"""What ``getattr(tensor, name)`` may read."""

DTYPES = frozenset({"float32", "float64", "int64", "int32", "bool"})
CONSTANT_KINDS = frozenset({"ref", "tuple", "dict", "slice", "ellipsis", "float", "dtype"})


@dataclass(frozen=True)
class LossNode:
    """One node, as the SDK encodes it (``args``/``kwargs`` in its JSON argument encoding)."""

    op: str
    name: str
    target: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class CustomLoss:
    """A stored loss: ``inputs`` is ``(name, rank)`` per parameter, ``logprobs`` first.

    Attributes:
        loss_id: ``{session_id}:loss:{custom_loss_seq_id}``.
        tenant, session_id: who may use it (anyone else gets a 404).
    """

    loss_id: str
    tenant: str
    session_id: str
    name: str
    inputs: tuple[tuple[str, int], ...]
    nodes: tuple[LossNode, ...]


def loss_id(session_id: str, custom_loss_seq_id: int) -> str:
    return f"{session_id}:loss:{custom_loss_seq_id}"


def check_inputs(inputs: list[tuple[str, int]]) -> None:
    """``logprobs`` (rank 1: this server's targets are ``[T]``), then named inputs of rank
    0, 1 or 2, at most `MAX_INPUTS` in all."""
    if not inputs or inputs[0] != ("logprobs", 1):
        raise user_error("inputs[0]", "must be logprobs with rank 1 (this server's targets "
                         "are [T]; top-K [T, K] targets are not supported for custom losses)")
    if len(inputs) > MAX_INPUTS:
        raise user_error("inputs", f"at most {MAX_INPUTS}, got {len(inputs)}")
    seen = set()
    for i, (name, rank) in enumerate(inputs):
        if not _INPUT_NAME.fullmatch(name) or name in seen:
            raise user_error(f"inputs[{i}].name", f"{name!r} is not a new lowercase name")
        if rank not in (0, 1, 2):
            raise user_error(f"inputs[{i}].rank", f"must be 0, 1 or 2, got {rank!r}")
        seen.add(name)


def check_graph(nodes: list[LossNode], inputs: list[tuple[str, int]]) -> None:
    """Raises UserError (field ``graph.nodes[i]``, naming the node) unless ``nodes`` is a
    graph this server may rebuild: see the module docstring."""
    check_inputs(inputs)
    if not 1 < len(nodes) <= MAX_NODES:
        raise user_error("graph.nodes", f"must hold 2 to {MAX_NODES} nodes, got {len(nodes)}")
    defined: set[str] = set()
    placeholders = [n.name for n in nodes if n.op == "placeholder"]
    if placeholders != [name for name, _ in inputs]:
        raise user_error("graph.nodes", f"placeholders {placeholders} must be the inputs "
                         f"{[name for name, _ in inputs]}, in order")
    for i, node in enumerate(nodes):
        _check_node(i, node, defined, is_last=i == len(nodes) - 1)
        defined.add(node.name)


def _check_node(i: int, node: LossNode, defined: set[str], is_last: bool) -> None:
    where = f"graph.nodes[{i}]"
    label = f"node {node.name!r} ({node.op} {node.target!r})"
    if not isinstance(node.name, str) or not _NAME.fullmatch(node.name) \
            or node.name in defined:
        raise user_error(f"{where}.name", f"{node.name!r} is not a new identifier")
    if (node.op == "output") != is_last:
        raise user_error(where, f"{label}: the output node must come last, once")
    if node.op == "placeholder":
        if node.args or node.kwargs:
            raise user_error(where, f"{label}: a placeholder takes no arguments")
        return
    if node.op == "call_function":
        if node.target not in ALLOWED_FUNCTIONS:
            raise user_error(where, f"{label}: function {node.target!r} is not allowed on "
                             "this server (allowed: torch / math / operator arithmetic)")
    elif node.op == "call_method":
        if node.target not in ALLOWED_METHODS:
            raise user_error(where, f"{label}: tensor method {node.target!r} is not allowed")
    elif node.op != "output":
        raise user_error(where, f"{label}: {node.op} nodes are not allowed (no modules, no "
                         "captured tensors)")
    counter = [0]
    try:
        for arg in (*node.args, *node.kwargs.values()):
            _check_arg(arg, defined, counter, 0)
        for key in node.kwargs:
            if not isinstance(key, str) or not _KEYWORD.fullmatch(key) or key == "out":
                raise user_error("kwargs", f"keyword {key!r} is not allowed")
    except UserError as err:
        raise user_error(where, f"{label}: {err.message}") from None
    if node.target == "getattr" and (len(node.args) != 2 or node.kwargs
                                     or node.args[1] not in ALLOWED_ATTRIBUTES):
        raise user_error(where, f"{label}: getattr may only read "
                         f"{sorted(ALLOWED_ATTRIBUTES)}")
    if node.op == "output":
        _check_output(where, label, node)


def _check_arg(arg: Any, defined: set[str], counter: list[int], depth: int) -> None:
    counter[0] += 1
    if counter[0] > MAX_ARG_ITEMS or depth > MAX_ARG_DEPTH:
        raise user_error("args", f"more than {MAX_ARG_ITEMS} items or nested deeper than "
                         f"{MAX_ARG_DEPTH}")
    if arg is None or isinstance(arg, (bool, int)):
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_ELEMENTS:
            raise user_error("args", f"integer {arg} is out of range")
        return
    if isinstance(arg, float):
        if not math.isfinite(arg):
            raise user_error("args", "non-finite floats are sent as {'float': ...}")
        return
    if isinstance(arg, str):
        if len(arg) > MAX_STRING_CHARS:
            raise user_error("args", "string too long")
        return
    if isinstance(arg, list):
        for item in arg:
            _check_arg(item, defined, counter, depth + 1)
        return
    if not isinstance(arg, dict) or len(arg) != 1:
        raise user_error("args", f"cannot decode argument {str(arg)[:80]!r}")
    (kind, value), = arg.items()
    _check_encoded(kind, value, defined, counter, depth)


def _check_encoded(kind: Any, value: Any, defined: set[str], counter: list[int],
                   depth: int) -> None:
    if kind not in CONSTANT_KINDS:
        raise user_error("args", f"argument kind {kind!r} is not allowed")
    if kind == "ref":
        if value not in defined:
            raise user_error("args", f"refers to {value!r}, which is not an earlier node")
    elif kind in ("tuple", "slice"):
        if not isinstance(value, list) or (kind == "slice" and len(value) != 3):
            raise user_error("args", f"bad {kind}")
        for item in value:
            _check_arg(item, defined, counter, depth + 1)
    elif kind == "dict":
        if not isinstance(value, dict):
            raise user_error("args", "bad dict")
        for key, item in value.items():
            if not isinstance(key, str) or len(key) > MAX_STRING_CHARS + 16:
                raise user_error("args", "bad dict key")
            _check_arg(item, defined, counter, depth + 1)
    elif kind == "float":
        if value not in ("inf", "-inf", "nan"):
            raise user_error("args", f"bad float {value!r}")
    elif kind == "dtype":
        if value not in DTYPES:
            raise user_error("args", f"dtype {value!r} is not allowed")
    elif kind == "ellipsis" and value is not True:
        raise user_error("args", "bad ellipsis")


def _check_output(where: str, label: str, node: LossNode) -> None:
    shape_ok = (len(node.args) == 1 and isinstance(node.args[0], dict)
                and isinstance(node.args[0].get("tuple"), list)
                and len(node.args[0]["tuple"]) == 2)
    if not shape_ok:
        raise user_error(where, f"{label}: must return (loss, metrics)")
    loss, metrics = node.args[0]["tuple"]
    if not (isinstance(loss, dict) and "ref" in loss):
        raise user_error(where, f"{label}: the loss must be a tensor node")
    if not (isinstance(metrics, dict) and isinstance(metrics.get("dict"), dict)):
        raise user_error(where, f"{label}: metrics must be a dict")
    for key, value in metrics["dict"].items():
        if not METRIC_KEY.fullmatch(key) or not (isinstance(value, dict) and "ref" in value):
            raise user_error(where, f"{label}: metric {key!r} must be named "
                             "custom/<name>:sum or :mean and be a tensor node")
