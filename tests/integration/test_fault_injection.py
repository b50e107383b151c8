"""Fault injection: the server is SIGKILLed at random moments (seeded) of a training run that
saves its state every step, and restarted on the same data dir under another spelling each
time. Resuming from the last acknowledged checkpoint must give the uninterrupted run's losses
and weights bitwise; every acknowledged checkpoint stays listed and loadable, also from a copy
of the data dir (cp -a), and deleting them in the copy leaves the original's files alone."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tinker

from loraplex.config import DEFAULT_MODEL_NAME as MODEL
from tests.api.test_training import ADAM, DATA, logprobs
from tests.integration.conftest import EXECUTOR, REPO, SERVER_THREADS, ServerProcess
from tests.integration.serve_fake import seed_builtin_tiny

SEED = 20240607
NUM_STEPS = 8
NUM_KILLS = 3
PHASES = ("forward_backward", "optim_step", "save_state")
KEY = "tml-fault-injection"
WAIT_S = 60.0  # bound on one SDK call while the server dies and comes back

Logprobs = list[np.ndarray]


@dataclass
class Progress:
    """What the client was told: acknowledged states by step, and each step's loss."""

    acked: dict[int, str] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)

    @property
    def last_step(self) -> int:
        return max(self.acked, default=0)


def _run(tc: tinker.TrainingClient, progress: Progress, tag: str,
         submitted: Callable[[int, str], None] = lambda step, phase: None) -> None:
    """Train from the step after the last acknowledged one to NUM_STEPS, saving every step;
    ``submitted(step, phase)`` is told right after each request went out."""
    for step in range(progress.last_step + 1, NUM_STEPS + 1):
        fb = tc.forward_backward(DATA, "cross_entropy")
        submitted(step, "forward_backward")
        optim = tc.optim_step(ADAM)
        submitted(step, "optim_step")
        loss = fb.result(timeout=WAIT_S).metrics["loss:sum"]
        optim.result(timeout=WAIT_S)
        save = tc.save_state(f"step{step:02d}-{tag}")
        submitted(step, "save_state")
        progress.acked[step] = save.result(timeout=WAIT_S).path
        progress.losses[step] = loss


class Killer(threading.Thread):
    """SIGKILLs the server at seeded kill points, each (step, phase, delay): ``delay`` seconds
    after the client, talking to the server as restarted after the previous kill, first sends
    a request of that phase at that step or later. Then it restarts the server at once on the
    same port, under the next spelling of the data dir."""

    def __init__(self, server: ServerProcess, spellings: list[Path], rng: random.Random
                 ) -> None:
        super().__init__(daemon=True)
        self.server, self.spellings = server, spellings
        # Early steps and short delays, so that every kill lands before the run's last step.
        steps = sorted(rng.sample(range(2, NUM_STEPS - 2), NUM_KILLS))
        self.points = [(s, rng.choice(PHASES), rng.uniform(0.0, 0.05)) for s in steps]
        self.num_kills = 0
        self.error: BaseException | None = None
        self._reached = threading.Event()
        self._armed = True  # False while the server restarts
        self._lock = threading.Lock()  # guards num_kills, _armed and _reached together
        self._stopped = False

    def stop(self) -> None:
        """The run is over: give up waiting for kill points it never reached."""
        self._stopped = True
        self._reached.set()

    def submitted(self, step: int, phase: str) -> None:
        with self._lock:
            if self._armed and self.num_kills < len(self.points):
                target_step, target_phase, _ = self.points[self.num_kills]
                if step >= target_step and phase == target_phase:
                    self._reached.set()

    def run(self) -> None:
        try:
            for point in self.points:
                assert self._reached.wait(150), f"kill point {point} never reached"
                if self._stopped:
                    return
                time.sleep(point[2])
                assert self.server.proc is not None
                self.server.proc.kill()
                self.server.proc.wait(30)
                self.server.data_dir = self.spellings[self.num_kills % len(self.spellings)]
                with self._lock:
                    self.num_kills += 1
                    self._armed = False
                    self._reached.clear()
                self.server.start()
                with self._lock:
                    self._armed = True
        except BaseException as exc:  # reported by the test thread
            self.error = exc


