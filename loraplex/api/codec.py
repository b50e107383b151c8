"""Protobuf codec for the two heavy paths, using the SDK's compiled messages
(`tinker.proto.tinker_public_pb2`): forward_backward requests in, ForwardBackwardOutput and
SampleResponse out (tinker-api.md §8).

Decoding turns a body into one typed `ForwardBackwardBody` (int32 tokens → int64, bf16 → f32,
CSR → dense), within the request bounds (`LimitsConfig`: decompressed size, tensor elements
checked on the shape before any allocation), and names the offending datum and field on any
malformed input. Encoding writes the
exact layouts the SDK's ``response_conv`` reads. Numbers travel as little-endian buffers.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from loraplex.api.model_input import checked_chunk
from loraplex.config import LimitsConfig
from loraplex.domain.data import Datum, ProvenanceSpan, TensorData
from loraplex.domain.results import ForwardBackwardResult
from loraplex.domain.sampling import SampleResult, TopkLogprobs
from loraplex.errors import PayloadTooLargeError, UserError, user_error

PROTO_CONTENT_TYPE = "application/x-protobuf"
DEFAULT_LIMITS = LimitsConfig()

_NP_OF_DTYPE: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"), pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_INT32: np.dtype("<i4"), pb.DTYPE_BFLOAT16: np.dtype("<u2"),
}


@dataclass(frozen=True)
class ForwardBackwardBody:
    """A decoded forward / forward_backward request: what the route needs, no protobuf.

    Attributes:
        model_id, seq_id: the address, as sent (the route checks it).
        data: the datums, decoded (empty when ``problem`` is set).
        problem: why the datums could not be decoded; the address is still known, so the
            request keeps its seq slot and fails its own future with this error.
    """

    model_id: str
    seq_id: int
    forward_only: bool
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    data: tuple[Datum, ...]
    problem: UserError | None = None


def decode_forward_backward(body: bytes, content_encoding: str | None,
                            limits: LimitsConfig = DEFAULT_LIMITS) -> ForwardBackwardBody:
    """Parse a (possibly zstd-compressed) ForwardBackwardRequest body, datums included.
    CPU work for big bodies: routes run it off the event loop.

    Raises:
        UserError: the body is not valid zstd / protobuf (no address can be read).
        PayloadTooLargeError: it decompresses past ``limits.max_decompressed_bytes``.
    """
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(_decompressed(body, content_encoding, limits))
    except DecodeError as exc:
        raise user_error("body", f"not a ForwardBackwardRequest protobuf: {exc}") from None
    try:
        data, problem = datums(msg, limits), None
    except UserError as exc:
        data, problem = (), exc.detached()
    return ForwardBackwardBody(msg.model_id, msg.seq_id, msg.forward_only, msg.loss_fn,
                               loss_fn_config(msg), data, problem)


def _decompressed(body: bytes, content_encoding: str | None, limits: LimitsConfig) -> bytes:
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("identity", ""):
        return body
    if encoding != "zstd":
        raise user_error("Content-Encoding", f"unsupported encoding {content_encoding!r}")
    limit = limits.max_decompressed_bytes
    try:
        out = zstandard.ZstdDecompressor().stream_reader(body).read(limit + 1)
    except zstandard.ZstdError as exc:
        raise user_error("body", f"Content-Encoding zstd but not decodable: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLargeError(f"body: decompresses to more than {limit} bytes (server."
                                   "limits.max_decompressed_bytes)", field="body")
    return out


def loss_fn_config(msg: pb.ForwardBackwardRequest) -> dict[str, float | str]:
    """``loss_fn_config_v2`` (numbers and strings) merged over the legacy float map."""
    config: dict[str, float | str] = dict(msg.loss_fn_config.items())
    for key, value in msg.loss_fn_config_v2.items():
        which = value.WhichOneof("value")
        if which == "number":
            config[key] = value.number
        elif which == "text":
            config[key] = value.text
    return config


def datums(msg: pb.ForwardBackwardRequest, limits: LimitsConfig) -> tuple[Datum, ...]:
    """Decode every datum; structural problems raise a UserError naming ``data[i].…``. The
    request's tensors together are checked against ``limits.max_request_elements`` on their
    shapes first, before any is decoded."""
    _check_request_elements(msg, limits)
    return tuple(_datum(d, f"data[{i}]", limits) for i, d in enumerate(msg.data))


def _check_request_elements(msg: pb.ForwardBackwardRequest, limits: LimitsConfig) -> None:
    """Sums in datum order, each datum's inputs by name (a protobuf map's own order is not
    defined), so the tensor named is the same for the same request."""
    total = 0
    for i, d in enumerate(msg.data):
        for name, t in sorted(d.loss_fn_inputs.items()):
            elements = math.prod(int(s) for s in t.shape)
            if elements > limits.max_tensor_elements:
                continue  # `tensor` names that one's own bound
            total += max(0, elements)
            if total > limits.max_request_elements:
                raise user_error(f"data[{i}].loss_fn_inputs.{name}.shape",
                                 f"the request's tensors hold more than "
                                 f"{limits.max_request_elements} elements together (server."
                                 "limits.max_request_elements)")


def _datum(d: pb.Datum, where: str, limits: LimitsConfig) -> Datum:
    parts, images = [], []
    num_text = 0
    for j, chunk in enumerate(d.model_input):
        kind, field = chunk.WhichOneof("chunk"), f"{where}.model_input.chunks[{j}]"
        if kind == "image":
            image = chunk.image
            if image.HasField("override_dimensions"):
                raise user_error(f"{field}.override_dimensions", "not supported by this server")
            images.append(checked_chunk(
                image.data, image.format,
                image.expected_tokens if image.HasField("expected_tokens") else None,
                num_text, field, limits))
            continue
        if kind != "encoded_text":
            raise user_error(field, f"{kind} chunks are not supported (text and images)")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise user_error(field, "tokens are not int32 bytes")
        parts.append(np.frombuffer(raw, dtype="<i4"))
        num_text += len(raw) // 4
    tokens_T = np.concatenate(parts).astype("<i8") if parts else np.zeros(0, dtype="<i8")
    inputs = {name: tensor(t, f"{where}.loss_fn_inputs.{name}", limits)
              for name, t in d.loss_fn_inputs.items()}
    return Datum(
        tokens=_to_array("q", tokens_T),
        loss_fn_inputs=inputs,
        model_input_spans=spans(d.model_input_spans, f"{where}.model_input_spans"),
        loss_fn_input_spans=spans(d.loss_fn_input_spans, f"{where}.loss_fn_input_spans"),
        pending_images=tuple(images),
    )


def tensor(t: pb.Tensor, field: str, limits: LimitsConfig) -> TensorData:
    """A wire Tensor as a dense domain tensor (float32 or int64); its shape is checked against
    ``limits.max_tensor_elements`` before anything is allocated."""
    np_dtype = _NP_OF_DTYPE.get(t.dtype)
    if np_dtype is None:
        raise user_error(f"{field}.dtype", f"unsupported dtype {t.dtype} (one of "
                         f"{sorted(pb.DType.Name(d) for d in _NP_OF_DTYPE)})")
    shape = tuple(int(s) for s in t.shape)
    if any(s < 0 for s in shape):
        raise user_error(f"{field}.shape", f"negative dimension in {list(shape)}")
    if math.prod(shape) > limits.max_tensor_elements:
        raise user_error(f"{field}.shape", f"{list(shape)} holds more than "
                         f"{limits.max_tensor_elements} elements (server.limits."
                         "max_tensor_elements)")
    encoding = t.WhichOneof("encoding")
    if encoding == "sparse_csr":
        values = _frombuffer(t.sparse_csr.values, np_dtype, field)
        dense = _densify(values, t.sparse_csr, shape, field)
    else:
        dense = _frombuffer(t.dense if encoding == "dense" else b"", np_dtype, field)
        if not shape:
            shape = (dense.size,)
        if math.prod(shape) != dense.size:
            raise user_error(field, f"{dense.size} values do not fill shape {list(shape)}")
    if t.dtype == pb.DTYPE_BFLOAT16:
        dense = (dense.astype("<u4") << 16).view("<f4")
    if dense.dtype.kind == "f":
        return TensorData("float32", shape, _to_array("f", dense.astype("<f4")))
    return TensorData("int64", shape, _to_array("q", dense.astype("<i8")))


def _frombuffer(raw: bytes, dtype: np.dtype, field: str) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise user_error(field, f"{len(raw)} bytes is not a whole number of {dtype} values")
    return np.frombuffer(raw, dtype=dtype)


def _densify(values: np.ndarray, csr: pb.SparseCsr, shape: tuple[int, ...],
             field: str) -> np.ndarray:
    if len(shape) != 2:
        raise user_error(field, "sparse CSR tensors need a 2-D shape")
    crow = _frombuffer(csr.crow_indices, np.dtype("<i8"), field)
    col = _frombuffer(csr.col_indices, np.dtype("<i8"), field)
    rows, cols = shape
    if (len(crow) != rows + 1 or len(col) != len(values) or crow[0] != 0
            or crow[-1] != len(values) or np.any(np.diff(crow) < 0)
            or (len(col) and (col.min() < 0 or col.max() >= cols))):
        raise user_error(field, "inconsistent sparse CSR indices")
    dense = np.zeros(shape, dtype=values.dtype)
    row_of = np.repeat(np.arange(rows), np.diff(crow))
    dense[row_of, col] = values
    return dense


def spans(raw: Sequence[pb.ProvenanceSpan], field: str) -> tuple[ProvenanceSpan, ...]:
    out = []
    for k, span in enumerate(raw):
        kind = span.WhichOneof("span")
        if kind is None:
            raise user_error(f"{field}[{k}]", "empty provenance span")
        body = span.prompt_tokens if kind == "prompt_tokens" else span.sampled_tokens
        if body.offset < 0 or body.length < 0 or not body.sequence_id:
            raise user_error(f"{field}[{k}]", "needs a sequence_id, offset ≥ 0 and length ≥ 0")
        out.append(ProvenanceSpan("prompt" if kind == "prompt_tokens" else "sampled",
                                  body.sequence_id, body.offset, body.length))
    return tuple(out)


def encode_forward_backward(result: ForwardBackwardResult) -> bytes:
    """ForwardBackwardOutput with one ArrayRecord holding ``logprobs`` (trailing shape
    ``[K]`` for top-K targets) and ``elementwise_loss`` (float32, per-datum byte offsets)."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(result.logprobs))
    for name, per_datum, trailing in (
            ("logprobs", result.logprobs, result.logprobs_trailing_shape),
            ("elementwise_loss", result.elementwise_loss, ())):
        if len(per_datum) != len(result.logprobs):
            continue
        field = record.fields[name]
        field.dtype = pb.DTYPE_FLOAT32
        field.trailing_shape.extend(trailing)
        field.data = b"".join(_f32_bytes(a) for a in per_datum)
        ends = np.cumsum([0] + [4 * len(a) for a in per_datum], dtype="<i8")
        field.offsets = ends.tobytes()
    _put_metrics(msg.metrics, result.metrics)
    encoded: bytes = msg.SerializeToString()
    return encoded


