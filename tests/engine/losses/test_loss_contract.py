"""Properties every registered loss must have: metric key format, ``loss:sum`` equal to the
summed elementwise loss, a request equal to the sum of its datums run alone, and exactly zero
loss and gradient where the advantage (or weight) is zero, whatever the other inputs are."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from loraplex.domain.data import Datum
from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from loraplex.engine.losses.loss_spec import REDUCTIONS
from loraplex.engine.losses.registry import LOSSES
from loraplex.engine.losses.validation import validate

VOCAB = 50
# Loose bounds for gspo so the test exercises both clipped and unclipped tokens.
CONFIG = {"gspo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}}


def random_datum(
    make_datum: Callable[..., Datum], generator: torch.Generator, n: int, zero_every: int = 3
) -> Datum:
    def floats(scale: float, offset: float = 0.0) -> list[float]:
        return (torch.randn(n, generator=generator) * scale + offset).tolist()

    advantages = floats(1.0)
    advantages[::zero_every] = [0.0] * len(advantages[::zero_every])
    recorded = floats(0.5, -1.0)
    recorded[1::4] = [float("nan")] * len(recorded[1::4])
    tokens = torch.randint(0, VOCAB, (n,), generator=generator).tolist()
    return make_datum(
        tokens,
        weights=advantages,
        logprobs=floats(0.5, -1.0),
        advantages=advantages,
        sequence_ratio_mask=[float(a != 0) for a in advantages],
        **{RECORDED_LOGPROBS_KEY: recorded},
    )


@pytest.fixture
def data(make_datum: Callable[..., Datum]) -> list[Datum]:
    generator = torch.Generator().manual_seed(0)
    return [random_datum(make_datum, generator, n) for n in (5, 1, 8, 3)]


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_metric_keys_and_loss_sum(loss_fn: str, data: list[Datum]) -> None:
    validated = validate(loss_fn, CONFIG.get(loss_fn), data, VOCAB)
    logp = torch.randn(validated.target_tokens.shape, generator=torch.Generator().manual_seed(1))
    out = validated.compute(logp - 1.0)
    metrics = out.metric_values()
    assert "loss:sum" in metrics
    for key in metrics:
        name, reduction = key.split(":")  # exactly one colon
        assert name and reduction in REDUCTIONS, key
    assert metrics["loss:sum"] == pytest.approx(out.loss.item())
    assert out.elementwise_loss_T.sum().item() == pytest.approx(out.loss.item(), abs=1e-5)
    assert out.elementwise_loss_T.dtype == torch.float32
    assert not out.elementwise_loss_T.requires_grad
    assert out.elementwise_loss_T.shape == (validated.inputs.num_tokens,)


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_request_equals_sum_of_single_datum_requests(loss_fn: str, data: list[Datum]) -> None:
    """The vectorised loss over a concatenated request matches running each datum alone."""
    config = CONFIG.get(loss_fn)
    whole = validate(loss_fn, config, data, VOCAB)
    logp_T = torch.randn(whole.target_tokens.shape, generator=torch.Generator().manual_seed(2))
    logp_T = (logp_T * 0.3 - 1.0).requires_grad_()
    out = whole.compute(logp_T)
    out.loss.backward()
    assert logp_T.grad is not None
    losses, grads, elementwise = [], [], []
    for datum, logp_part in zip(data, whole.inputs.split(logp_T.detach()), strict=True):
        part = logp_part.clone().requires_grad_()
        single = validate(loss_fn, config, [datum], VOCAB).compute(part)
        single.loss.backward()
        assert part.grad is not None
        losses.append(single.loss.item())
        grads.append(part.grad)
        elementwise.append(single.elementwise_loss_T)
    assert out.loss.item() == pytest.approx(sum(losses), abs=1e-5)
    torch.testing.assert_close(logp_T.grad, torch.cat(grads))
    torch.testing.assert_close(out.elementwise_loss_T, torch.cat(elementwise))


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_zero_advantage_positions_have_zero_loss_and_gradient(
    loss_fn: str, make_datum: Callable[..., Datum]
) -> None:
    # Extreme but finite inputs at the zero-advantage positions: exp(logp − logq) would be inf.
    zero = make_datum(
        [1, 2, 3],
        weights=[0.0, 1.0, 0.0],
        logprobs=[-300.0, -1.0, -300.0],
        advantages=[0.0, 1.0, 0.0],
        sequence_ratio_mask=[0.0, 1.0, 0.0],
        **{RECORDED_LOGPROBS_KEY: [-300.0, -1.0, float("nan")]},
    )
    logp = torch.tensor([0.0, -0.95, -1e-3], requires_grad=True)
    out = validate(loss_fn, CONFIG.get(loss_fn), [zero], VOCAB).compute(logp)
    out.loss.backward()
    assert logp.grad is not None
    assert torch.isfinite(out.loss)
    assert out.elementwise_loss_T[[0, 2]].tolist() == [0.0, 0.0]
    assert logp.grad[[0, 2]].tolist() == [0.0, 0.0]
    assert logp.grad[1].item() != 0.0
def test_forward_only_compute_under_no_grad(data: list[Datum]) -> None:
    validated = validate("ppo", None, data, VOCAB)
    with torch.no_grad():
        out = validated.compute(torch.full(validated.target_tokens.shape, -1.0))
    assert not out.loss.requires_grad
    assert out.metric_values()["loss:sum"] == pytest.approx(out.elementwise_loss_T.sum().item())
