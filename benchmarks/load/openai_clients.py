"""The load benchmark's OpenAI-API clients: one process, one official ``openai`` client per
simulated user (its own ``tml-`` key, its own connection pool, its own thread), each in a closed
loop of ``/v1/completions`` or ``/v1/chat/completions`` requests, streamed or not, driven over
stdin/stdout.

    python benchmarks/load/openai_clients.py      # then JSON lines on stdin, events on stdout

Client ``i`` uses mode ``MODES[i % 4]``: completion, completion_stream, chat, chat_stream, so
16 clients are 4 of each. Every request has a fresh prompt (a few dozen to a few hundred
characters of words), ``n`` of 1 or 2, 4 to ``max_tokens`` new tokens, a seed. A streamed
request's latency is to its last chunk; its first content chunk's delay is ``ttft``. Like the
flooder it runs at ``nice`` (+10): these clients' CPU would be on other machines.

Protocol. In: ``{"setup": {...}}`` (`Setup`), ``{"go": true}``, ``{"stop": true}``. Out:
``started``, ``ready``, ``op`` (one per request: ``c``, ``k`` (the mode), ``t0``, ``t1``,
``ok``, ``err``, ``ttft``, ``tokens``), ``stopped``, ``error``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.load.client import Channel

MODES = ("completion", "completion_stream", "chat", "chat_stream")
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "seven", "small", "birds", "sang",
         "over", "green", "hills", "and", "one", "tired", "fox", "counted", "stars", "by",
         "river", "near", "an", "old", "mill")
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Setup:
    """Attributes:
        base_url: the server (``/v1`` is appended).
        model: the model every request names.
        keys: one API key per client; client ``i`` is named ``openai-<i>``.
        max_tokens: new tokens per request are drawn from 4 … this.
        max_words: prompt words are drawn from 8 … this.
        nice: added to the process's niceness at setup.
    """

    base_url: str
    model: str
    keys: list[str]
    max_tokens: int = 16
    max_words: int = 64
    nice: int = 10


class User:
    """One OpenAI client in a closed loop; every request is reported as an op."""

    def __init__(self, index: int, setup: Setup, channel: Channel) -> None:
        import openai

        self.name, self.mode = f"openai-{index:02d}", MODES[index % len(MODES)]
        self.setup, self.channel, self.rng = setup, channel, random.Random(index)
        self.client = openai.OpenAI(base_url=f"{setup.base_url}/v1", api_key=setup.keys[index],
                                    max_retries=0, timeout=REQUEST_TIMEOUT_S)

    def request_args(self) -> dict[str, Any]:
        prompt = " ".join(self.rng.choice(WORDS)
                          for _ in range(self.rng.randint(8, self.setup.max_words)))
        args: dict[str, Any] = {"model": self.setup.model, "n": self.rng.randint(1, 2),
                                "max_tokens": self.rng.randint(4, self.setup.max_tokens),
                                "temperature": 0.8, "seed": self.rng.randrange(2**31)}
        if self.mode.startswith("chat"):
            args["messages"] = [{"role": "user", "content": prompt}]
        else:
            args["prompt"] = prompt
        return args

    def request(self) -> tuple[float | None, int]:
        """One request: (first content chunk's delay or None, tokens received)."""
        args = self.request_args()
        api = self.client.chat.completions if self.mode.startswith("chat") else \
            self.client.completions
        t0 = time.time()
        if not self.mode.endswith("stream"):
            out = api.create(**args)
            assert len(out.choices) == args["n"], f"{len(out.choices)} choices, not {args['n']}"
            return None, out.usage.completion_tokens if out.usage else 0
        ttft, tokens = None, 0
        for chunk in api.create(**args, stream=True, stream_options={"include_usage": True}):
            for choice in chunk.choices:
                piece = choice.delta.content if self.mode == "chat_stream" else choice.text
                if piece and ttft is None:
                    ttft = time.time() - t0
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        assert tokens > 0, "the stream ended without a usage chunk"
        return ttft, tokens

    def run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            t0 = time.time()
            try:
                ttft, tokens = self.request()
            except Exception as exc:
                self.channel.send("op", c=self.name, k=self.mode, t0=t0, t1=time.time(),
                                  ok=False, err=f"{type(exc).__name__}: {str(exc)[:300]}")
                time.sleep(0.5)
                continue
            self.channel.send("op", c=self.name, k=self.mode, t0=t0, t1=time.time(), ok=True,
                              ttft=ttft, tokens=tokens)


def main() -> None:
    # No flags: the protocol runs over stdin/stdout; --help prints the docstring above.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    channel = Channel()
    import openai  # noqa: F401  (paid before setup, while the server starts)

    raw = channel.started()
    if raw is None:
        return
    setup = Setup(**raw)
    os.nice(setup.nice)
    users = [User(i, setup, channel) for i in range(len(setup.keys))]
    channel.send("ready", t=time.time())
    if "go" not in channel.wait_for("go"):
        os._exit(0)
    stopping = threading.Event()
    threads = [threading.Thread(target=u.run, args=(stopping,), daemon=True) for u in users]
    for thread in threads:
        thread.start()
    channel.wait_for("stop")
    stopping.set()
    for thread in threads:
        thread.join()
    channel.send("stopped", t=time.time())
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