def encode_sample(result: SampleResult) -> bytes:
    """SampleResponse: tokens int32, logprobs float32 per sequence, prompt-level extras."""
    msg = pb.SampleResponse(prompt_cache_hit_tokens=result.prompt_cache_hit_tokens)
    for seq in result.sequences:
        out = msg.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=_i32_bytes(seq.tokens), logprobs=_f32_bytes(seq.logprobs))
        if seq.topk_logprobs is not None:
            _put_topk(out.topk_sampled_logprobs, seq.topk_logprobs)
    if result.prompt_logprobs is not None:
        msg.prompt_logprobs = _f32_bytes(result.prompt_logprobs)
    if result.topk_prompt_logprobs is not None:
        _put_topk(msg.topk_prompt_logprobs, result.topk_prompt_logprobs)
    if (alt := result.prompt_alt_tokens) is not None:
        shape = (alt.rows, alt.k)
        msg.prompt_alt_tokens.tokens.CopyFrom(pb.Tensor(
            dense=np.asarray(alt.tokens, dtype="<i8").tobytes(), dtype=pb.DTYPE_INT64,
            shape=shape))
        msg.prompt_alt_tokens.logprobs.CopyFrom(pb.Tensor(
            dense=_f32_bytes(alt.logprobs), dtype=pb.DTYPE_FLOAT32, shape=shape))
    encoded: bytes = msg.SerializeToString()
    return encoded


def _put_topk(out: pb.TopkLogprobs, topk: TopkLogprobs) -> None:
    out.k, out.length = topk.k, topk.length
    out.token_ids = _i32_bytes(topk.token_ids)
    out.logprobs = _f32_bytes(topk.logprobs)


def _put_metrics(out: Mapping[str, float], metrics: Mapping[str, float]) -> None:
    for key, value in metrics.items():
        # The SDK crashes on keys without exactly one ':' (tinker-api.md §0.6).
        if key.count(":") != 1:
            key = key.replace(":", "_") + ":mean"
        out[key] = float(value)  # type: ignore[index]


def _f32_bytes(values: array[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def _i32_bytes(values: array[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _to_array(typecode: str, values: np.ndarray) -> array[Any]:
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values).tobytes())
    return out
