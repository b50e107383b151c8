"""Hypothesis strategies for adversarial ``POST /api/v1/forward_backward`` bodies.

A `ProtoCase` is a `tinker_public.ForwardBackwardRequest` (the SDK's compiled message) whose
address is filled in at send time (``model`` names a pool entry, ``seq`` may be "next": the
fuzzer's next free seq_id), plus how it travels: an appended raw seq_id varint (values an
int32 field cannot hold), truncation, zstd (well-formed or not), a wrong Content-Encoding, or
plain garbage instead of a message. Datums are either well-formed for the model (so the engine
really runs them, beside the concurrent trainer) or built from adversarial parts: token bytes
that are no int32 array, out-of-vocabulary ids, every dtype number, shapes negative / huge /
mismatched, sparse CSR with inconsistent indices or a shape like ``[1, 10**8]``, NaN and inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import zstandard
from hypothesis import strategies as st
from tinker.proto import tinker_public_pb2 as pb

INT32 = (-(2**31), 2**31 - 1)
HUGE_DIMS = (10**8, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63), -1)
LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo",
            "stable_reinforce", "custom")
INPUT_NAMES = ("target_tokens", "weights", "advantages", "logprobs", "mask",
               "clip_low_threshold", "sequence_ratio_mask")
Encoding = Literal["identity", "none", "zstd", "zstd-garbage", "gzip", "ZSTD"]
Model = Literal["own", "trainer", "empty", "random"]


@dataclass(frozen=True)
class ProtoCase:
    """One forward_backward request before its address is known.

    Attributes:
        model: which model id to send (`Model`); ``random_model`` is the text for "random".
        seq: a seq_id, or None for the fuzzer's next free one.
        wire_seq: a seq_id varint appended after the message (the last value wins in proto3),
            which may be out of the int32 range.
        truncate_to: cut the encoded message to this many bytes.
        garbage: send these bytes instead of any message.
    """

    message: pb.ForwardBackwardRequest
    model: Model
    random_model: str
    seq: int | None
    wire_seq: int | None
    encoding: Encoding
    truncate_to: int | None
    garbage: bytes | None

    def render(self, model_id: str, next_seq: int) -> tuple[bytes, dict[str, str]]:
        """The body and its headers (Content-Type, Content-Encoding) for this address."""
        msg = pb.ForwardBackwardRequest()
        msg.CopyFrom(self.message)
        msg.model_id = model_id
        msg.seq_id = next_seq if self.seq is None else self.seq
        raw = self.garbage if self.garbage is not None else msg.SerializeToString()
        if self.wire_seq is not None and self.garbage is None:
            raw += b"\x10" + varint(self.wire_seq)  # field 2 (seq_id), wire type 0
        if self.truncate_to is not None:
            raw = raw[:self.truncate_to]
        headers = {"Content-Type": "application/x-protobuf"}
        if self.encoding == "zstd":
            raw = zstandard.ZstdCompressor(level=1).compress(raw)
        if self.encoding != "none":
            headers["Content-Encoding"] = ("zstd" if self.encoding == "zstd-garbage"
                                           else self.encoding)
        return raw, headers

    @property
    def aims_at_next_slot(self) -> bool:
        """Addressed to the fuzzer's own model at its next seq_id (a 200 means it took it)."""
        return self.model == "own" and self.seq is None and self.wire_seq is None


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of ``value`` as a uint64 (negative numbers take 10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _ints32() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(*INT32), st.sampled_from([0, -1, 1, 2, *INT32]))


def _token_ids(vocab_size: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, vocab_size - 1),
                     st.sampled_from([vocab_size, vocab_size + 1, -1, *INT32]))


def _floats() -> st.SearchStrategy[float]:
    return st.one_of(st.floats(-4, 4, width=32),
                     st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0, -0.0,
                                      3.4e38, 1e-45]))


