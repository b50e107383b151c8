"""The load benchmark's flooding tenant: one process, one key, one training model, sending valid
forward_backward requests over plain HTTP (httpx, the SDK's wire format: protobuf body from
`tinker.proto.request_conv`, JSON retrieve_future with ``Accept: application/x-protobuf``) as
fast as it can, driven over stdin/stdout.

    python benchmarks/load/flood.py      # then JSON lines on stdin, events on stdout

Why not the SDK: the SDK backs off on 429 (exponential, honouring ``Retry-After``) and retries
with its own pacing, so an SDK flooder is a milder version of the same load. This client is the
worst one tenant can do with valid requests: ``concurrency`` submitters keep its queue at the
server's in-flight limit and resubmit every 429 after ``retry_s`` (default 0: at once, ignoring
``Retry-After``), so the server pays for a request parse and a protobuf decode per rejection.
Each submitter owns one seq_id until it is accepted (the server admits the op its queue waits
on, so a rejected seq_id cannot stall the model); ``retrievers`` long-poll the results. It sends
its own session heartbeats (every 10 s, as the SDK does). It runs at ``nice`` (default +10): a
real flooder's client CPU is on another machine, not on the server's two cores.

Protocol. In: ``{"setup": {...}}`` (`Setup`), ``{"go": true}``, ``{"stop": true}``. Out:
``started``, ``ready``, ``progress`` (counters, once a second while flooding), ``drained`` (after
stop: every accepted op's result fetched; final counters), ``error``. Imports nothing from this
repo.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PROTO = "application/x-protobuf"
HEARTBEAT_S = 10.0
MAX_ATTEMPTS_OTHER = 50  # non-429 failures of one seq_id before the flooder gives up


@dataclass(frozen=True)
class Setup:
    """Attributes:
        base_url, base_model, api_key: where and as whom.
        batch, seq_len, rank, vocab_limit, seed: every request's datums (fixed, valid).
        concurrency: submitters, each with one request on the wire at a time.
        retrievers: tasks long-polling accepted ops' results.
        retry_s: pause before resubmitting a 429'd seq_id.
        nice: added to the process's niceness at setup.
    """

    base_url: str
    base_model: str
    api_key: str
    batch: int = 2
    seq_len: int = 64
    rank: int = 8
    vocab_limit: int = 1000
    seed: int = 0
    concurrency: int = 64
    retrievers: int = 8
    retry_s: float = 0.0
    nice: int = 10


@dataclass
class Counters:
    requests: int = 0
    accepted: int = 0
    rejected_429: int = 0
    completed: int = 0
    failed: int = 0
    other_http: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)  # accepted → result fetched

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "accepted": self.accepted,
                "rejected_429": self.rejected_429, "completed": self.completed,
                "failed": self.failed, "other_http": dict(self.other_http),
                "failures": dict(self.failures)}


def request_body(setup: Setup, model_id: str) -> Any:
    """The protobuf message every submit sends (only its seq_id changes)."""
    import random

    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    rng = random.Random(setup.seed)
    data = []
    for _ in range(setup.batch):
        tokens = [rng.randrange(1, setup.vocab_limit) for _ in range(setup.seq_len + 1)]
        # Plain lists: the SDK's Datum validator turns them into TensorData.
        inputs: dict[str, Any] = {"target_tokens": tokens[1:], "weights": [1.0] * setup.seq_len}
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs=inputs))
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        model_id=model_id, seq_id=1)
    return forward_backward_request_to_proto(request)


class Flooder:
    def __init__(self, setup: Setup) -> None:
        import httpx

        self.setup = setup
        self.http = httpx.AsyncClient(
            base_url=setup.base_url, headers={"X-API-Key": setup.api_key}, trust_env=False,
            timeout=httpx.Timeout(120.0),
            limits=httpx.Limits(max_connections=setup.concurrency + setup.retrievers + 2))
        self.counters = Counters()
        self.stopping = asyncio.Event()
        self.accepted: asyncio.Queue[tuple[str, float] | None] = asyncio.Queue()
        self.session_id = self.model_id = ""
        self.message: Any = None

    async def start(self) -> None:
        """Session, model (waited for), request template."""
        session = await self.http.post("/api/v1/create_session", json={
            "tags": ["load-flood"], "user_metadata": {}, "sdk_version": "load-flood"})
        session.raise_for_status()
        self.session_id = session.json()["session_id"]
        created = await self.http.post("/api/v1/create_model", json={
            "session_id": self.session_id, "model_seq_id": 0,
            "base_model": self.setup.base_model, "lora_config": {"rank": self.setup.rank}})
        created.raise_for_status()
        self.model_id = created.json()["model_id"]
        ok, detail = await self.result(created.json()["request_id"])
        if not ok:
            raise RuntimeError(f"create_model failed: {detail}")
        self.message = request_body(self.setup, self.model_id)

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.http.post("/api/v1/session_heartbeat",
                                     json={"session_id": self.session_id}, timeout=10)
            except Exception as exc:  # the SDK also just tries again next period
                self.counters.other_http[f"heartbeat {type(exc).__name__}"] += 1

    def body(self, seq_id: int) -> bytes:
        self.message.seq_id = seq_id
        return bytes(self.message.SerializeToString())

    async def submitter(self, seq_ids: itertools.count[int]) -> None:
        """Until stop: take the next seq_id and resubmit it until it is accepted (also after
        stop, so no gap is left behind)."""
        c = self.counters
        while not self.stopping.is_set():
            seq_id, other = next(seq_ids), 0
            while True:
                response = await self.http.post("/api/v1/forward_backward", content=self.body(
                    seq_id), headers={"Content-Type": PROTO})
                c.requests += 1
                if response.status_code == 200:
                    c.accepted += 1
                    self.accepted.put_nowait((response.json()["request_id"], time.time()))
                    break
                if response.status_code == 429:
                    c.rejected_429 += 1
                    await asyncio.sleep(self.setup.retry_s)
                    continue
                c.other_http[f"{response.status_code} {response.text[:200]}"] += 1
                other += 1
                if other >= MAX_ATTEMPTS_OTHER:
                    raise RuntimeError(f"seq_id {seq_id}: {response.status_code} "
                                       f"{response.text[:300]}")
                await asyncio.sleep(0.1)

    async def retriever(self) -> None:
        c = self.counters
        while (item := await self.accepted.get()) is not None:
            request_id, accepted_at = item
            ok, detail = await self.result(request_id)
            c.latencies_s.append(time.time() - accepted_at)
            if ok:
                c.completed += 1
            else:
                c.failed += 1
                c.failures[detail[:200]] += 1

    async def result(self, request_id: str) -> tuple[bool, str]:
        """Long-poll one future until it is done: (succeeded, error text)."""
        while True:
            response = await self.http.post("/api/v1/retrieve_future",
                                            json={"request_id": request_id},
                                            headers={"Accept": PROTO})
            if PROTO in response.headers.get("content-type", ""):
                return True, ""
            if response.status_code in (408, 429) or response.status_code >= 500:
                await asyncio.sleep(0.05)
                continue
            body = response.json()
            if body.get("type") == "try_again":
                continue
            if "error" in body or response.status_code >= 400:
                return False, str(body.get("error", body))
            return True, ""

    async def flood(self, channel: Channel) -> None:
        seq_ids = itertools.count(1)
        submitters = [asyncio.create_task(self.submitter(seq_ids))
                      for _ in range(self.setup.concurrency)]
        retrievers = [asyncio.create_task(self.retriever()) for _ in range(self.setup.retrievers)]
        progress = asyncio.create_task(self.report_progress(channel))
        await asyncio.gather(*submitters)  # they return once stop is set and their op is in
        for _ in retrievers:
            self.accepted.put_nowait(None)
        await asyncio.gather(*retrievers)
        progress.cancel()

    async def report_progress(self, channel: Channel) -> None:
        while True:
            await asyncio.sleep(1.0)
            channel.send("progress", t=time.time(), **self.counters.as_dict())

    async def finish(self) -> None:
        await self.http.post(f"/api/v1/sessions/{self.session_id}/finish",
                             json={"reason": {"type": "success"}})
        await self.http.aclose()


class Channel:
    """stdout events (thread-safe) and stdin commands, handed to the event loop."""

    def __init__(self) -> None:
        self._out = sys.stdout
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._out.write(json.dumps({"event": event, **fields}) + "\n")
            self._out.flush()

    @staticmethod
    async def wait_for(key: str) -> dict[str, Any]:
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                return {"eof": True}
            if line.strip() and key in (command := json.loads(line)):
                return dict(command)


async def run(channel: Channel) -> None:
    raw = (await channel.wait_for("setup")).get("setup")
    if raw is None:
        return
    setup = Setup(**raw)
    os.nice(setup.nice)
    flooder = Flooder(setup)
    await flooder.start()
    beats = asyncio.create_task(flooder.heartbeat())
    channel.send("ready", t=time.time(), model_id=flooder.model_id)
    if "go" not in await channel.wait_for("go"):
        return
    flooding = asyncio.create_task(flooder.flood(channel))
    stop = asyncio.create_task(channel.wait_for("stop"))
    await asyncio.wait([flooding, stop], return_when=asyncio.FIRST_COMPLETED)
    flooder.stopping.set()
    t_stop = time.time()
    await flooding  # raises if a submitter gave up
    beats.cancel()
    lat = sorted(flooder.counters.latencies_s)
    channel.send("drained", t_stop=t_stop, t=time.time(), **flooder.counters.as_dict(),
                 latency_p50_s=lat[len(lat) // 2] if lat else None)
    await flooder.finish()


def main() -> None:
    # No flags: the protocol runs over stdin/stdout; --help prints the docstring above.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    channel = Channel()
    import httpx  # noqa: F401  (paid before setup)
    import tinker.proto.request_conv  # noqa: F401

    channel.send("started", pid=os.getpid())
    try:
        asyncio.run(run(channel))
    except Exception as exc:
        channel.send("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
