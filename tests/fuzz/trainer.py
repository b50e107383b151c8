"""The concurrently training tenant of the fuzz suites, and its replay on an unfuzzed server.

`ConcurrentTrainer` drives the official SDK in a thread: a seeded LoRA, one saved checkpoint,
then forward_backward + optim_step steps until told to stop. Each step's loss, per-token
logprobs, elementwise losses and optimizer metrics are kept as raw bits (`TrainingTrace`).
`replay` runs the same number of steps on another server; the engine is batch-invariant, so
whatever the fuzzer packed beside the trainer, the two traces must be equal bit for bit.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field

import httpx
import numpy as np
import tinker
from tinker import types

from loraplex.config import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
RANK = 4
SEED = 0
ADAM = types.AdamParams(learning_rate=0.002)
CHECKPOINT_NAME = "trainer-ckpt"
MAX_STEPS = 80  # bounds the replay
PAUSE_S = 0.2  # between steps: spreads the steps over the fuzzing without changing them
DATA = [types.Datum(model_input=types.ModelInput.from_ints([2 + i, 7, 11 + i, 5, 9, 3 * i + 1]),
                    loss_fn_inputs={"target_tokens": [7, 11 + i, 5, 9, 3 * i + 1, 2 + i],
                                    "weights": [1.0, 1.0, 0.5, 1.0, 1.0, 2.0]})
        for i in range(4)]


def new_key(label: str) -> str:
    return f"tml-fuzz-{label}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class StepBits:
    """One training step as raw bytes (float32 arrays, float64 metrics)."""

    loss_fn_outputs: tuple[tuple[bytes, bytes], ...]  # per datum: (logprobs, elementwise_loss)
    forward_metrics: tuple[tuple[str, bytes], ...]
    optim_metrics: tuple[tuple[str, bytes], ...]


@dataclass
class TrainingTrace:
    steps: list[StepBits] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)  # monotonic start, end


def _metric_bits(metrics: dict[str, float] | None) -> tuple[tuple[str, bytes], ...]:
    return tuple(sorted((k, struct.pack("<d", v)) for k, v in (metrics or {}).items()))


def _step(tc: tinker.TrainingClient) -> StepBits:
    fb = tc.forward_backward(DATA, "cross_entropy")
    opt = tc.optim_step(ADAM)  # pipelined, as real clients do
    out, stepped = fb.result(timeout=120), opt.result(timeout=120)
    outputs = tuple((np.asarray(o["logprobs"].data, dtype="<f4").tobytes(),
                     np.asarray(o["elementwise_loss"].data, dtype="<f4").tobytes())
                    for o in out.loss_fn_outputs)
    return StepBits(outputs, _metric_bits(out.metrics), _metric_bits(stepped.metrics))


@dataclass(frozen=True)
class TrainerIds:
    """What the fuzzer may aim at (with its own key) to try to reach the trainer's state."""

    session_id: str
    model_id: str
    checkpoint_path: str


class ConcurrentTrainer:
    """A tenant training through the SDK in a thread while the fuzzer runs.

    ``start()`` returns once the model exists, the checkpoint is saved and one step is done;
    ``stop()`` ends the loop after the current step and returns the trace.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.key = new_key("trainer")
        self.trace = TrainingTrace()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fuzz-trainer", daemon=True)
        self.ids: TrainerIds | None = None

    def start(self) -> TrainerIds:
        self._thread.start()
        if not self._ready.wait(120) or self.ids is None:
            raise AssertionError(f"the trainer did not start: {self.errors}")
        return self.ids

    def stop(self) -> TrainingTrace:
        self._stop.set()
        self._thread.join(300)
        assert not self._thread.is_alive(), "the trainer is stuck"
        return self.trace

    def checkpoint_ids(self) -> list[str]:
        """The trainer's checkpoints, listed with its own key (the fuzzer must not have
        deleted, published or re-timed them)."""
        assert self.ids is not None
        response = httpx.get(f"{self.url}/api/v1/training_runs/{self.ids.model_id}/checkpoints",
                             headers={"X-API-Key": self.key}, timeout=30, trust_env=False)
        response.raise_for_status()
        return [c["checkpoint_id"] for c in response.json()["checkpoints"]
                if not c.get("public") and "expires_at" not in c]

    def _run(self) -> None:
        client = tinker.ServiceClient(base_url=self.url, api_key=self.key)
        try:
            tc = client.create_lora_training_client(base_model=MODEL, rank=RANK,
                                                    seed=SEED).result()
            saved = tc.save_state(CHECKPOINT_NAME).result(timeout=120)
            self.ids = TrainerIds(tc.model_id.rsplit(":train:", 1)[0], tc.model_id,
                                  saved.path)
            while len(self.trace.steps) < MAX_STEPS:
                started = time.monotonic()
                self.trace.steps.append(_step(tc))
                self.trace.spans.append((started, time.monotonic()))
                self._ready.set()
                if self._stop.wait(PAUSE_S):
                    break
        except Exception:  # reported by the test, with its traceback
            self.errors.append(traceback.format_exc())
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):  # the session may be gone with the server
                client.close("success").result(timeout=90)


def replay(url: str, num_steps: int) -> TrainingTrace:
    """The same tenant's first ``num_steps`` steps on ``url`` (no concurrency, no pauses)."""
    client = tinker.ServiceClient(base_url=url, api_key=new_key("reference"))
    try:
        tc = client.create_lora_training_client(base_model=MODEL, rank=RANK,
                                                seed=SEED).result()
        tc.save_state(CHECKPOINT_NAME).result(timeout=120)
        return TrainingTrace([_step(tc) for _ in range(num_steps)])
    finally:
        client.close("success").result(timeout=90)


def assert_unaffected(trainer: ConcurrentTrainer, trace: TrainingTrace, reference: TrainingTrace,
                      window: tuple[float, float], min_overlapping_steps: int = 2) -> None:
    """No errors, its checkpoint untouched, enough steps run while the fuzzer ran, and every
    step bitwise equal to the unfuzzed replay."""
    assert not trainer.errors, "the concurrent tenant saw errors:\n" + "\n".join(trainer.errors)
    assert trainer.checkpoint_ids() == [f"weights/{CHECKPOINT_NAME}"], "its checkpoint changed"
    inside = sum(window[0] <= a and b <= window[1] for a, b in trace.spans)
    assert inside >= min_overlapping_steps, (
        f"only {inside} of {len(trace.steps)} trainer steps ran during the fuzzing")
    assert len(reference.steps) == len(trace.steps)
    for i, (got, want) in enumerate(zip(trace.steps, reference.steps, strict=True)):
        assert got == want, f"trainer step {i} differs from the unfuzzed replay"


def assert_fuzzing_clean(problems: list[str], trainer: ConcurrentTrainer, trace: TrainingTrace,
                         reference: TrainingTrace, window: tuple[float, float]) -> None:
    """The fuzzer's own ``problems`` and the concurrent tenant's (`assert_unaffected`) reported
    together, so one failing run shows both."""
    problems = list(problems)
    try:
        assert_unaffected(trainer, trace, reference, window)
    except AssertionError as exc:
        problems.append(f"concurrent tenant: {exc}")
    assert not problems, "\n\n".join(problems)