def _states(url: str, progress: Progress) -> dict[int, Logprobs]:
    """Forward logprobs of every acknowledged state, each loaded with its optimizer."""
    client = tinker.ServiceClient(base_url=url, api_key=KEY)
    states = {}
    for step, path in sorted(progress.acked.items()):
        tc = client.create_training_client_from_state_with_optimizer(path).result()
        states[step] = logprobs(tc.forward(DATA, "cross_entropy").result())
    client.close("success").result()
    return states


def _listed(url: str) -> set[str]:
    page = tinker.RestClient(base_url=url, api_key=KEY).list_user_checkpoints(limit=1000)
    return {c.tinker_path for c in page.result().checkpoints}


def _assert_same(states: dict[int, Logprobs], reference: dict[int, Logprobs]) -> None:
    assert states.keys() == reference.keys()
    for step in states:
        for a, b in zip(states[step], reference[step], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"state of step {step}")


def _train_through_kills(server: ServerProcess, killer: Killer, start: str) -> Progress:
    """The interrupted run: after each failure a new client resumes from the last ack."""
    progress = Progress(acked={0: start})
    deadline = time.monotonic() + 180
    attempt, last_error = 0, None
    while progress.last_step < NUM_STEPS:
        assert time.monotonic() < deadline, f"stuck after step {progress.last_step}"
        assert attempt <= 3 * NUM_KILLS, f"resuming keeps failing: {last_error!r}"
        assert killer.error is None, killer.error
        try:
            client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
            tc = client.create_training_client_from_state_with_optimizer(
                progress.acked[progress.last_step]).result(timeout=WAIT_S)
            _run(tc, progress, f"a{attempt}", killer.submitted)
        except Exception as exc:  # the server died under this client: resume from the last ack
            attempt, last_error = attempt + 1, exc
            time.sleep(0.2)
    return progress


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_run_bitwise(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "data"
    seed_builtin_tiny(data, tiny_model_dir)
    (tmp_path / "link").symlink_to(data)
    spellings = [Path(os.path.relpath(data, REPO)), tmp_path / "link", data]
    threads = ("--threads", SERVER_THREADS) if SERVER_THREADS else ()
    server = ServerProcess(data, "--open", "--executor", EXECUTOR, *threads).start()
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        start = client.create_lora_training_client(base_model=MODEL, rank=4).result(
            ).save_state("start").result().path
        reference = Progress(acked={0: start})
        _run(client.create_training_client_from_state_with_optimizer(start).result(),
             reference, "reference")
        reference_states = _states(server.url, reference)

        killer = Killer(server, spellings, random.Random(SEED))
        killer.start()
        progress = _train_through_kills(server, killer, start)
        killer.stop()
        killer.join(120)
        assert killer.error is None, killer.error
        assert killer.num_kills == NUM_KILLS

        assert progress.losses == reference.losses  # bitwise: the floats compare equal
        assert set(progress.acked.values()) <= _listed(server.url)
        _assert_same(_states(server.url, progress), reference_states)
        server.stop()

        copy = tmp_path / "copy"
        shutil.copytree(data, copy, symlinks=True)  # cp -a
        original = sorted(p.name for p in (data / "checkpoints").glob("*/*/*"))
        server.data_dir = copy
        server.start()
        assert set(progress.acked.values()) <= _listed(server.url)
        _assert_same(_states(server.url, progress), reference_states)
        rest = tinker.RestClient(base_url=server.url, api_key=KEY)
        for path in progress.acked.values():
            rest.delete_checkpoint_from_tinker_path(path).result()
        assert not set(progress.acked.values()) & _listed(server.url)
        assert sorted(p.name for p in (data / "checkpoints").glob("*/*/*")) == original
    finally:
        server.stop()
