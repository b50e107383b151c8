"""A training cycle's engine call: the forward_backward batch, then the optim_step batch, as one
`BatchExecutor.run_cycle` call (one round trip to a remote worker instead of two), and what it
returns (`CycleOutcome`).

`run_cycle_calls` is the cycle for executors that compose their two batch calls, and the
definition of what a native one must do: a call that raises instead of answering per item
(a bug, or one domain error for the whole call) is caught as a `CallCrash`, so it fails only
its own items; after a forward_backward crash, the steps of the adapters in that batch are not
applied (no step on partial gradients) and the other steps still run. A `WorkerLostError`
propagates: nothing of the cycle can be trusted then. Knows nothing of work items or futures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from loraplex.domain.results import FwdBwdOutcome, OptimOutcome
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import WorkerLostError

W = TypeVar("W")
R = TypeVar("R")


@dataclass(frozen=True)
class CallCrash:
    """A batch call of a cycle that raised instead of answering per item: the server logs
    ``error`` under a fresh error id and fails every item of that call with the id."""

    error: Exception


@dataclass(frozen=True)
class CycleOutcome:
    """What one `run_cycle` call returns.

    Attributes:
        forward_backward: one outcome per forward_backward work, in order, or the crash of
            that call.
        optim_step: one outcome per step that ran, in order (those of `crashed_adapters` are
            left out), or the crash of that call.
        train_s, optim_s: seconds the executor spent in each of the two parts.
    """

    forward_backward: tuple[FwdBwdOutcome, ...] | CallCrash
    optim_step: tuple[OptimOutcome, ...] | CallCrash
    train_s: float = 0.0
    optim_s: float = 0.0


def crashed_adapters(fwd_bwd: Sequence[ForwardBackwardWork],
                     outcome: tuple[FwdBwdOutcome, ...] | CallCrash) -> frozenset[str]:
    """The adapters whose step a cycle must not apply: those of its forward_backward batch
    when that call crashed (their gradients are partial), else none."""
    if isinstance(outcome, CallCrash):
        return frozenset(w.adapter_id for w in fwd_bwd)
    return frozenset()


def run_cycle_calls(
        forward_backward: Callable[[list[ForwardBackwardWork]], Sequence[FwdBwdOutcome]],
        optim_step: Callable[[list[OptimStepWork]], Sequence[OptimOutcome]],
        fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork],
        catch: type[Exception] = Exception) -> CycleOutcome:
    """One cycle as two batch calls (see the module docstring); an empty batch is not called.

    Args:
        catch: what a crash is (a model-parallel rank catches only domain errors: anything
            else must lose its group).

    Raises:
        WorkerLostError: from either call, as is.
    """
    start = time.perf_counter()
    fwd_out = _guarded(forward_backward, list(fwd_bwd), catch)
    mid = time.perf_counter()
    crashed = crashed_adapters(fwd_bwd, fwd_out)
    steps = [w for w in optim if w.adapter_id not in crashed]
    optim_out = _guarded(optim_step, steps, catch)
    return CycleOutcome(fwd_out, optim_out, mid - start, time.perf_counter() - mid)


def _guarded(call: Callable[[list[W]], Sequence[R]], works: list[W],
                   catch: type[Exception]) -> tuple[R, ...] | CallCrash:
    if not works:
        return ()
    try:
        outcomes = tuple(call(works))
    except WorkerLostError:
        raise
    except catch as exc:
        return CallCrash(exc)
    if len(outcomes) != len(works):
        return CallCrash(RuntimeError(f"executor returned {len(outcomes)} outcomes for "
                                      f"{len(works)} works"))
    return outcomes
