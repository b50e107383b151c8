"""One tenant of the multiplex benchmark: a worker process that runs SFT or GRPO loops with the
official `tinker` SDK against a server, one job at a time, driven over stdin/stdout.

    python benchmarks/multiplex/tenant.py      # then JSON lines on stdin, events on stdout

Protocol (one JSON object per line). In: ``{"job": {...}}`` (see `Job`), ``{"go": true}``,
``{"more": true}``, ``{"stop": true}``, ``{"exit": true}``. Out: ``ready`` (client made,
warm-up steps done), ``step`` (one per step after go: wall-clock ``t0``/``t1``, tokens),
``done`` (the timed steps are done). After its timed steps the tenant waits after each step
for ``more`` (one more untimed step, so tenants still running share the engine with it, as in
a steady state) or ``stop``; then ``finished`` (session closed). ``error`` on failure.
Imports nothing from this repo (one process per tenant, nothing of the server in it); it stays
alive across jobs to pay the SDK's import cost once.
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
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class Job:
    """One loop against one server.

    Attributes:
        base_url, base_model, api_key: where to connect and as whom (one key per tenant).
        mode: ``sft`` (cross-entropy on fixed sequences) or ``grpo`` (sample → grade → train
            with ``importance_sampling``).
        batch: sequences per step (``sft``) or prompts per step (``grpo``, each sampled
            ``group_size`` times).
        seq_len: tokens per SFT sequence.
        prompt_len, group_size, max_tokens: GRPO prompt length, samples per prompt, new tokens.
        rank: LoRA rank.
        warmup_steps, timed_steps: untimed steps before ``ready``; steps before ``done``.
        seed: token ids and sampling seeds.
    """

    base_url: str
    base_model: str
    api_key: str
    mode: str
    batch: int
    seq_len: int = 128
    prompt_len: int = 64
    group_size: int = 4
    max_tokens: int = 64
    rank: int = 16
    warmup_steps: int = 1
    timed_steps: int = 4
    seed: int = 0
    vocab_limit: int = 2048
    learning_rate: float = 1e-4


class Channel:
    """stdout events (the real stdout, kept for the protocol) and a queue of stdin commands."""

    def __init__(self) -> None:
        self._out: TextIO = sys.stdout
        sys.stdout = sys.stderr  # anything else that prints goes to the log, not the protocol
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.commands.put(json.loads(line))
        self.commands.put({"exit": True})

    def send(self, event: str, **fields: Any) -> None:
        self._out.write(json.dumps({"event": event, **fields}) + "\n")
        self._out.flush()

    def wait_for(self, *keys: str) -> dict[str, Any]:
        """Block until a command with one of ``keys`` arrives (exit raises SystemExit)."""
        while True:
            command = self.commands.get()
            if command.get("exit"):
                raise SystemExit(0)
            if any(key in command for key in keys):
                return command



def resolved(value: Any) -> Any:
    """SDK calls that return either the object or a future of it (versions differ)."""
    result = getattr(type(value), "result", None)
    return value.result() if callable(result) else value


class SftLoop:
    """Cross-entropy steps on a fixed batch: forward_backward and optim_step submitted
    back to back (one clock cycle per step), then both awaited."""

    def __init__(self, tc: Any, types: Any, job: Job) -> None:
        rng = random.Random(job.seed)
        self.tc, self.adam = tc, types.AdamParams(learning_rate=job.learning_rate)
        token_lists = [[rng.randrange(1, job.vocab_limit) for _ in range(job.seq_len + 1)]
                       for _ in range(job.batch)]
        self.data = [types.Datum(model_input=types.ModelInput.from_ints(t[:-1]),
                                 loss_fn_inputs={"target_tokens": t[1:],
                                                 "weights": [1.0] * job.seq_len})
                     for t in token_lists]

    def step(self) -> dict[str, Any]:
        fb = self.tc.forward_backward(self.data, "cross_entropy")
        op = self.tc.optim_step(self.adam)
        fb.result()
        op.result()
        return {"trained_tokens": sum(d.model_input.length for d in self.data),
                "sampled_tokens": 0}


class GrpoLoop:
    """Sample ``group_size`` completions per prompt from the current weights, grade them with a
    deterministic reward (the fraction of even token ids), centre the rewards per group, and
    train on them with ``importance_sampling`` (sampler logprobs as q)."""

    def __init__(self, tc: Any, types: Any, job: Job) -> None:
        rng = random.Random(job.seed)
        self.tc, self.types, self.job = tc, types, job
        self.adam = types.AdamParams(learning_rate=job.learning_rate)
        self.prompts = [[rng.randrange(1, job.vocab_limit) for _ in range(job.prompt_len)]
                        for _ in range(job.batch)]
        self.num_steps = 0

    def step(self) -> dict[str, Any]:
        types, job = self.types, self.job
        sampler = resolved(self.tc.save_weights_and_get_sampling_client())
        self.num_steps += 1
        params = types.SamplingParams(max_tokens=job.max_tokens, temperature=1.0,
                                      seed=job.seed * 100_003 + self.num_steps)
        futures = [sampler.sample(types.ModelInput.from_ints(p), job.group_size, params)
                   for p in self.prompts]
        data, sampled = [], 0
        for prompt, future in zip(self.prompts, futures, strict=True):
            sequences = future.result().sequences
            rewards = [sum(t % 2 == 0 for t in s.tokens) / max(1, len(s.tokens))
                       for s in sequences]
            mean = sum(rewards) / len(rewards)
            for seq, reward in zip(sequences, rewards, strict=True):
                data.append(self._datum(prompt, list(seq.tokens), list(seq.logprobs),
                                        reward - mean))
                sampled += len(seq.tokens)
        fb = self.tc.forward_backward(data, "importance_sampling")
        op = self.tc.optim_step(self.adam)
        fb.result()
        op.result()
        return {"trained_tokens": sum(d.model_input.length for d in data),
                "sampled_tokens": sampled}

    def _datum(self, prompt: list[int], tokens: list[int], logprobs: list[float],
               advantage: float) -> Any:
        n_prompt = len(prompt) - 1  # target positions that predict prompt tokens
        return self.types.Datum(
            model_input=self.types.ModelInput.from_ints(prompt + tokens[:-1]),
            loss_fn_inputs={"target_tokens": prompt[1:] + tokens,
                            "logprobs": [0.0] * n_prompt + logprobs,
                            "advantages": [0.0] * n_prompt + [advantage] * len(tokens)})


def run_job(channel: Channel, job: Job) -> None:
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=job.base_url, api_key=job.api_key)
    tc = resolved(service.create_lora_training_client(base_model=job.base_model, rank=job.rank,
                                                      seed=job.seed))
    loop = SftLoop(tc, types, job) if job.mode == "sft" else GrpoLoop(tc, types, job)
    for _ in range(job.warmup_steps):
        loop.step()
    channel.send("ready", cpu_s=time.process_time())
    channel.wait_for("go")
    num_steps, stopped = 0, False
    while not stopped:
        t0 = time.time()
        counts = loop.step()
        num_steps += 1
        channel.send("step", index=num_steps, t0=t0, t1=time.time(),
                     timed=num_steps <= job.timed_steps, **counts)
        if num_steps == job.timed_steps:
            channel.send("done", t=time.time())
        if num_steps >= job.timed_steps:
            stopped = "stop" in channel.wait_for("more", "stop")
    close = getattr(service, "close", None)
    if callable(close):
        try:
            resolved(close("success"))
        except Exception:  # an SDK without session close: nothing to release
            traceback.print_exc()
    channel.send("finished", cpu_s=time.process_time())


def main() -> None:
    # No flags: the protocol runs over stdin/stdout; --help prints the docstring above.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    channel = Channel()
    import tinker  # noqa: F401  (paid once, before the first job)

    channel.send("started", pid=os.getpid())
    while True:
        try:
            job = Job(**channel.wait_for("job")["job"])
        except SystemExit:
            return
        try:
            run_job(channel, job)
        except SystemExit:
            return
        except Exception as exc:
            traceback.print_exc()
            channel.send("error", message=f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
