"""Safe grading of generated clamp code: a restricted AST interpreter, never `exec`.

Generated code is parsed with `ast` and interpreted node by node over a whitelist (one function
`clamp(x, lo, hi)`; return / if / assignment; arithmetic, comparisons, boolean ops, min/max/abs).
Loops, imports, attribute access, calls to anything else and I/O are refused before running; a
step budget bounds evaluation. Any refusal or runtime error scores 0 and the run goes on.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraplex.demo.clamp_task import Fixture

MAX_STEPS = 10_000
MAX_SOURCE_CHARS = 4_000

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_CALLS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}


class Refused(Exception):
    """The code uses something outside the whitelist, or ran out of steps."""


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


@dataclass(frozen=True)
class Grade:
    """Outcome of grading one completion."""

    passed: int
    total: int
    error: str | None = None

    @property
    def all_passed(self) -> bool:
        return self.error is None and self.passed == self.total


class _Interpreter:
    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self.steps = 0

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise Refused("step budget exceeded")

    def run_block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self._tick()
            if isinstance(stmt, ast.Return):
                raise _Return(self.eval(stmt.value) if stmt.value is not None else None)
            if isinstance(stmt, ast.If):
                self.run_block(stmt.body if self.eval(stmt.test) else stmt.orelse)
            elif isinstance(stmt, ast.Assign):
                value = self.eval(stmt.value)
                for target in stmt.targets:
                    if not isinstance(target, ast.Name):
                        raise Refused("only plain names may be assigned")
                    self.env[target.id] = value
            elif not isinstance(stmt, ast.Pass):
                raise Refused(f"statement {type(stmt).__name__} is not allowed")

    def eval(self, node: ast.expr) -> Any:
        self._tick()
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in self.env:
                raise Refused(f"unknown name {node.id!r}")
            return self.env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            value = self.eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else (
                +value if isinstance(node.op, ast.UAdd) else not value)
        if isinstance(node, ast.BoolOp):
            return self._bool_op(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.IfExp):
            return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id not in _CALLS or node.keywords or not node.args:
                raise Refused(f"call to {node.func.id!r} is not allowed")
            return _CALLS[node.func.id](*[self.eval(a) for a in node.args])
        raise Refused(f"expression {type(node).__name__} is not allowed")

    def _bool_op(self, node: ast.BoolOp) -> Any:
        is_and = isinstance(node.op, ast.And)
        value: Any = is_and
        for operand in node.values:
            value = self.eval(operand)
            if bool(value) != is_and:
                return value
        return value

    def _compare(self, node: ast.Compare) -> bool:
        left = self.eval(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            if type(op) not in _CMPOPS:
                raise Refused(f"comparison {type(op).__name__} is not allowed")
            right = self.eval(comparator)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True


def extract_function(source: str) -> ast.FunctionDef:
    """Parse `source` and return its single `clamp(x, lo, hi)` definition, or raise Refused."""
    text = source.replace("```python", "").replace("```", "").strip()
    if len(text) > MAX_SOURCE_CHARS:
        raise Refused("completion too long")
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        raise Refused(f"syntax error: {exc}") from None
    funcs = [n for n in module.body if isinstance(n, ast.FunctionDef)]
    if len(module.body) != 1 or len(funcs) != 1 or funcs[0].name != "clamp":
        raise Refused("expected exactly one function named clamp")
    func = funcs[0]
    args = func.args
    if func.decorator_list or args.defaults or args.vararg or args.kwarg or args.kwonlyargs:
        raise Refused("clamp must take exactly (x, lo, hi)")
    if [a.arg for a in args.args] != ["x", "lo", "hi"] or args.posonlyargs:
        raise Refused("clamp must take exactly (x, lo, hi)")
    return func


def grade(source: str, fixtures: tuple[Fixture, ...]) -> Grade:
    """Run `clamp` from `source` on every fixture; errors and refusals give a failing grade."""
    try:
        func = extract_function(source)
    except Refused as exc:
        return Grade(0, len(fixtures), str(exc))
    passed = 0
    for x, lo, hi, want in fixtures:
        interp = _Interpreter({"x": x, "lo": lo, "hi": hi})
        try:
            interp.run_block(func.body)
            result = None
        except _Return as ret:
            result = ret.value
        except Refused as exc:
            return Grade(passed, len(fixtures), str(exc))
        except (ArithmeticError, TypeError, ValueError, RecursionError) as exc:
            return Grade(passed, len(fixtures), f"{type(exc).__name__}: {exc}")
        passed += int(result == want and not isinstance(result, bool))
    return Grade(passed, len(fixtures))


def reward(source: str, fixtures: tuple[Fixture, ...]) -> float:
    """1.0 when every fixture passes, else 0.0."""
    return 1.0 if grade(source, fixtures).all_passed else 0.0
