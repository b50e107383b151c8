"""One client process of the load benchmark: several official-SDK (tinker 0.38) clients, each its
own tenant (``tml-`` key) and session, each looping in its own thread, driven over stdin/stdout.

    python benchmarks/load/client.py      # then JSON lines on stdin, events on stdout

Protocol (one JSON object per line). In: ``{"setup": {...}}`` (`Setup`: the server, the clients
with their roles, the op sizes), ``{"go": true}``, ``{"stop": true}``. Out: ``started``,
``ready`` (every client made; ``steady`` clients also ran their warm-up steps), one ``op`` per
call after go (``c`` client, ``k`` kind, wall-clock ``t0``/``t1``, ``ok``, ``err``), ``warm``
when a client finished its first iteration (every op kind it does has run once), ``stopped``
(loops ended, ``close_session`` clients closed; the process then exits at once, so the other
sessions stop heartbeating and expire on the server's idle timeout); ``error`` if setup fails.

Roles: ``train`` (forward_backward + optim_step, pipelined; every ``save_every`` iterations an
ephemeral save_weights_and_get_sampling_client + sample; every ``persist_every`` a named
save_weights_for_sampler + create_sampling_client + sample), ``sample`` (base-model sample,
2-4 samples, a few new tokens), ``steady`` (one kind only: ``train_step``, a pipelined
forward_backward + optim_step, the flood phase's normal tenant). Imports nothing from this repo.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

T = TypeVar("T")
RESULT_TIMEOUT_S = 600.0  # one op; far above any latency the benchmark expects


@dataclass(frozen=True)
class ClientSpec:
    """One SDK client: its name (in events), key (its tenant), role and what it does at stop."""

    name: str
    api_key: str
    role: str
    seed: int
    close_session: bool = True


@dataclass(frozen=True)
class Workload:
    """Op sizes shared by every client of a run.

    Attributes:
        batch: datums per forward_backward.
        seq_len_min, seq_len_max: tokens per datum (each client draws one length).
        rank: LoRA rank of the training clients.
        save_every, persist_every: a ``train`` client's iterations between ephemeral sampler
            saves and between named checkpoint saves (0: never); iteration 0 does both.
        num_samples_min, num_samples_max, max_tokens_min, max_tokens_max, prompt_len_min,
            prompt_len_max: each sample call draws its size from these ranges.
        vocab_limit: token ids are drawn from [1, vocab_limit).
        warmup_steps: untimed steps a ``steady`` client runs before ``ready``.
        error_pause_s: a client sleeps this long after a failed op (no hot error loop).
    """

    batch: int = 2
    seq_len_min: int = 32
    seq_len_max: int = 64
    rank: int = 8
    save_every: int = 5
    persist_every: int = 10
    num_samples_min: int = 2
    num_samples_max: int = 4
    max_tokens_min: int = 4
    max_tokens_max: int = 16
    prompt_len_min: int = 8
    prompt_len_max: int = 32
    vocab_limit: int = 1000
    warmup_steps: int = 2
    error_pause_s: float = 0.2


@dataclass(frozen=True)
class Setup:
    base_url: str
    base_model: str
    clients: list[ClientSpec]
    workload: Workload = field(default_factory=Workload)


class Channel:
    """stdout events (the real stdout, kept for the protocol; thread-safe) and stdin commands."""

    def __init__(self) -> None:
        self._out: TextIO = sys.stdout
        sys.stdout = sys.stderr  # anything else that prints goes to the log, not the protocol
        self._lock = threading.Lock()
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.commands.put(json.loads(line))
        self.commands.put({"stop": True, "eof": True})  # the driver went away

    def send(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._out.write(json.dumps({"event": event, **fields}) + "\n")
            self._out.flush()

    def wait_for(self, key: str) -> dict[str, Any]:
        while True:
            command = self.commands.get()
            if key in command or command.get("eof"):
                return command

    def started(self) -> dict[str, Any] | None:
        """Say ``started`` (the worker's imports are paid) and wait for its setup (None: the
        driver went away first)."""
        self.send("started", pid=os.getpid())
        setup: dict[str, Any] | None = self.wait_for("setup").get("setup")
        return setup


def resolved(value: Any) -> Any:
    """SDK calls that return either the object or a future of it (versions differ)."""
    result = getattr(type(value), "result", None)
    return value.result(timeout=RESULT_TIMEOUT_S) if callable(result) else value


class Client:
    """One SDK client's loop; every call goes through `timed`, which reports it as an op."""

    def __init__(self, spec: ClientSpec, setup: Setup, channel: Channel,
                 stopping: threading.Event) -> None:
        import tinker
        from tinker import types

        self.spec, self.work, self.channel, self.stopping = spec, setup.workload, channel, stopping
        self.types, self.base_model = types, setup.base_model
        self.rng = random.Random(spec.seed)
        self.service = tinker.ServiceClient(base_url=setup.base_url, api_key=spec.api_key)
        self.session_created_at = time.time()
        self.training: Any = None
        self.base_sampler: Any = None
        if spec.role in ("train", "steady"):
            self.training = resolved(self.service.create_lora_training_client(
                base_model=setup.base_model, rank=self.work.rank, seed=spec.seed))
            self.data = self._datums()
            self.adam = types.AdamParams(learning_rate=1e-4)
        else:
            self.base_sampler = resolved(
                self.service.create_sampling_client(base_model=setup.base_model))
        self.recording = False
        for _ in range(self.work.warmup_steps if spec.role == "steady" else 0):
            self.train_step()

    def _datums(self) -> list[Any]:
        length = self.rng.randint(self.work.seq_len_min, self.work.seq_len_max)
        out = []
        for _ in range(self.work.batch):
            tokens = [self.rng.randrange(1, self.work.vocab_limit) for _ in range(length + 1)]
            # Plain lists: the SDK's Datum validator turns them into TensorData.
            inputs: dict[str, Any] = {"target_tokens": tokens[1:], "weights": [1.0] * length}
            out.append(self.types.Datum(
                model_input=self.types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs))
        return out

    def timed(self, kind: str, call: Callable[[], T], t0: float | None = None,
              report_ok: bool = True) -> T | None:
        """Run ``call``; report it as a ``kind`` op (latency from ``t0``, default now; a success
        only if ``report_ok``). A failure is reported and swallowed (the loop goes on): None."""
        t0 = time.time() if t0 is None else t0
        try:
            value = call()
        except Exception as exc:
            self._report(kind, t0, f"{type(exc).__name__}: {str(exc)[:300]}")
            time.sleep(self.work.error_pause_s)
            return None
        if report_ok:
            self._report(kind, t0, None)
        return value

    def _report(self, kind: str, t0: float, err: str | None) -> None:
        if self.recording:
            self.channel.send("op", c=self.spec.name, k=kind, t0=t0, t1=time.time(),
                              ok=err is None, **({"err": err} if err else {}))
        elif err:  # a warm-up failure is a setup failure
            raise RuntimeError(f"{self.spec.name} warm-up {kind}: {err}")

    def train_step(self) -> None:
        """forward_backward and optim_step submitted back to back, then both awaited (one
        clock cycle per step when the server packs them); each op's latency counts from the
        submit. ``steady`` reports the pair as one ``train_step``."""
        t0 = time.time()

        def submit() -> tuple[Any, Any]:
            return (self.training.forward_backward(self.data, "cross_entropy"),
                    self.training.optim_step(self.adam))

        if self.spec.role == "steady":
            self.timed("train_step", lambda: [resolved(f) for f in submit()], t0)
            return
        futures = self.timed("forward_backward", submit, t0, report_ok=False)
        if futures is not None:
            fb, optim = futures
            self.timed("forward_backward", lambda: resolved(fb), t0)
            self.timed("optim_step", lambda: resolved(optim), t0)

    def sample(self, sampler: Any, kind: str) -> None:
        w, types = self.work, self.types
        prompt = [self.rng.randrange(1, w.vocab_limit)
                  for _ in range(self.rng.randint(w.prompt_len_min, w.prompt_len_max))]
        params = types.SamplingParams(
            max_tokens=self.rng.randint(w.max_tokens_min, w.max_tokens_max), temperature=1.0,
            seed=self.rng.randrange(1 << 30))
        num_samples = self.rng.randint(w.num_samples_min, w.num_samples_max)
        self.timed(kind, lambda: resolved(
            sampler.sample(types.ModelInput.from_ints(prompt), num_samples, params)))

    def iteration(self, index: int) -> None:
        if self.spec.role == "sample":
            self.sample(self.base_sampler, "sample_base")
            return
        self.train_step()
        if self.spec.role != "train":
            return
        w = self.work
        if w.save_every and index % w.save_every == 0:
            sampler = self.timed("save_weights_and_get_sampling_client",
                                 lambda: resolved(self.training
                                                  .save_weights_and_get_sampling_client()))
            if sampler is not None:
                self.sample(sampler, "sample_adapter")
        if w.persist_every and index % w.persist_every == 0:
            saved = self.timed("save_weights_for_sampler", lambda: resolved(
                self.training.save_weights_for_sampler(f"{self.spec.name}-{index}")))
            if saved is None:
                return
            sampler = self.timed("create_sampling_client", lambda: resolved(
                self.training.create_sampling_client(saved.path)))
            if sampler is not None:
                self.sample(sampler, "sample_adapter")

    def run(self) -> None:
        index = 0
        while not self.stopping.is_set():
            t0 = time.time()
            try:
                self.iteration(index)
            except Exception as exc:  # a bug here, not an op failure: report it, go on
                traceback.print_exc()
                self._report("iteration", t0, f"{type(exc).__name__}: {str(exc)[:300]}")
                time.sleep(self.work.error_pause_s)
            if index == 0:
                self.channel.send("warm", c=self.spec.name, t=time.time())
            index += 1

    def close(self) -> None:
        resolved(self.service.close("success"))


