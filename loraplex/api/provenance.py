"""stable_reinforce provenance: turn a datum's ``loss_fn_input_spans`` into the sampling-time
logprob of every target position, from the sequences the sampler recorded (the store's
`SequenceStore`), before the op is built; the engine gets plain per-token logprobs.

Span semantics (SDK ``Datum.with_provenance``): the spans tile the target positions in order;
a ``sampled`` span ``(sequence_id, offset, length)`` says targets ``[p, p+length)`` are that
sequence's sampled tokens ``[offset, offset+length)``; a ``prompt`` span says they are prompt
tokens of that sequence's request (no sampling logprob: NaN). The result is attached as
``loss_fn_inputs[RECORDED_LOGPROBS_KEY]`` (float32, aligned with the targets, NaN uncovered).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from dataclasses import replace

from loraplex.domain.data import Datum, TensorData
from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from loraplex.errors import user_error
from loraplex.store.sequences import RecordedSequence, SequenceStore

NAN = float("nan")


def referenced_sequence_ids(data: Iterable[Datum]) -> set[str]:
    return {s.sequence_id for d in data for s in d.loss_fn_input_spans}


def with_recorded_logprobs(sequences: SequenceStore, data: tuple[Datum, ...], session_id: str
                           ) -> tuple[Datum, ...]:
    """``data`` with the recorded logprobs its spans refer to attached (see
    `attach_recorded_logprobs`)."""
    recorded = sequences.lookup(referenced_sequence_ids(data))
    return attach_recorded_logprobs(data, recorded, session_id)


def attach_recorded_logprobs(
    data: tuple[Datum, ...], recorded: Mapping[str, RecordedSequence], session_id: str
) -> tuple[Datum, ...]:
    """Every datum with its recorded logprobs attached.

    Args:
        recorded: the recorded sequences the spans refer to (from `SequenceStore.lookup`).
        session_id: the training run's session; sequences of other sessions are refused.

    Raises:
        UserError: a datum without spans, spans that do not tile the targets, an unknown or
            foreign sequence id, a span outside its sequence, or targets that are not the
            sampled tokens the span claims.
    """
    return tuple(_attach(d, i, recorded, session_id) for i, d in enumerate(data))


def _attach(datum: Datum, i: int, recorded: Mapping[str, RecordedSequence],
            session_id: str) -> Datum:
    field = f"data[{i}].loss_fn_input_spans"
    n = datum.length
    if not datum.loss_fn_input_spans:
        raise user_error(field, "stable_reinforce needs provenance spans: sample with "
                         "record_stability_info=True and attach Datum.with_provenance(...)")
    if sum(s.length for s in datum.loss_fn_input_spans) != n:
        raise user_error(field, f"span lengths sum to "
                         f"{sum(s.length for s in datum.loss_fn_input_spans)}, not {n} targets")
    targets = datum.loss_fn_inputs.get("target_tokens")
    logprobs_T = array("f", [NAN]) * n
    pos = 0
    for k, span in enumerate(datum.loss_fn_input_spans):
        where = f"{field}[{k}]"
        rec = recorded.get(span.sequence_id)
        if rec is None or rec.session_id != session_id:
            raise user_error(f"{where}.sequence_id", f"unknown sequence id {span.sequence_id!r}"
                             " (not sampled with record_stability_info in this session, or "
                             "expired)")
        source = rec.tokens if span.kind == "sampled" else rec.prompt
        if span.offset + span.length > len(source):
            raise user_error(where, f"[{span.offset}, {span.offset + span.length}) is outside "
                             f"the {len(source)} {span.kind} tokens of {span.sequence_id!r}")
        if span.kind == "sampled":
            end = span.offset + span.length
            if targets is not None and list(targets.data[pos:pos + span.length]) != list(
                    rec.tokens[span.offset:end]):
                raise user_error(where, "target_tokens differ from the sampled tokens "
                                 f"of {span.sequence_id!r} at these positions")
            logprobs_T[pos:pos + span.length] = rec.logprobs[span.offset:end]
        pos += span.length
    inputs = dict(datum.loss_fn_inputs)
    inputs[RECORDED_LOGPROBS_KEY] = TensorData("float32", (n,), logprobs_T)
    return replace(datum, loss_fn_inputs=inputs)
