"""Schemathesis over every JSON operation of the served OpenAPI document, against the live
engine server over real HTTP, while another tenant trains through the official SDK.

Each operation runs schemathesis' coverage phase (its deterministic boundary and
schema-violating cases) and then `EXAMPLES` fuzzed cases, positive and negative mixed (four
times as many for `DEEP_OPERATIONS`, whose nested bodies reach the engine). Most of a case's
ids are aimed (`Aim`) at the fuzzer's own live session / model / checkpoint / sampler (its next
free seq_id included), to reach past the 404s, or at the trainer's (to try to reach another
tenant's state with the fuzzer's key); now and then an integer field gets a value just past
int64 (JSON has no bounds; numpy and torch do). The contract is `tests.fuzz.contract`; in
addition a 2xx to a request naming the trainer's run or session is a tenancy breach. The
trainer's steps must equal, bit for bit, the same steps on the unfuzzed reference server.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Unsatisfiable
from pydantic import BaseModel
from schemathesis.generation.hypothesis.builder import (
    HypothesisTestConfig,
    HypothesisTestMode,
    create_test,
)

from loraplex.api.openapi import REQUEST_BODIES
from tests.fuzz.contract import Findings, accepted_request_id, check_futures
from tests.fuzz.tenant import CHECKPOINT_NAME, FuzzTenant, make_fuzz_tenant
from tests.fuzz.trainer import CHECKPOINT_NAME as TRAINER_CHECKPOINT
from tests.fuzz.trainer import MODEL, ConcurrentTrainer, TrainerIds, assert_fuzzing_clean, replay

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("LORAPLEX_FUZZ_EXAMPLES", "8"))  # fuzzed cases per operation
DEEP_EXAMPLES = 4 * EXAMPLES
DEEP_OPERATIONS = {"POST /api/v1/asample", "POST /api/v1/create_model",
                   "POST /api/v1/optim_step", "POST /api/v1/load_weights",
                   "POST /api/v1/save_weights_external", "POST /api/v1/create_session"}
PROTOBUF_OPERATION = "POST /api/v1/forward_backward"  # fuzzed by test_protobuf_fuzz.py
AIM_RATE = 0.75
INT64_EDGE_RATE = 0.1
INT64_EDGES = (2**63, 2**64, -(2**63) - 1)
TOKEN_EDGE_RATE = 0.2  # of aimed prompts: a token id just past int64
FOREIGN_TARGETS = ("session_id", "model_id", "run_id")  # a 2xx naming the trainer's is a breach
# Both generation modes; repro commands in full (the fields schemathesis would mask, "tokens"
# and "*_id", are what the bugs are about).
CONFIG = schemathesis.Config.from_dict({
    "generation": {"mode": "all"},
    "output": {"sanitization": {"enabled": False}}})
MODES = [HypothesisTestMode.COVERAGE, HypothesisTestMode.FUZZING]
MAX_SAMPLE_COST = {"num_samples": 2, "max_tokens": 4}  # aimed samples really run: keep small
VALID_PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [3, 4, 5]}]}


@dataclass
class Aim:
    """Pools of real ids to put into a case's path parameters and body fields."""

    tenant: FuzzTenant
    trainer: TrainerIds

    def pools(self) -> dict[str, list[Callable[[], Any]]]:
        """Field name → candidate values; the first is the fuzzer's own (picked at least half
        the time), a trainer id is always second."""
        t, o = self.tenant, self.trainer
        return {
            "session_id": [lambda: t.session_id, lambda: o.session_id],
            "model_id": [lambda: t.model_id, lambda: o.model_id],
            "run_id": [lambda: t.model_id, lambda: o.model_id],
            "seq_id": [lambda: t.next_seq, lambda: 0, lambda: 2**31 - 1, lambda: 2**63 - 1],
            "base_model": [lambda: MODEL],
            "path": [lambda: t.checkpoint_path, lambda: o.checkpoint_path,
                     lambda: CHECKPOINT_NAME],
            "model_path": [lambda: t.checkpoint_path, lambda: o.checkpoint_path],
            "tinker_path": [lambda: t.checkpoint_path, lambda: o.checkpoint_path],
            "kind": [lambda: "weights", lambda: "sampler_weights"],
            "name": [lambda: CHECKPOINT_NAME, lambda: TRAINER_CHECKPOINT],
            "sampler_id": [lambda: t.sampler_id],
            "sampling_session_id": [lambda: t.sampler_id],
            "request_id": [lambda: next(reversed(t.accepted), "req-none")],
        }

    def apply(self, case: schemathesis.Case, rng: random.Random) -> tuple[bool, bool]:
        """Aim most id fields of the case (a body's missing optional ids are added too).

        Returns:
            (aimed at the fuzzer's next seq slot, named a trainer id in a target field).
        """
        pools = self.pools()
        takes_slot = foreign = False
        targets = [(case.path_parameters, k) for k in list(case.path_parameters or {})]
        body = case.body if isinstance(case.body, dict) else None
        model = REQUEST_BODIES.get(case.operation.label)
        if body is not None:
            fields = set(model.model_fields) if model is not None else set()
            targets += [(body, k) for k in sorted(set(body) | (fields & set(pools)))]
        for where, key in targets:
            if key not in pools or rng.random() > AIM_RATE:
                continue
            pool = pools[key]
            choice = 0 if rng.random() < 0.5 else rng.randrange(len(pool))
            where[key] = pool[choice]()
            takes_slot |= key == "seq_id" and choice == 0
            foreign |= key in FOREIGN_TARGETS and choice == 1
        if body is not None:
            _int64_edges(body, model, rng)
        if body is not None and isinstance(body.get("prompt"), dict):
            _aim_prompt(body, rng)
        if body is not None and isinstance(body.get("sampling_params"), dict):
            _cap_sample_cost(body)
        return takes_slot, foreign


