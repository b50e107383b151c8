"""What every fuzzed response must honour, and the record of those that did not.

The contract (`loraplex.api.errors`): never a 5xx; every 4xx a JSON object naming the problem
(``error`` and ``detail``, non-empty strings); a submit answered 200 carries a ``request_id``
whose future, once done, never fails with ``category: server`` (a server bug reported through
the future instead of a 500).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

MAX_EXAMPLES_PER_FINDING = 3


def response_problem(status: int, body: bytes, openai: bool = False) -> str | None:
    """Why a response breaks the contract, or None (``openai``: a ``/v1/`` route, whose 4xx
    bodies are OpenAI's ``{"error": {"message", "type", ...}}``)."""
    if status >= 500:
        return f"HTTP {status}"
    if 400 <= status < 500:
        try:
            payload = json.loads(body)
        except ValueError:
            return f"HTTP {status} without a JSON body"
        if not isinstance(payload, dict):
            return f"HTTP {status} with a JSON {type(payload).__name__}, not an object"
        if openai:
            error = payload.get("error")
            payload = error if isinstance(error, dict) else {}
        keys = ("message", "type") if openai else ("error", "detail")
        missing = [k for k in keys if not isinstance(payload.get(k), str) or not payload[k]]
        if missing:
            return f"HTTP {status} whose JSON body lacks {missing}"
    return None


def accepted_request_id(status: int, body: bytes) -> str | None:
    """The future id of a submit answered 200, if the body has one."""
    if status != 200:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    request_id = payload.get("request_id") if isinstance(payload, dict) else None
    return request_id if isinstance(request_id, str) else None


@dataclass
class Findings:
    """Contract breaches grouped by (operation, problem), a few example requests each."""

    by_kind: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    num_requests: int = 0
    statuses: dict[str, dict[int, int]] = field(default_factory=dict)  # operation → counts

    def add(self, operation: str, problem: str, example: str) -> None:
        examples = self.by_kind.setdefault((operation, problem), [])
        if len(examples) < MAX_EXAMPLES_PER_FINDING:
            examples.append(example)

    def check(self, operation: str, status: int, body: bytes,
              example: Callable[[], str]) -> bool:
        """Record the response of ``example`` (built only on a breach); True when it is fine."""
        self.num_requests += 1
        counts = self.statuses.setdefault(operation, {})
        counts[status] = counts.get(status, 0) + 1
        problem = response_problem(status, body, openai=" /v1/" in operation)
        if problem is not None:
            self.add(operation, problem, f"{example()}\n      -> {status} {body[:400]!r}")
        return problem is None

    def coverage(self) -> str:
        """Status counts per operation (printed with ``-s``: what the fuzzing reached)."""
        return "\n".join(f"  {op}: {dict(sorted(c.items()))}"
                         for op, c in sorted(self.statuses.items()))

    def report(self) -> str:
        lines = [f"{len(self.by_kind)} kinds of contract breach in {self.num_requests} requests:"]
        for (operation, problem), examples in sorted(self.by_kind.items()):
            lines.append(f"* {operation}: {problem}")
            lines.extend(f"    {e}" for e in examples)
        return "\n".join(lines)


def check_futures(url: str, headers: Mapping[str, str],
                  accepted: Mapping[str, Callable[[], str]], findings: Findings) -> int:
    """Poll each accepted future once (``accepted``: request id → the request's repro); a
    done one must not have failed as a server error.

    Returns:
        how many were done (the rest may wait forever behind a seq_id gap the fuzzer left).
    """
    done = 0
    with httpx.Client(base_url=url, headers=dict(headers), timeout=30, trust_env=False) as http:
        for request_id, repro in accepted.items():
            response = http.post("/api/v1/retrieve_future", json={"request_id": request_id})
            findings.check("POST /api/v1/retrieve_future (accepted future)",
                           response.status_code, response.content, lambda r=request_id: r)
            if response.headers.get("content-type", "").startswith("application/json"):
                payload = response.json()
                if payload.get("type") == "try_again":
                    continue
                if payload.get("category") == "server":
                    findings.add("future of an accepted submit", "failed with category server",
                                 f"{repro()}\n      -> {request_id}: {payload}")
            done += 1
    return done
