"""Every validation error path names the datum index and the field; defaults are documented."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from loraplex.domain.data import Datum, TensorData
from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from loraplex.engine.losses.registry import LOSSES, get_loss
from loraplex.engine.losses.validation import validate
from loraplex.errors import UserError

VOCAB = 50
NAN = float("nan")
MakeDatum = Callable[..., Datum]
MakeTensor = Callable[..., TensorData]


def rl(make_datum: MakeDatum, n: int = 3, /, **overrides: object) -> Datum:
    inputs: dict[str, object] = {"logprobs": [-1.0] * n, "advantages": [1.0] * n}
    inputs.update(overrides)
    return make_datum(list(range(1, n + 1)), **inputs)


def error(loss_fn: str, data: list[Datum], config: dict | None = None) -> UserError:
    with pytest.raises(UserError) as info:
        validate(loss_fn, config, data, VOCAB)
    return info.value


def test_unknown_loss_lists_known_names(make_datum: MakeDatum) -> None:
    for name in ("nope", "custom", ""):
        err = error(name, [rl(make_datum)])
        assert err.field == "loss_fn"
        assert all(known in err.message for known in LOSSES)
    assert set(LOSSES) == {
        "cross_entropy",
        "importance_sampling",
        "ppo",
        "cispo",
        "dro",
        "gspo",
        "stable_reinforce",
    }


def test_documented_config_defaults() -> None:
    assert get_loss("ppo").config_defaults == {
        "clip_low_threshold": 0.8,
        "clip_high_threshold": 1.2,
    }
    assert get_loss("cispo").config_defaults == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 4.0,
    }
    assert get_loss("dro").config_defaults == {"beta": 0.05}
    assert get_loss("gspo").config_defaults == pytest.approx(
        {"clip_low_threshold": 0.9997, "clip_high_threshold": 1.0004}
    )
    assert get_loss("stable_reinforce").config_defaults == {
        "clip_high_threshold": 2.0,
        "kl_coeff": 0.0,
    }
    assert get_loss("cross_entropy").config_defaults == {}


@pytest.mark.parametrize(
    ("loss_fn", "config", "field"),
    [
        ("ppo", {"beta": 0.1}, "loss_fn_config.beta"),
        ("importance_sampling", {"clip_low_threshold": 0.8}, "loss_fn_config.clip_low_threshold"),
        ("ppo", {"clip_low_threshold": "0.8"}, "loss_fn_config.clip_low_threshold"),
        ("ppo", {"clip_high_threshold": True}, "loss_fn_config.clip_high_threshold"),
        ("ppo", {"clip_high_threshold": math.inf}, "loss_fn_config.clip_high_threshold"),
        ("dro", {"beta": -1.0}, "loss_fn_config.beta"),
        ("ppo", {"clip_low_threshold": 1.5}, "loss_fn_config.clip_high_threshold"),
        ("stable_reinforce", {"clip_high_threshold": 0.0}, "loss_fn_config.clip_high_threshold"),
        ("stable_reinforce", {"kl_coeff": NAN}, "loss_fn_config.kl_coeff"),
    ],
)
def test_bad_config(make_datum: MakeDatum, loss_fn: str, config: dict, field: str) -> None:
    assert error(loss_fn, [rl(make_datum)], config).field == field


def test_config_ints_accepted_and_defaults_filled(make_datum: MakeDatum) -> None:
    validated = validate("ppo", {"clip_high_threshold": 2}, [rl(make_datum)], VOCAB)
    assert validated.inputs.config == {"clip_low_threshold": 0.8, "clip_high_threshold": 2.0}


def test_missing_required_input_names_datum_and_field(make_datum: MakeDatum) -> None:
    bad = make_datum([1, 2, 3], logprobs=[-1.0] * 3)
    err = error("ppo", [rl(make_datum), bad])
    assert err.field == "data[1].loss_fn_inputs.advantages"
    assert "missing" in err.message and "ppo" in err.message
    no_weights = make_datum([1, 2])
    assert error("cross_entropy", [no_weights]).field == "data[0].loss_fn_inputs.weights"
    no_targets = Datum(tokens=rl(make_datum).tokens, loss_fn_inputs={})
    assert error("cross_entropy", [no_targets]).field == "data[0].loss_fn_inputs.target_tokens"


def test_misaligned_length_message(make_datum: MakeDatum) -> None:
    good = [rl(make_datum, 9) for _ in range(3)]
    bad = rl(make_datum, 9, advantages=[1.0] * 7)
    err = error("importance_sampling", [*good, bad])
    assert str(err) == "data[3].loss_fn_inputs.advantages: length 7 != model_input length 9"
    short_targets = rl(make_datum, 3, target_tokens=[1, 2])
    assert error("ppo", [short_targets]).field == "data[0].loss_fn_inputs.target_tokens"


def test_wrong_dtype(make_datum: MakeDatum, make_tensor: MakeTensor) -> None:
    int_adv = rl(make_datum, advantages=make_tensor([1, 1, 1], "int64"))
    err = error("ppo", [int_adv])
    assert err.field == "data[0].loss_fn_inputs.advantages"
    assert "dtype int64, expected float32" in err.message
    float_targets = rl(make_datum, target_tokens=make_tensor([1.0, 2.0, 3.0], "float32"))
    assert error("ppo", [float_targets]).field == "data[0].loss_fn_inputs.target_tokens"


@pytest.mark.parametrize("bad_value", [NAN, math.inf, -math.inf])
def test_non_finite_values(make_datum: MakeDatum, bad_value: float) -> None:
    data = [rl(make_datum), rl(make_datum, logprobs=[-1.0, bad_value, -1.0])]
    err = error("importance_sampling", data)
    assert err.field == "data[1].loss_fn_inputs.logprobs"
    assert "position 1" in err.message
    weights = make_datum([1, 2], weights=[1.0, bad_value])
    assert error("cross_entropy", [weights]).field == "data[0].loss_fn_inputs.weights"


def test_nan_allowed_only_in_recorded_logprobs(make_datum: MakeDatum) -> None:
    ok = rl(make_datum, **{RECORDED_LOGPROBS_KEY: [NAN, -1.0, NAN]})
    validate("stable_reinforce", None, [ok], VOCAB)
    inf = rl(make_datum, **{RECORDED_LOGPROBS_KEY: [math.inf, -1.0, NAN]})
    err = error("stable_reinforce", [inf])
    assert err.field == f"data[0].loss_fn_inputs.{RECORDED_LOGPROBS_KEY}"


@pytest.mark.parametrize("token", [-1, VOCAB, VOCAB + 100])
def test_target_tokens_outside_vocab(make_datum: MakeDatum, token: int) -> None:
    err = error("ppo", [rl(make_datum, target_tokens=[1, token, 2])])
    assert err.field == "data[0].loss_fn_inputs.target_tokens[1]"  # the one rule: domain.tokens
    assert f"token id {token} outside the vocabulary [0, {VOCAB})" in err.message


def test_model_input_tokens_outside_vocab(make_datum: MakeDatum) -> None:
    bad = make_datum([1, VOCAB], target_tokens=[1, 2], weights=[1.0, 1.0])
    assert error("cross_entropy", [bad]).field == "data[0].model_input[1]"


def test_two_dimensional_inputs(make_datum: MakeDatum) -> None:
    rl_2d = rl(make_datum, 2, target_tokens=[[1, 2], [3, 4]])
    err = error("ppo", [rl_2d])
    assert err.field == "data[0].loss_fn_inputs.target_tokens"
    assert "expected [N]" in err.message
    mismatched = make_datum([1, 2], target_tokens=[[1, 2], [3, 4]], weights=[1.0, 1.0])
    assert error("cross_entropy", [mismatched]).field == "data[0].loss_fn_inputs.weights"
    k2 = make_datum([1, 2], target_tokens=[[1, 2], [3, 4]], weights=[[1.0, 0.0], [1.0, 0.0]])
    k3 = make_datum([1], target_tokens=[[1, 2, 3]], weights=[[1.0, 0.0, 0.0]])
    err = error("cross_entropy", [k2, k3])
    assert err.field == "data[1].loss_fn_inputs.target_tokens"
    assert "same K" in err.message
    flat = make_datum([1, 2], weights=[1.0, 1.0])
    assert error("cross_entropy", [k2, flat]).field == "data[1].loss_fn_inputs.target_tokens"


def test_stable_reinforce_needs_behaviour_logprobs(make_datum: MakeDatum) -> None:
    neither = make_datum([1, 2], advantages=[1.0, 1.0])
    err = error("stable_reinforce", [neither])
    assert err.field == "data[0].loss_fn_inputs.logprobs"
    uncovered = make_datum([1, 2], advantages=[0.0, 1.0], **{RECORDED_LOGPROBS_KEY: [-1.0, NAN]})
    err = error("stable_reinforce", [rl(make_datum), uncovered])
    assert err.field == "data[1].loss_fn_input_spans"
    assert "position 1" in err.message


def test_unused_inputs_are_ignored(make_datum: MakeDatum) -> None:
    extra = rl(make_datum, mask=[1.0, 0.0, NAN], weights=[1.0, 1.0, 1.0])
    validated = validate("importance_sampling", None, [extra], VOCAB)
    assert set(validated.inputs.tensors) == {"logprobs", "advantages"}


def test_concatenation_offsets_and_split(make_datum: MakeDatum) -> None:
    data = [rl(make_datum, 2), rl(make_datum, 0), rl(make_datum, 3)]
    validated = validate("ppo", None, data, VOCAB)
    inputs = validated.inputs
    assert inputs.offsets == (0, 2, 2, 5)
    assert inputs.datum_index_T.tolist() == [0, 0, 2, 2, 2]
    parts = inputs.split(torch.arange(5))
    assert [p.tolist() for p in parts] == [[0, 1], [], [2, 3, 4]]
    assert validated.to("cpu").inputs.target_tokens.tolist() == inputs.target_tokens.tolist()


def test_validated_inputs_do_not_alias_request_buffers(make_datum: MakeDatum) -> None:
    d = rl(make_datum)
    validated = validate("ppo", None, [d], VOCAB)
    validated.inputs.tensors["advantages"].fill_(7.0)
    assert list(d.loss_fn_inputs["advantages"].data) == [1.0, 1.0, 1.0]


def test_compute_rejects_logprobs_of_the_wrong_shape(make_datum: MakeDatum) -> None:
    validated = validate("ppo", None, [rl(make_datum)], VOCAB)
    with pytest.raises(ValueError, match="shape"):
        validated.compute(torch.zeros(4))


def test_the_registry_the_api_and_the_domain_list_the_same_losses() -> None:
    from loraplex.api.convert import loss_fn_name
    from loraplex.domain.losses import LOSS_FN_NAMES

    assert tuple(LOSSES) == LOSS_FN_NAMES
    assert [loss_fn_name(name) for name in LOSS_FN_NAMES] == list(LOSS_FN_NAMES)
    with pytest.raises(UserError, match="unknown loss 'custom'"):
        loss_fn_name("custom")
