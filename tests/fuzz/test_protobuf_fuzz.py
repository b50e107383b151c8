"""Adversarial protobuf (and zstd) bodies for ``POST /api/v1/forward_backward`` against the live
engine server, while another tenant trains through the official SDK.

`EXAMPLES` random `ProtoCase`s (`tests.fuzz.proto_strategies`) after a few explicit ones (the
sparse ``[1, 10**8]`` shape, a 2^63-1 seq_id varint, ...), each sent with the fuzzer's key to
its own model (at its next seq_id, or any other), to the trainer's model, to an empty or a
random id. The contract is `tests.fuzz.contract` (no 5xx, every 4xx JSON naming the problem,
no accepted future failing as a server error); a 2xx for the trainer's model is a tenancy
breach; the trainer's steps must equal, bit for bit, the same steps on the unfuzzed server.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from tinker.proto import tinker_public_pb2 as pb

from tests.fuzz.contract import Findings, accepted_request_id, check_futures
from tests.fuzz.proto_strategies import ProtoCase, proto_cases
from tests.fuzz.tenant import FuzzTenant, make_fuzz_tenant
from tests.fuzz.trainer import ConcurrentTrainer, TrainerIds, assert_fuzzing_clean, replay

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("LORAPLEX_FUZZ_PROTO_EXAMPLES", "300"))
OPERATION = "POST /api/v1/forward_backward"


def _tokens(*ids: int) -> pb.Chunk:
    return pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.asarray(ids, "<i4").tobytes()))


def _case(data: list[pb.Datum], *, seq: int | None = None, wire_seq: int | None = None,
          encoding: str = "identity", model: str = "own") -> ProtoCase:
    msg = pb.ForwardBackwardRequest(data=data, loss_fn="cross_entropy")
    return ProtoCase(msg, model, "", seq, wire_seq, encoding, None, None)  # type: ignore[arg-type]


HUGE_SPARSE = pb.Datum(model_input=[_tokens(3, 4)], loss_fn_inputs={
    "weights": pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[1, 10**8], sparse_csr=pb.SparseCsr(
        values=np.ones(1, "<f4").tobytes(), crow_indices=np.asarray([0, 1], "<i8").tobytes(),
        col_indices=np.asarray([10**8 - 1], "<i8").tobytes()))})
HUGE_DENSE = pb.Datum(model_input=[_tokens(3)], loss_fn_inputs={
    "weights": pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2**62, 4], dense=b"\0" * 4)})
VALID = pb.Datum(model_input=[_tokens(3, 4, 5)], loss_fn_inputs={
    "target_tokens": pb.Tensor(dtype=pb.DTYPE_INT64, shape=[3],
                               dense=np.asarray([4, 5, 6], "<i8").tobytes()),
    "weights": pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[3], dense=np.ones(3, "<f4").tobytes())})
EXPLICIT = [
    _case([HUGE_SPARSE]), _case([HUGE_DENSE]), _case([VALID], encoding="zstd"),
    _case([VALID], wire_seq=2**63 - 1), _case([VALID], wire_seq=2**64 - 1),
    _case([VALID], model="trainer", seq=3), _case([VALID], seq=2**31 - 1),
    _case([pb.Datum(model_input=[pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=b"\1" * 5))])]),
    _case([pb.Datum(model_input=[_tokens(2**31 - 1)])]),
    _case([pb.Datum(model_input=[_tokens(3)], loss_fn_inputs={
        "weights": pb.Tensor(dtype=99, shape=[1], dense=b"\0" * 4)})]),
]


def _model_id(case: ProtoCase, tenant: FuzzTenant, trainer: TrainerIds) -> str:
    return {"own": tenant.model_id, "trainer": trainer.model_id, "empty": "",
            "random": case.random_model}[case.model]


def fuzz_forward_backward(url: str, tenant: FuzzTenant, trainer: TrainerIds, vocab_size: int,
                          findings: Findings) -> None:
    with httpx.Client(base_url=url, headers=tenant.headers, timeout=60,
                      trust_env=False) as http:

        def run(case: ProtoCase) -> None:
            body, headers = case.render(_model_id(case, tenant, trainer), tenant.next_seq)
            response = http.post("/api/v1/forward_backward", content=body, headers=headers)

            def repro() -> str:
                return f"{case.model} model, headers {headers}, body {body[:600].hex()}"

            findings.check(OPERATION, response.status_code, response.content, repro)
            request_id = accepted_request_id(response.status_code, response.content)
            if request_id is not None:
                tenant.accepted.setdefault(request_id, repro)
            if response.status_code == 200 and case.aims_at_next_slot:
                tenant.next_seq += 1
            if case.model == "trainer" and 200 <= response.status_code < 300:
                findings.add(OPERATION, "2xx for another tenant's model", repro())

        for explicit in reversed(EXPLICIT):
            run = example(explicit)(run)
        settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                 phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=list(HealthCheck))(given(proto_cases(vocab_size))(run))()


def test_fuzzed_forward_backward_bodies_never_fail_the_contract_nor_the_training_tenant(
        fuzz_server: str, reference_server: str, tiny_model_dir: Path) -> None:
    vocab_size = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    trainer = ConcurrentTrainer(fuzz_server)
    trainer_ids = trainer.start()
    tenant = make_fuzz_tenant(fuzz_server)
    findings = Findings()
    started = time.monotonic()
    fuzz_forward_backward(fuzz_server, tenant, trainer_ids, vocab_size, findings)
    window = (started, time.monotonic())
    trace = trainer.stop()
    num_done = check_futures(fuzz_server, tenant.headers, tenant.accepted, findings)
    reference = replay(reference_server, len(trace.steps))
    print(f"protobuf fuzz: {findings.num_requests} requests in {window[1] - window[0]:.1f} s, "
          f"{len(tenant.accepted)} accepted ({num_done} done); trainer ran {len(trace.steps)} "
          f"steps\n{findings.coverage()}")
    assert_fuzzing_clean([findings.report()] if findings.by_kind else [], trainer, trace,
                         reference, window)