def set_up(setup: Setup, channel: Channel, stopping: threading.Event) -> list[Client]:
    """Every client made at once (each in a thread: session, model, warm-up round trips)."""
    clients: dict[str, Client] = {}
    failures: list[str] = []

    def make(spec: ClientSpec) -> None:
        try:
            clients[spec.name] = Client(spec, setup, channel, stopping)
        except Exception as exc:
            traceback.print_exc()
            failures.append(f"{spec.name}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=make, args=(s,)) for s in setup.clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError("; ".join(failures))
    return [clients[s.name] for s in setup.clients]


def main() -> None:
    # No flags: the protocol runs over stdin/stdout; --help prints the docstring above.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    channel = Channel()
    import tinker  # noqa: F401  (paid before setup, while the server starts)

    raw = channel.started()
    if raw is None:
        return
    setup = Setup(raw["base_url"], raw["base_model"],
                  [ClientSpec(**c) for c in raw["clients"]], Workload(**raw.get("workload", {})))
    stopping = threading.Event()
    try:
        clients = set_up(setup, channel, stopping)
    except Exception as exc:
        channel.send("error", message=f"setup: {exc}")
        os._exit(1)
    channel.send("ready", sessions={c.spec.name: c.session_created_at for c in clients})
    if "go" not in channel.wait_for("go"):
        os._exit(0)
    for client in clients:
        client.recording = True
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    channel.wait_for("stop")
    stopping.set()
    for thread in threads:
        thread.join()
    closed = []
    for client in clients:
        if not client.spec.close_session:
            continue
        try:
            client.close()
            closed.append(client.spec.name)
        except Exception as exc:
            channel.send("op", c=client.spec.name, k="close_session", t0=time.time(),
                         t1=time.time(), ok=False, err=f"{type(exc).__name__}: {exc}")
    channel.send("stopped", t=time.time(), closed=closed)
    # Exit without the SDK's shutdown: the sessions not closed above stop heartbeating now.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