def _chunks(vocab_size: int) -> st.SearchStrategy[pb.Chunk]:
    token_bytes = st.one_of(
        st.lists(_token_ids(vocab_size), max_size=12).map(
            lambda ids: np.asarray(ids, dtype="<i4").tobytes()),
        st.binary(max_size=13))  # mostly not a multiple of 4
    return st.one_of(
        token_bytes.map(lambda b: pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=b))),
        st.builds(lambda d, f, n: pb.Chunk(image=pb.ImageChunk(data=d, format=f,
                                                               expected_tokens=n)),
                  st.binary(max_size=16), st.sampled_from(["png", "jpeg", "", "gif"]),
                  _ints32()),
        st.binary(max_size=16).map(lambda b: pb.Chunk(dmel=pb.DmelChunk(dmel=b))),
        st.just(pb.Chunk()))  # no oneof set


def _dims() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-2, 12), st.sampled_from(HUGE_DIMS))


def _dtypes() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(sorted(pb.DType.values())), st.integers(5, 99),
                     st.integers(*INT32))


def _dense_tensors() -> st.SearchStrategy[pb.Tensor]:
    return st.builds(lambda dtype, shape, data: pb.Tensor(dtype=dtype, shape=shape, dense=data),
                     _dtypes(), st.lists(_dims(), max_size=4), st.binary(max_size=64))


def _int64_bytes(values: st.SearchStrategy[int], max_size: int) -> st.SearchStrategy[bytes]:
    return st.one_of(st.lists(values, max_size=max_size).map(
        lambda v: np.asarray(v, dtype="<i8").tobytes()), st.binary(max_size=20))


def _sparse_tensors() -> st.SearchStrategy[pb.Tensor]:
    """CSR tensors: small random index arrays against any shape (``[1, 10**8]`` included)."""
    index = st.one_of(st.integers(-2, 12), st.sampled_from([2**62, -(2**63), 10**8]))
    csr = st.builds(lambda v, r, c: pb.SparseCsr(values=v, crow_indices=r, col_indices=c),
                    st.binary(max_size=32), _int64_bytes(index, 6), _int64_bytes(index, 6))
    shape = st.one_of(st.lists(_dims(), max_size=3), st.just([1, 10**8]),
                      st.just([10**8, 1]))
    return st.builds(lambda dtype, s, c: pb.Tensor(dtype=dtype, shape=s, sparse_csr=c),
                     _dtypes(), shape, csr)


def _spans() -> st.SearchStrategy[pb.ProvenanceSpan]:
    fields = st.fixed_dictionaries({
        "sequence_id": st.text(max_size=12),
        "offset": st.one_of(st.integers(-3, 20), st.sampled_from([2**63 - 1, -(2**63)])),
        "length": st.one_of(st.integers(-3, 20), st.sampled_from([2**63 - 1, -(2**63)]))})
    return st.one_of(
        fields.map(lambda f: pb.ProvenanceSpan(prompt_tokens=pb.PromptProvenanceSpan(**f))),
        fields.map(lambda f: pb.ProvenanceSpan(sampled_tokens=pb.SampledProvenanceSpan(**f))),
        st.just(pb.ProvenanceSpan()))


def adversarial_datums(vocab_size: int) -> st.SearchStrategy[pb.Datum]:
    return st.builds(
        lambda chunks, inputs, spans, input_spans: pb.Datum(
            model_input=chunks, loss_fn_inputs=inputs, model_input_spans=spans,
            loss_fn_input_spans=input_spans),
        st.lists(_chunks(vocab_size), max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(INPUT_NAMES), st.text(max_size=6)),
                        st.one_of(_dense_tensors(), _sparse_tensors()), max_size=3),
        st.lists(_spans(), max_size=2), st.lists(_spans(), max_size=1))


@st.composite
def wellformed_datums(draw: st.DrawFn, vocab_size: int) -> pb.Datum:
    """A datum the model can run: tokens in the vocabulary, targets ``[N]`` or top-K
    ``[N, K]`` with weights of the same shape, in any legal encoding (int32 and bf16 widening,
    CSR for 2-D weights); weights may still be NaN or inf."""
    n = draw(st.integers(1, 12))
    k = draw(st.sampled_from([None, None, 1, 2]))
    shape = [n] if k is None else [n, k]
    size = n * (k or 1)
    tokens = draw(st.lists(st.integers(0, vocab_size - 1), min_size=n, max_size=n))
    targets = draw(st.lists(st.integers(0, vocab_size - 1), min_size=size, max_size=size))
    weights = np.asarray(draw(st.lists(_floats(), min_size=size, max_size=size)),
                         dtype="<f4").reshape(shape)
    datum = pb.Datum(model_input=[pb.Chunk(encoded_text=pb.EncodedTextChunk(
        tokens=np.asarray(tokens, dtype="<i4").tobytes()))])
    int_dtype = draw(st.sampled_from([pb.DTYPE_INT64, pb.DTYPE_INT32]))
    datum.loss_fn_inputs["target_tokens"].CopyFrom(pb.Tensor(
        dtype=int_dtype, shape=shape, dense=np.asarray(
            targets, dtype="<i8" if int_dtype == pb.DTYPE_INT64 else "<i4").tobytes()))
    kinds = ["f32", "bf16"] if k is None else ["f32", "bf16", "csr"]
    datum.loss_fn_inputs["weights"].CopyFrom(_float_tensor(weights, draw(st.sampled_from(kinds))))
    return datum


