"""Every loss against values and gradients worked out by hand (the arithmetic is in comments)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pytest
import torch

from loraplex.domain.data import Datum
from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from loraplex.engine.losses.loss_spec import LossOutput
from loraplex.engine.losses.validation import validate

VOCAB = 50
NAN = float("nan")
e = math.exp


def run(
    loss_fn: str,
    data: Sequence[Datum],
    logprobs: Sequence[float] | Sequence[Sequence[float]],
    config: Mapping[str, float] | None = None,
) -> tuple[LossOutput, list[float], dict[str, float]]:
    """Validate, compute on the given model logprobs, backprop; (output, d loss/d logp, metrics)."""
    validated = validate(loss_fn, config, data, VOCAB)
    logp = torch.tensor(logprobs, dtype=torch.float32, requires_grad=True)
    out = validated.compute(logp)
    out.loss.backward()
    assert logp.grad is not None
    return out, logp.grad.flatten().tolist(), out.metric_values()


def approx(values: Sequence[float]) -> object:
    return pytest.approx(values, abs=1e-5)


def test_cross_entropy_sums_weighted_nll_with_fractional_and_negative_weights(
    make_datum: Callable[..., Datum],
) -> None:
    # elementwise = −logp·w = [0.5, 0, 1.0, −0.5]; loss = 1.0; gradient = −w.
    data = [
        make_datum([1, 2], weights=[1.0, 0.0]),
        make_datum([3, 4], weights=[0.5, -2.0]),
    ]
    out, grad, metrics = run("cross_entropy", data, [-0.5, -1.0, -2.0, -0.25])
    assert out.elementwise_loss_T.tolist() == approx([0.5, 0.0, 1.0, -0.5])
    assert metrics == {"loss:sum": pytest.approx(1.0)}
    assert grad == approx([-1.0, 0.0, -0.5, 2.0])


def test_cross_entropy_zero_weight_ignores_minus_infinity_logprob(
    make_datum: Callable[..., Datum],
) -> None:
    out, grad, _ = run("cross_entropy", [make_datum([1, 2], weights=[1.0, 0.0])], [-1.0, -math.inf])
    assert out.loss.item() == pytest.approx(1.0)
    assert grad == [-1.0, 0.0]


def test_cross_entropy_top_k_targets_sum_over_k(make_datum: Callable[..., Datum]) -> None:
    # rows: 0.9·0.1 + 0.1·2.0 = 0.29; 0.5·1.0 + 0.5·3.0 = 2.0; loss = 2.29; gradient = −w.
    d = make_datum([1, 2], target_tokens=[[3, 4], [5, 6]], weights=[[0.9, 0.1], [0.5, 0.5]])
    out, grad, metrics = run("cross_entropy", [d], [[-0.1, -2.0], [-1.0, -3.0]])
    assert out.elementwise_loss_T.tolist() == approx([0.29, 2.0])
    assert metrics["loss:sum"] == pytest.approx(2.29)
    assert grad == approx([-0.9, -0.1, -0.5, -0.5])


def test_importance_sampling(make_datum: Callable[..., Datum]) -> None:
    # r = [e^0, e^0.5, (masked)]; elementwise = −r·A = [−2, e^0.5, 0]; d/dlogp = −r·A.
    # The last position has A = 0 and log q = −200: unmasked, exp(200) would be inf and inf·0 NaN.
    d = make_datum([1, 2, 3], logprobs=[-1.0, -1.0, -200.0], advantages=[2.0, -1.0, 0.0])
    out, grad, metrics = run("importance_sampling", [d], [-1.0, -0.5, 0.0])
    assert out.elementwise_loss_T.tolist() == approx([-2.0, e(0.5), 0.0])
    assert metrics["loss:sum"] == pytest.approx(-2.0 + e(0.5))
    assert metrics["importance_ratio:mean"] == pytest.approx((1 + e(0.5)) / 2)
    assert grad == approx([-2.0, e(0.5), 0.0])


PPO_LOGQ = [-1.0] * 6
# log r = [0.1, 0.5, 0.5, −0.5, −0.5, 0.3]
PPO_LOGP = [-0.9, -0.5, -0.5, -1.5, -1.5, -0.7]
PPO_ADV = [1.0, 1.0, -1.0, -1.0, 2.0, 0.0]


def test_ppo_default_bounds(make_datum: Callable[..., Datum]) -> None:
    # bounds 0.8 / 1.2:
    # t0 A=+1 r=e^.1 inside        → obj r          → loss −e^.1,   grad −r·A = −e^.1
    # t1 A=+1 r=e^.5 > 1.2         → obj min(r,1.2)=1.2 → loss −1.2, grad 0 (clipped)
    # t2 A=−1 r=e^.5               → obj min(−r,−1.2)=−r → loss +e^.5, grad +e^.5
    # t3 A=−1 r=e^−.5 < 0.8        → obj min(−r,−0.8)=−0.8 → loss 0.8, grad 0 (clipped)
    # t4 A=+2 r=e^−.5              → obj min(2r,1.6)=2r → loss −2e^−.5, grad −2e^−.5
    # t5 A=0                       → 0
    d = make_datum([1, 2, 3, 4, 5, 6], logprobs=PPO_LOGQ, advantages=PPO_ADV)
    out, grad, metrics = run("ppo", [d], PPO_LOGP)
    expected = [-e(0.1), -1.2, e(0.5), 0.8, -2 * e(-0.5), 0.0]
    assert out.elementwise_loss_T.tolist() == approx(expected)
    assert metrics["loss:sum"] == pytest.approx(sum(expected), abs=1e-5)
    assert grad == approx([-e(0.1), 0.0, e(0.5), 0.0, -2 * e(-0.5), 0.0])
    # t1..t4 have ratios outside [0.8, 1.2]: 4 of 5 active positions.
    assert metrics["clip_fraction:mean"] == pytest.approx(0.8)
    ratios = [e(0.1), e(0.5), e(0.5), e(-0.5), e(-0.5)]
    assert metrics["importance_ratio:mean"] == pytest.approx(sum(ratios) / 5)


def test_ppo_bounds_from_config(make_datum: Callable[..., Datum]) -> None:
    # bounds 0.5 / 2.0: every ratio is inside, so the loss is −r·A everywhere (IS).
    d = make_datum([1, 2, 3, 4, 5, 6], logprobs=PPO_LOGQ, advantages=PPO_ADV)
    config = {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}
    out, grad, metrics = run("ppo", [d], PPO_LOGP, config)
    expected = [-e(0.1), -e(0.5), e(0.5), e(-0.5), -2 * e(-0.5), 0.0]
    assert out.elementwise_loss_T.tolist() == approx(expected)
    assert grad == approx(expected)
    assert metrics["clip_fraction:mean"] == 0.0


def test_cispo_default_one_sided_clip(make_datum: Callable[..., Datum]) -> None:
    # bounds 0 / 4; loss_t = −sg(clip r)·logp·A, grad = −clip(r)·A
    # t0 r=e^.5, A=1:   loss −e^.5·(−0.5) = 0.5e^.5,  grad −e^.5
    # t1 r=e^−1, A=−2:  loss −e^−1·(−2)·(−2) = −4e^−1, grad 2e^−1
    # t2 r=e^1.5>4 → 4, A=.5: loss −4·(−1.5)·.5 = 3, grad −2
    # t3 A=0 → 0
    d = make_datum(
        [1, 2, 3, 4], logprobs=[-1.0, -1.0, -3.0, -1.0], advantages=[1.0, -2.0, 0.5, 0.0]
    )
    out, grad, metrics = run("cispo", [d], [-0.5, -2.0, -1.5, -0.3])
    expected = [0.5 * e(0.5), -4 * e(-1), 3.0, 0.0]
    assert out.elementwise_loss_T.tolist() == approx(expected)
    assert grad == approx([-e(0.5), 2 * e(-1), -2.0, 0.0])
    assert metrics["clip_fraction:mean"] == pytest.approx(1 / 3)


def test_dro_with_beta(make_datum: Callable[..., Datum]) -> None:
    # β = 0.1; loss_t = −(logp·A − ½β(logp − logq)²); grad = −(A − β(logp − logq))
    # t0: −(−0.5 − 0.05·0.25) = 0.5125; grad −(1 − 0.05) = −0.95
    # t1: −(1.0 − 0.05·1) = −0.95;      grad −(−0.5 + 0.1) = 0.4
    # t2: A=0 → 0 (unmasked, the quadratic term alone would add 0.05 here)
    d = make_datum([1, 2, 3], logprobs=[-1.0, -1.0, 0.0], advantages=[1.0, -0.5, 0.0])
    out, grad, metrics = run("dro", [d], [-0.5, -2.0, -1.0], {"beta": 0.1})
    assert out.elementwise_loss_T.tolist() == approx([0.5125, -0.95, 0.0])
    assert metrics["loss:sum"] == pytest.approx(-0.4375)
    assert grad == approx([-0.95, 0.4, 0.0])


def test_gspo_sequence_ratio_with_token_gradients(make_datum: Callable[..., Datum]) -> None:
    # bounds 0.5 / 1.5.
    # datum 0: log r = [0.4, −0.3, 0.1], all masked → s0 = e^(0.2/3); A = [0, 1, −1]
    #   t0 A=0 → 0 and grad 0 (though it is in the ratio mask: s carries no gradient)
    #   t1: loss −s0, grad −s0;  t2: loss +s0, grad +s0   (s0 inside the bounds)
    # datum 1: log r = [0.7, 0.5] → s1 = e^0.6 ≈ 1.822 > 1.5; A = [2, −1]
    #   t0: min(2·s1, 2·1.5) = 3 → loss −3, grad 0;  t1: min(−s1, −1.5) = −s1 → loss s1, grad s1
    data = [
        make_datum(
            [1, 2, 3],
            logprobs=[-1.0, -1.0, -1.0],
            advantages=[0.0, 1.0, -1.0],
            sequence_ratio_mask=[1.0, 1.0, 1.0],
        ),
        make_datum(
            [4, 5], logprobs=[-2.0, -2.0], advantages=[2.0, -1.0], sequence_ratio_mask=[1.0, 1.0]
        ),
    ]
    config = {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}
    out, grad, metrics = run("gspo", data, [-0.6, -1.3, -0.9, -1.3, -1.5], config)
    s0, s1 = e(0.2 / 3), e(0.6)
    assert out.elementwise_loss_T.tolist() == approx([0.0, -s0, s0, -3.0, s1])
    assert grad == approx([0.0, -s0, s0, 0.0, s1])
    assert metrics["clip_fraction:mean"] == pytest.approx(0.5)
    assert metrics["importance_ratio:mean"] == pytest.approx((2 * s0 + 2 * s1) / 4)


def test_gspo_ratio_mask_excludes_positions_and_empty_mask_means_ratio_one(
    make_datum: Callable[..., Datum],
) -> None:
    # datum 0: only t1 is in the mask → s = e^(−0.3); datum 1: empty mask → s = 1.
    data = [
        make_datum(
            [1, 2], logprobs=[-1.0, -1.0], advantages=[1.0, 1.0], sequence_ratio_mask=[0.0, 1.0]
        ),
        make_datum([3], logprobs=[-5.0], advantages=[1.0], sequence_ratio_mask=[0.0]),
    ]
    config = {"clip_low_threshold": 0.1, "clip_high_threshold": 10.0}
    out, grad, _ = run("gspo", data, [-0.2, -1.3, -1.0], config)
    assert out.elementwise_loss_T.tolist() == approx([-e(-0.3), -e(-0.3), -1.0])
    assert grad == approx([-e(-0.3), -e(-0.3), -1.0])


SR_LOGP = [-0.5, -1.0, -0.2, -3.0]
SR_RECORDED = [-1.0, NAN, -2.0, NAN]
SR_SENT = [-0.9, -1.2, -1.0, 0.0]
SR_ADV = [1.0, -1.0, 0.5, 0.0]


def test_stable_reinforce_truncated_weights_on_recorded_logprobs(
    make_datum: Callable[..., Datum],
) -> None:
    # c = 2; log q = recorded where present else the sent logprobs: [−1.0, −1.2, −2.0, ·]
    # r = [e^.5, e^.2, e^1.8 → truncated to 2]; loss_t = −w·A·logp; grad = −w·A
    # t0: −e^.5·1·(−0.5) = 0.5e^.5;  t1: −e^.2·(−1)·(−1) = −e^.2;  t2: −2·0.5·(−0.2) = 0.2
    d = make_datum(
        [1, 2, 3, 4],
        logprobs=SR_SENT,
        advantages=SR_ADV,
        **{RECORDED_LOGPROBS_KEY: SR_RECORDED},
    )
    out, grad, metrics = run("stable_reinforce", [d], SR_LOGP)
    assert out.elementwise_loss_T.tolist() == approx([0.5 * e(0.5), -e(0.2), 0.2, 0.0])
    assert grad == approx([-e(0.5), e(0.2), -1.0, 0.0])
    assert metrics["recorded_fraction:mean"] == pytest.approx(2 / 3)
    assert metrics["clip_fraction:mean"] == pytest.approx(1 / 3)
    assert metrics["importance_ratio:mean"] == pytest.approx((e(0.5) + e(0.2) + e(1.8)) / 3)


def test_stable_reinforce_kl_coeff_adds_quadratic_pull_to_behaviour(
    make_datum: Callable[..., Datum],
) -> None:
    # kl = 0.5 adds ½·0.5·(logp − logq)² = 0.25·[0.25, 0.04, 3.24] and grads 0.5·[0.5, 0.2, 1.8]
    d = make_datum(
        [1, 2, 3, 4],
        logprobs=SR_SENT,
        advantages=SR_ADV,
        **{RECORDED_LOGPROBS_KEY: SR_RECORDED},
    )
    out, grad, _ = run("stable_reinforce", [d], SR_LOGP, {"kl_coeff": 0.5})
    expected = [0.5 * e(0.5) + 0.0625, -e(0.2) + 0.01, 0.2 + 0.81, 0.0]
    assert out.elementwise_loss_T.tolist() == approx(expected)
    assert grad == approx([-e(0.5) + 0.25, e(0.2) + 0.1, -1.0 + 0.9, 0.0])


def test_stable_reinforce_without_recorded_logprobs_uses_sent_ones(
    make_datum: Callable[..., Datum],
) -> None:
    # log q = [−0.9, −1.2, −1.0]; r = [e^.4, e^.2, e^.8 ≈ 2.23 → 2]
    d = make_datum([1, 2, 3, 4], logprobs=SR_SENT, advantages=SR_ADV)
    out, grad, metrics = run("stable_reinforce", [d], SR_LOGP)
    assert out.elementwise_loss_T.tolist() == approx([0.5 * e(0.4), -e(0.2), 0.2, 0.0])
    assert grad == approx([-e(0.4), e(0.2), -1.0, 0.0])
    assert metrics["recorded_fraction:mean"] == 0.0


def test_stable_reinforce_recorded_only(make_datum: Callable[..., Datum]) -> None:
    # NaN recorded at a zero-advantage position is fine without a logprobs input.
    d = make_datum([1, 2], advantages=[1.0, 0.0], **{RECORDED_LOGPROBS_KEY: [-1.0, NAN]})
    out, grad, _ = run("stable_reinforce", [d], [-0.5, -4.0])
    assert out.elementwise_loss_T.tolist() == approx([0.5 * e(0.5), 0.0])
    assert grad == approx([-e(0.5), 0.0])