def _int64_edges(body: dict[str, Any], model: type[BaseModel] | None,
                 rng: random.Random) -> None:
    """Now and then put an integer just past int64 into an integer field of the request model
    (top level and one model down, present or not): JSON has no integer bounds, numpy and
    torch do."""
    for parent, name in _int_fields(model):
        where = body if parent is None else body.get(parent)
        if isinstance(where, dict) and rng.random() < INT64_EDGE_RATE:
            where[name] = rng.choice(INT64_EDGES)


def _int_fields(model: type[BaseModel] | None) -> list[tuple[str | None, str]]:
    """(parent field or None, field) of every int field of ``model`` and of its model fields."""
    if model is None:
        return []
    found: list[tuple[str | None, str]] = []
    for name, info in model.model_fields.items():
        kinds = typing.get_args(info.annotation) or (info.annotation,)
        if int in kinds:
            found.append((None, name))
        for kind in kinds:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += [(name, sub) for sub, sub_info in kind.model_fields.items()
                          if int in (typing.get_args(sub_info.annotation)
                                     or (sub_info.annotation,))]
    return found


def _aim_prompt(body: dict[str, Any], rng: random.Random) -> None:
    """This server samples text prompts only: often keep just the generated text chunks (their
    token ids as generated), or put a prompt that is valid for the model."""
    choice = rng.choice(["text chunks", "valid", "as generated"])
    chunks = body["prompt"].get("chunks")
    if choice == "as generated" or (choice == "text chunks" and not isinstance(chunks, list)):
        return
    text = [{**c, "type": "encoded_text"} for c in chunks or []
            if choice == "text chunks" and isinstance(c, dict)
            and isinstance(c.get("tokens"), list)]
    text = text or [dict(c) for c in VALID_PROMPT["chunks"]]
    if rng.random() < TOKEN_EDGE_RATE:
        text[0]["tokens"] = [*text[0]["tokens"], rng.choice(INT64_EDGES)]
    body["prompt"] = {**body["prompt"], "chunks": text}


