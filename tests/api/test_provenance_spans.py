"""Provenance spans → recorded logprobs aligned with the targets (hand-computed)."""

from __future__ import annotations

import math
from array import array

import pytest

from loraplex.api.provenance import attach_recorded_logprobs
from loraplex.domain.data import Datum, ProvenanceSpan, TensorData
from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from loraplex.errors import UserError
from loraplex.store.sequences import RecordedSequence

# Prompt [10, 11, 12] sampled [20, 21]: S = 10 11 12 20 21, targets = 11 12 20 21.
SEQ = RecordedSequence("q:0", "alice", "sess", array("q", [10, 11, 12]), array("i", [20, 21]),
                       array("f", [-0.25, -0.75]))


def rl_datum(spans: tuple[ProvenanceSpan, ...], targets: list[int] | None = None) -> Datum:
    targets = targets or [11, 12, 20, 21]
    return Datum(array("q", [10, 11, 12, 20]),
                 {"target_tokens": TensorData.from_list(targets, "int64")},
                 loss_fn_input_spans=spans)


SPANS = (ProvenanceSpan("prompt", "q:0", 1, 2), ProvenanceSpan("sampled", "q:0", 0, 2))


def test_sampled_positions_get_their_logprobs_prompt_positions_nan() -> None:
    [out] = attach_recorded_logprobs((rl_datum(SPANS),), {"q:0": SEQ}, "sess")
    recorded = out.loss_fn_inputs[RECORDED_LOGPROBS_KEY]
    assert recorded.shape == (4,) and recorded.dtype == "float32"
    assert math.isnan(recorded.data[0]) and math.isnan(recorded.data[1])
    assert list(recorded.data[2:]) == [-0.25, -0.75]


@pytest.mark.parametrize(("spans", "records", "session", "targets", "match"), [
    ((), {"q:0": SEQ}, "sess", None, r"data\[0\]\.loss_fn_input_spans.*provenance"),
    (SPANS[:1], {"q:0": SEQ}, "sess", None, "sum to 2, not 4"),
    (SPANS, {}, "sess", None, r"spans\[0\]\.sequence_id.*unknown"),
    (SPANS, {"q:0": SEQ}, "other-session", None, "unknown sequence id"),
    ((SPANS[0], ProvenanceSpan("sampled", "q:0", 1, 2)), {"q:0": SEQ}, "sess", None,
     r"spans\[1\].*outside"),
    (SPANS, {"q:0": SEQ}, "sess", [11, 12, 20, 22], "differ from the sampled tokens"),
])
def test_bad_provenance_is_a_user_error_naming_the_span(spans, records, session, targets,  # type: ignore[no-untyped-def]
                                                        match) -> None:
    with pytest.raises(UserError, match=match):
        attach_recorded_logprobs((rl_datum(spans, targets),), records, session)