def _float_tensor(values: np.ndarray, kind: str) -> pb.Tensor:
    shape = list(values.shape)
    if kind == "f32":
        return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=shape, dense=values.tobytes())
    if kind == "bf16":
        bf16 = (values.view("<u4") >> 16).astype("<u2")
        return pb.Tensor(dtype=pb.DTYPE_BFLOAT16, shape=shape, dense=bf16.tobytes())
    rows, cols = np.nonzero(values)
    crow = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=shape[0]))])
    return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=shape, sparse_csr=pb.SparseCsr(
        values=values[rows, cols].tobytes(), crow_indices=crow.astype("<i8").tobytes(),
        col_indices=cols.astype("<i8").tobytes()))


def _loss_config(msg: pb.ForwardBackwardRequest, numbers: dict[str, float],
                 texts: dict[str, str]) -> pb.ForwardBackwardRequest:
    for key, value in numbers.items():
        msg.loss_fn_config[key] = value
        msg.loss_fn_config_v2[key].number = value
    for key, text in texts.items():
        msg.loss_fn_config_v2[key].text = text
    return msg


@st.composite
def proto_cases(draw: st.DrawFn, vocab_size: int) -> ProtoCase:
    """Mostly messages that parse and carry datums (two in three well-formed), so that most
    requests reach the datum checks and the engine; the rest break the transport."""
    datums = st.sampled_from(["wellformed", "wellformed", "adversarial"]).flatmap(
        lambda kind: wellformed_datums(vocab_size) if kind == "wellformed"
        else adversarial_datums(vocab_size))
    msg = pb.ForwardBackwardRequest(
        data=draw(st.lists(datums, min_size=draw(st.sampled_from([1, 1, 1, 0])), max_size=3)),
        loss_fn=draw(st.sampled_from(["cross_entropy", "text", *LOSS_FNS]).flatmap(
            lambda name: st.text(max_size=12) if name == "text" else st.just(name))),
        forward_only=draw(st.booleans()))
    if draw(st.sampled_from([False, False, True])):
        keys = st.one_of(st.sampled_from(["clip_low_threshold", "clip_high_threshold", "beta",
                                          "kl_coeff", "loss_id"]), st.text(max_size=6))
        msg = _loss_config(msg, draw(st.dictionaries(keys, _floats(), max_size=2)),
                           draw(st.dictionaries(keys, st.text(max_size=8), max_size=1)))
    transport = draw(st.sampled_from(["plain"] * 6 + ["wire_seq", "truncate", "garbage"]))
    return ProtoCase(
        message=msg,
        model=draw(st.sampled_from(["own", "own", "own", "own", "trainer", "empty", "random"])),
        random_model=draw(st.text(min_size=1, max_size=20)),
        seq=draw(st.sampled_from(["next", "next", "next", "any"]).flatmap(
            lambda s: st.none() if s == "next" else _ints32())),
        wire_seq=draw(st.sampled_from([2**63 - 1, 2**64 - 1, 2**32 + 1, -1, 0]))
        if transport == "wire_seq" else None,
        encoding=draw(st.sampled_from(["identity"] * 3 + ["none"] * 2 + ["zstd"] * 3
                                      + ["zstd-garbage", "gzip", "ZSTD"])),
        truncate_to=draw(st.integers(0, 40)) if transport == "truncate" else None,
        garbage=draw(st.binary(max_size=64)) if transport == "garbage" else None)