def _cap_sample_cost(body: dict[str, Any]) -> None:
    """Aimed sample requests reach the engine: cap what they decode (not what they validate)."""
    params = body["sampling_params"]
    for where, key in ((body, "num_samples"), (params, "max_tokens")):
        value = where.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SAMPLE_COST[key]:
            where[key] = MAX_SAMPLE_COST[key]


def _operation_order(op: schemathesis.APIOperation) -> tuple[bool, str]:
    """Destructive operations (finishing the session, deleting the checkpoint) last."""
    return (op.method.upper() == "DELETE" or op.path.endswith("/finish"), op.label)


def fuzz_operation(op: schemathesis.APIOperation, url: str, aim: Aim, http: requests.Session,
                   findings: Findings) -> None:
    """One operation through schemathesis' coverage and fuzzing phases (what
    ``schema.parametrize()`` runs per operation, called directly so that one test drives every
    operation around one concurrent trainer). Aims come from a per-operation seeded RNG."""
    headers = aim.tenant.headers
    rng = random.Random(op.label)

    def run(case: schemathesis.Case) -> None:
        takes_slot, foreign = aim.apply(case, rng)
        response = case.call(base_url=url, session=http, headers=headers, timeout=60)

        def example() -> str:
            return case.as_curl_command(headers=headers, base_url=url)

        findings.check(op.label, response.status_code, response.content, example)
        request_id = accepted_request_id(response.status_code, response.content)
        if request_id is not None:  # the repro now: schemathesis may reuse the case object
            repro = example()
            aim.tenant.accepted.setdefault(request_id, lambda: repro)
        if takes_slot and response.status_code == 200:
            aim.tenant.next_seq += 1
        if foreign and 200 <= response.status_code < 300:
            findings.add(op.label, "2xx for another tenant's session / run",
                         f"{example()}\n      -> {response.status_code} {response.content[:300]!r}")

    budget = DEEP_EXAMPLES if op.label in DEEP_OPERATIONS else EXAMPLES
    config = HypothesisTestConfig(project=CONFIG.projects.get_default(), modes=MODES,
                                  settings=settings(
                                      max_examples=budget, deadline=None, database=None,
                                      derandomize=True, phases=[Phase.explicit, Phase.generate],
                                      suppress_health_check=list(HealthCheck)))
    # Unsatisfiable: an operation without parameters or body, nothing past its coverage cases.
    with contextlib.suppress(Unsatisfiable):
        create_test(operation=op, test_func=run, config=config)()


def test_fuzzed_json_operations_never_fail_the_contract_nor_the_training_tenant(
        fuzz_server: str, reference_server: str) -> None:
    trainer = ConcurrentTrainer(fuzz_server)
    trainer_ids = trainer.start()
    tenant = make_fuzz_tenant(fuzz_server)
    schema = schemathesis.openapi.from_url(f"{fuzz_server}/openapi.json", config=CONFIG)
    operations = sorted((r.ok() for r in schema.get_all_operations()), key=_operation_order)
    operations = [op for op in operations if op.label != PROTOBUF_OPERATION]
    assert len(operations) >= 30, [op.label for op in operations]
    findings, aim = Findings(), Aim(tenant, trainer_ids)
    started = time.monotonic()
    with requests.Session() as http:
        http.trust_env = False
        for op in operations:
            fuzz_operation(op, fuzz_server, aim, http, findings)
    window = (started, time.monotonic())
    trace = trainer.stop()
    check_futures(fuzz_server, tenant.headers, tenant.accepted, findings)
    reference = replay(reference_server, len(trace.steps))
    print(f"schemathesis: {findings.num_requests} requests over {len(operations)} operations "
          f"in {window[1] - window[0]:.1f} s; trainer ran {len(trace.steps)} steps\n"
          f"{findings.coverage()}")
    assert_fuzzing_clean([findings.report()] if findings.by_kind else [], trainer, trace,
                         reference, window)
