"""The wire captures of the real SDKs (copied into ``wire_captures/``) as fixtures:
every captured JSON request body (0.38 and 0.27) parses with our schemas, every captured
protobuf request decodes to the values the capture shows, and our encoders produce the same
protobuf messages the SDK accepted for the same values."""

from __future__ import annotations

import base64
import glob
import json
import os
from array import array
from typing import Any

import pytest
from pydantic import BaseModel
from tinker.proto import tinker_public_pb2 as pb

from loraplex.api import codec, schemas
from loraplex.domain.results import ForwardBackwardResult
from loraplex.domain.sampling import SampledSequence, SampleResult, TopkLogprobs

CAPTURES = os.path.join(os.path.dirname(__file__), "wire_captures")
SCHEMA_OF_PATH: dict[str, type[BaseModel]] = {
    "/api/v1/create_session": schemas.CreateSessionRequest,
    "/api/v1/session_heartbeat": schemas.SessionHeartbeatRequest,
    "/api/v1/create_model": schemas.CreateModelRequest,
    "/api/v1/get_info": schemas.GetInfoRequest,
    "/api/v1/optim_step": schemas.OptimStepRequest,
    "/api/v1/save_weights": schemas.SaveWeightsRequest,
    "/api/v1/save_weights_for_sampler": schemas.SaveWeightsForSamplerRequest,
    "/api/v1/load_weights": schemas.LoadWeightsRequest,
    "/api/v1/create_sampling_session": schemas.CreateSamplingSessionRequest,
    "/api/v1/asample": schemas.SampleRequest,
    "/api/v1/retrieve_future": schemas.FutureRetrieveRequest,
    "/api/v1/weights_info": schemas.WeightsInfoRequest,
}


def records() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(glob.glob(os.path.join(CAPTURES, "[0-9]*.json"))):
        with open(path) as f:
            out += [(os.path.basename(path), r) for r in json.load(f)]
    return out


def test_every_captured_json_request_parses_including_sdk_027() -> None:
    parsed = 0
    for _, record in records():
        schema = SCHEMA_OF_PATH.get(record["path"])
        if schema is None or record.get("request_body_json") is None:
            continue
        schemas.parse(schema, json.dumps(record["request_body_json"]).encode())
        parsed += 1
    assert parsed > 60
    assert any(n.startswith("35_") for n, r in records() if r["path"] in SCHEMA_OF_PATH)


def test_captured_forward_backward_protobufs_decode_to_the_captured_values() -> None:
    decoded = 0
    for _, record in records():
        if "request_body_raw_base64" not in record:
            continue
        view = record["request_body_proto_decoded"]
        msg = codec.decode_forward_backward(
            base64.b64decode(record["request_body_raw_base64"]), None)
        assert (msg.model_id, msg.seq_id, msg.loss_fn) == (
            view["model_id"], view["seq_id"], view["loss_fn"])
        assert msg.forward_only == view["forward_only"]
        config = msg.loss_fn_config
        assert config == {k: pytest.approx(v) for k, v in view["loss_fn_config"].items()}
        for datum, expected in zip(msg.data, view["data"], strict=True):
            tokens = [t for c in expected["model_input"] for t in c["encoded_text"][
                "tokens(int32 LE)"]]
            assert list(datum.tokens) == tokens
            for key, tensor in expected["loss_fn_inputs"].items():
                got = datum.loss_fn_inputs[key]
                assert list(got.shape) == tensor["shape"]
                assert list(got.data) == pytest.approx(tensor["values"])
        decoded += 1
    assert decoded == 3


def _f32(b64: str) -> array:
    out = array("f")
    out.frombytes(base64.b64decode(b64))
    return out


def _i32(b64: str) -> array:
    out = array("i")
    out.frombytes(base64.b64decode(b64))
    return out


def _captured(kind: type, record: dict[str, Any]) -> Any:
    msg = kind()
    msg.ParseFromString(base64.b64decode(record["response_raw_base64"]))
    return msg


def test_our_forward_backward_output_equals_what_the_sdk_accepted() -> None:
    checked = 0
    for _, record in records():
        if "response_raw_base64" not in record or "lossFnOutputs" not in record[
                "response_proto_as_dict"]:
            continue
        captured = _captured(pb.ForwardBackwardOutput, record)
        fields = captured.loss_fn_outputs[0].fields
        per_datum = {}
        for name in ("logprobs", "elementwise_loss"):
            offsets = array("q")
            offsets.frombytes(fields[name].offsets)
            flat = _f32(base64.b64encode(fields[name].data).decode())
            per_datum[name] = tuple(flat[offsets[i] // 4: offsets[i + 1] // 4]
                                    for i in range(len(offsets) - 1))
        result = ForwardBackwardResult(per_datum["logprobs"], per_datum["elementwise_loss"],
                                       dict(captured.metrics))
        ours = pb.ForwardBackwardOutput()
        ours.ParseFromString(codec.encode_forward_backward(result))
        for record_ours in ours.loss_fn_outputs:
            record_ours.type_tag = captured.loss_fn_outputs[0].type_tag
        assert ours == captured
        checked += 1
    assert checked == 3


def test_our_sample_response_equals_what_the_sdk_accepted() -> None:
    checked = 0
    for _, record in records():
        if "response_raw_base64" not in record or "sequences" not in record[
                "response_proto_as_dict"]:
            continue
        captured = _captured(pb.SampleResponse, record)
        seqs = []
        for s in captured.sequences:
            topk = None
            if s.HasField("topk_sampled_logprobs"):
                t = s.topk_sampled_logprobs
                topk = TopkLogprobs(t.k, t.length, _i32(base64.b64encode(t.token_ids).decode()),
                                    _f32(base64.b64encode(t.logprobs).decode()))
            seqs.append(SampledSequence(
                _i32(base64.b64encode(s.tokens).decode()),
                _f32(base64.b64encode(s.logprobs).decode()),
                "stop" if s.stop_reason == pb.STOP_REASON_STOP else "length", topk))
        prompt = (_f32(base64.b64encode(captured.prompt_logprobs).decode())
                  if captured.HasField("prompt_logprobs") else None)
        ours = pb.SampleResponse()
        ours.ParseFromString(codec.encode_sample(SampleResult(tuple(seqs), prompt)))
        assert ours == captured
        checked += 1
    assert checked == 3
