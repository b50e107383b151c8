"""The training path through the Engine: packed multi-adapter forward/backward == separate runs,
failure isolation, forward-only, gradient accumulation, every loss, AdamW on the adapter."""

from __future__ import annotations

import math
from array import array
from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.data import Datum, TensorData
from loraplex.domain.lora import LoraConfig
from loraplex.domain.optim import AdamParams, DimuonParams
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.engine.executor import Engine
from loraplex.engine.losses.registry import LOSSES
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.errors import NotFoundError, UserError
from tests.engine.train_works import (
    ce_datum,
    create_random_adapter,
    grads,
    rel_err,
    rl_datum,
    work,
)

REL_TOL = 1e-5
VOCAB = 1024  # the built-in tiny model's
CONFIGS = {
    "a": LoraConfig(rank=8, seed=1),
    "b": LoraConfig(rank=4, alpha=8.0, seed=2, train_unembed=False),
    "c": LoraConfig(rank=16, seed=3, train_mlp=False),
    "d": LoraConfig(rank=2, seed=4, train_attn=False),
}


def make_engine(model_dir: Path, invariant: bool = True) -> Engine:
    engine = Engine(str(model_dir), EngineConfig(batch_invariant=invariant))
    for i, (name, config) in enumerate(CONFIGS.items()):
        create_random_adapter(engine, name, config, seed=10 + i)
    return engine


def mixed_works() -> list[ForwardBackwardWork]:
    gen = torch.Generator().manual_seed(0)
    return [
        work("r0", "a", [ce_datum(gen, 37, VOCAB, signed_weights=True), ce_datum(gen, 5, VOCAB)]),
        work("r1", "b", [rl_datum(gen, 20, VOCAB)], "importance_sampling"),
        work("r2", "c", [rl_datum(gen, 64, VOCAB), rl_datum(gen, 9, VOCAB)], "ppo"),
        work("r3", "d", [ce_datum(gen, 30, VOCAB)], forward_only=True),
        work("r4", "a", [rl_datum(gen, 11, VOCAB)], "cispo"),  # a second work of adapter a
        work("r5", "d", [rl_datum(gen, 17, VOCAB)], "dro", beta=0.5),
    ]


def ok(outcome: object) -> ForwardBackwardResult:
    assert isinstance(outcome, ForwardBackwardResult), outcome
    return outcome


def as_tensor(values: object) -> torch.Tensor:
    return torch.tensor(list(values))  # type: ignore[call-overload]


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
def test_mixed_batch_equals_separate_single_adapter_calls(tiny_model_dir: Path,
                                                          invariant: bool) -> None:
    works = mixed_works()
    mixed_engine, separate_engine = (make_engine(tiny_model_dir, invariant) for _ in range(2))
    mixed = [ok(o) for o in mixed_engine.forward_backward(works)]
    separate = [ok(separate_engine.forward_backward([w])[0]) for w in works]
    for m, s in zip(mixed, separate, strict=True):
        assert set(m.metrics) == set(s.metrics) and "loss:sum" in m.metrics
        assert math.isclose(m.metrics["loss:sum"], s.metrics["loss:sum"], rel_tol=REL_TOL,
                            abs_tol=1e-4)
        for lp_m, lp_s in zip(m.logprobs, s.logprobs, strict=True):
            assert rel_err(as_tensor(lp_m), as_tensor(lp_s)) <= REL_TOL
            if invariant:
                assert lp_m == lp_s  # bitwise: a token's logprob ignores its batch
        for el_m, el_s in zip(m.elementwise_loss, s.elementwise_loss, strict=True):
            assert len(el_m) == len(el_s)
    for name in CONFIGS:
        for g_m, g_s in zip(grads(mixed_engine, name), grads(separate_engine, name), strict=True):
            assert g_m is not None and g_s is not None
            assert g_s.abs().sum() > 0
            assert rel_err(g_m, g_s) <= REL_TOL


def test_logprobs_and_loss_match_a_direct_model_computation(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(1)
    data = [ce_datum(gen, n, VOCAB, signed_weights=True) for n in (13, 40)]
    result = ok(engine.forward_backward([work("r", "a", data)])[0])
    expected_loss = 0.0
    for datum, lp in zip(data, result.logprobs, strict=True):
        # The reference: this datum alone, base forward + LoRA, log_softmax, gather.
        batch = engine.model.pack([SequenceInput(datum.tokens.tolist(), "a")])
        lora = engine.bank.stack(batch, rank_multiple=engine.model.rank_multiple,
                                 dtype=engine.model.dtype)
        with torch.no_grad():
            hidden = engine.model.forward(batch, lora)
            targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].data.tolist())
            ref = batch.gather_from_rows(engine.model.token_logprobs(
                hidden, batch.scatter_to_rows(targets), lora))
        assert torch.equal(as_tensor(lp), ref)
        weights = as_tensor(datum.loss_fn_inputs["weights"].data)
        expected_loss += float(-(ref * weights).sum())
    assert math.isclose(result.metrics["loss:sum"], expected_loss, rel_tol=1e-5)
    total = sum(sum(el) for el in result.elementwise_loss)
    assert math.isclose(total, expected_loss, rel_tol=1e-5)


def test_a_bad_work_fails_alone_and_changes_nothing(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    reference = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(2)
    good = work("good", "a", [ce_datum(gen, 21, VOCAB)])
    out_of_vocab = ce_datum(gen, 8, VOCAB)
    out_of_vocab.tokens[3] = VOCAB
    too_long = ce_datum(gen, engine.model_info().max_context + 1, 4)
    missing_input = rl_datum(gen, 6, VOCAB)
    bad = [
        work("vocab", "b", [out_of_vocab]),
        work("adapter", "nope", [ce_datum(gen, 5, VOCAB)]),
        work("loss", "b", [ce_datum(gen, 5, VOCAB)], "no_such_loss"),
        work("length", "b", [too_long]),
        work("input", "b", [missing_input], "ppo", clip_low_threshold=2.0),  # low > high
    ]
    outcomes = engine.forward_backward([bad[0], good, *bad[1:]])
    assert isinstance(outcomes[0], UserError) and "data[0].model_input" in str(outcomes[0])
    assert isinstance(outcomes[2], NotFoundError)
    assert isinstance(outcomes[3], UserError) and "loss_fn" in str(outcomes[3])
    assert isinstance(outcomes[4], UserError) and "max_context" in str(outcomes[4])
    assert isinstance(outcomes[5], UserError) and "loss_fn_config" in str(outcomes[5])
    assert grads(engine, "b") == [None] * len(grads(engine, "b"))
    alone = ok(reference.forward_backward([good])[0])
    assert ok(outcomes[1]).logprobs == alone.logprobs
    for g, g_ref in zip(grads(engine, "a"), grads(reference, "a"), strict=True):
        assert g is not None and g_ref is not None and torch.equal(g, g_ref)


def test_a_non_finite_loss_fails_its_work_without_touching_gradients(tiny_model_dir: Path
                                                                     ) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(3)
    engine.forward_backward([work("warm", "b", [ce_datum(gen, 9, VOCAB)])])
    before = grads(engine, "b")
    # Sampling logprobs of -200 make exp(logp - q) overflow float32: the ratio is inf.
    overflow = ce_datum(gen, 12, VOCAB, extra={"advantages": [1.0] * 12,
                                               "logprobs": [-200.0] * 12})
    good = work("good", "a", [ce_datum(gen, 10, VOCAB)])
    outcomes = engine.forward_backward([work("inf", "b", [overflow], "importance_sampling"),
                                        good])
    assert isinstance(outcomes[0], UserError) and "importance" in str(outcomes[0])
    ok(outcomes[1])
    for g, g0 in zip(grads(engine, "b"), before, strict=True):
        assert g is not None and g0 is not None and torch.equal(g, g0)


def test_forward_only_works_get_no_gradients(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(4)
    data = [ce_datum(gen, 25, VOCAB)]
    only = engine.forward_backward([work("f", "a", data, forward_only=True)])
    assert grads(engine, "a") == [None] * len(grads(engine, "a"))
    mixed = engine.forward_backward([work("f", "a", data, forward_only=True),
                                     work("t", "c", [ce_datum(gen, 30, VOCAB)])])
    assert grads(engine, "a") == [None] * len(grads(engine, "a"))
    assert all(g is not None for g in grads(engine, "c"))
    assert ok(only[0]).logprobs == ok(mixed[0]).logprobs
    assert ok(only[0]).metrics == ok(mixed[0]).metrics


def test_gradients_accumulate_per_adapter_until_its_optim_step(tiny_model_dir: Path) -> None:
    engine, reference = make_engine(tiny_model_dir), make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(5)
    first, second = [ce_datum(gen, n, VOCAB, signed_weights=True) for n in (19, 33)]
    engine.forward_backward([work("1", "a", [first]), work("x", "c", [ce_datum(gen, 8, VOCAB)])])
    c_grads = grads(engine, "c")
    engine.forward_backward([work("2", "a", [second])])
    reference.forward_backward([work("12", "a", [first, second])])
    for g, g_ref in zip(grads(engine, "a"), grads(reference, "a"), strict=True):
        assert g is not None and g_ref is not None and rel_err(g, g_ref) <= REL_TOL
    assert all(torch.equal(g, g0) for g, g0 in zip(grads(engine, "c"), c_grads, strict=True)
               if g is not None and g0 is not None)
    engine.optim_step([OptimStepWork("o", "a", AdamParams(learning_rate=1e-3))])
    assert grads(engine, "a") == [None] * len(grads(engine, "a"))  # freed by the step
    assert all(g is not None for g in grads(engine, "c"))  # c keeps accumulating


def test_optim_step_equals_torch_adamw_on_the_adapter(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(6)
    adam = AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.1,
                      grad_clip_norm=0.5)
    params = [torch.nn.Parameter(p.detach().clone()) for p in engine.bank.get("a").parameters()]
    optimizer = torch.optim.AdamW(params, lr=adam.learning_rate, betas=(adam.beta1, adam.beta2),
                                  eps=adam.eps, weight_decay=adam.weight_decay, fused=True)
    for step in range(3):
        engine.forward_backward([work(f"f{step}", "a", [ce_datum(gen, 16, VOCAB)])])
        for p, g in zip(params, grads(engine, "a"), strict=True):
            p.grad = g
        norm = torch.nn.utils.clip_grad_norm_(params, adam.grad_clip_norm).item()
        optimizer.step()
        result = engine.optim_step([OptimStepWork(f"o{step}", "a", adam)])[0]
        assert isinstance(result, OptimStepResult)
        assert result.metrics == {"grad_norm:mean": pytest.approx(norm, rel=1e-6),
                                  "learning_rate:mean": adam.learning_rate}
    for ours, ref in zip(engine.bank.get("a").parameters(), params, strict=True):
        assert torch.equal(ours, ref)


def test_optim_step_without_gradients_takes_no_step(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    before = [p.detach().clone() for p in engine.bank.get("a").parameters()]
    result = engine.optim_step([OptimStepWork("o", "a", AdamParams(learning_rate=1.0)),
                                OptimStepWork("p", "missing", AdamParams())])
    assert isinstance(result[0], OptimStepResult)
    assert result[0].metrics["grad_norm:mean"] == 0.0
    assert isinstance(result[1], NotFoundError)
    assert all(torch.equal(p, b) for p, b in zip(engine.bank.get("a").parameters(), before,
                                                  strict=True))
    assert engine.trainer.optimizer_state("a") is None


def test_top_k_cross_entropy_returns_k_logprobs_per_position(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(7)
    n, k = 10, 3
    plain = ce_datum(gen, n, VOCAB)
    targets_N_K = torch.randint(0, VOCAB, (n, k), generator=gen)
    weights_N_K = torch.rand(n, k, generator=gen)
    top_k = Datum(plain.tokens, {
        "target_tokens": TensorData("int64", (n, k), array("q", targets_N_K.flatten().tolist())),
        "weights": TensorData("float32", (n, k), array("f", weights_N_K.flatten().tolist()))})
    outcomes = engine.forward_backward([work("k", "a", [top_k]), work("p", "a", [plain])])
    result = ok(outcomes[0])
    assert result.logprobs_trailing_shape == (k,)
    assert len(result.logprobs[0]) == n * k and len(result.elementwise_loss[0]) == n
    lp_N_K = as_tensor(result.logprobs[0]).view(n, k)
    assert torch.all(lp_N_K <= 0)
    expected = -(lp_N_K * weights_N_K).sum(-1)
    assert torch.allclose(as_tensor(result.elementwise_loss[0]), expected, rtol=1e-5)
    assert ok(outcomes[1]).logprobs_trailing_shape == ()


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_every_loss_trains_through_the_engine(tiny_model_dir: Path, loss_fn: str) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(8)
    data = [rl_datum(gen, 14, VOCAB), rl_datum(gen, 6, VOCAB)]
    result = ok(engine.forward_backward([work("r", "a", data, loss_fn)])[0])
    assert "loss:sum" in result.metrics and math.isfinite(result.metrics["loss:sum"])
    assert [len(lp) for lp in result.logprobs] == [14, 6]
    assert all(g is not None and g.abs().sum() > 0 for g in grads(engine, "a"))
    step = engine.optim_step([OptimStepWork("o", "a", AdamParams(learning_rate=1e-3))])[0]
    assert isinstance(step, OptimStepResult) and step.metrics["grad_norm:mean"] > 0


def test_frozen_snapshots_sample_but_do_not_train(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(9)
    engine.snapshot_adapter("a", "a@1")
    data = [ce_datum(gen, 12, VOCAB)]
    outcomes = engine.forward_backward([work("t", "a@1", data),
                                        work("f", "a@1", data, forward_only=True),
                                        work("live", "a", data)])
    assert isinstance(outcomes[0], UserError) and "snapshot" in str(outcomes[0])
    assert ok(outcomes[1]).logprobs == ok(outcomes[2]).logprobs
    engine.optim_step([OptimStepWork("o", "a", AdamParams(learning_rate=1e-2))])
    after = ok(engine.forward_backward([work("f", "a@1", data, forward_only=True)])[0])
    assert after.logprobs == ok(outcomes[1]).logprobs  # training did not move the snapshot


def test_a_work_without_data_gets_an_empty_result(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(10)
    outcomes = engine.forward_backward([work("empty", "a", []),
                                        work("full", "b", [ce_datum(gen, 7, VOCAB)])])
    empty = ok(outcomes[0])
    assert empty.logprobs == () and empty.metrics["loss:sum"] == 0.0
    assert len(ok(outcomes[1]).logprobs[0]) == 7
    assert ok(engine.forward_backward([work("empty", "a", [])])[0]).logprobs == ()


def test_non_finite_gradients_are_discarded_for_that_adapter_only(tiny_model_dir: Path) -> None:
    engine, reference = make_engine(tiny_model_dir), make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(11)
    earlier = ce_datum(gen, 9, VOCAB)
    for e in (engine, reference):
        e.forward_backward([work("warm", "b", [earlier])])
    before = grads(engine, "b")
    # A finite loss (one weight of 3e37 times a logprob of about -7) whose gradients overflow
    # float32 on their way back through the output head.
    huge = ce_datum(gen, 6, VOCAB)
    huge.loss_fn_inputs["weights"].data[:] = array("f", [0, 0, 3e37, 0, 0, 0])
    good = [ce_datum(gen, 14, VOCAB)]
    outcomes = engine.forward_backward([work("huge", "b", [huge]), work("good", "a", good)])
    assert isinstance(outcomes[0], UserError) and "non-finite gradients" in str(outcomes[0])
    for g, g0 in zip(grads(engine, "b"), before, strict=True):
        assert g is not None and g0 is not None and torch.equal(g, g0)
    expected = ok(reference.forward_backward([work("good", "a", good)])[0])
    assert ok(outcomes[1]).logprobs == expected.logprobs
    for g, g_ref in zip(grads(engine, "a"), grads(reference, "a"), strict=True):
        assert g is not None and g_ref is not None and rel_err(g, g_ref) <= REL_TOL


def test_a_state_refuses_steps_of_the_other_family_once_it_has_stepped(tiny_model_dir: Path
                                                                       ) -> None:
    """A never-stepped state of the other family (zeros saved before a first step) carries
    nothing and is replaced; a stepped one refuses the other family's step, changing nothing."""
    engine = make_engine(tiny_model_dir)
    gen = torch.Generator().manual_seed(7)
    engine.trainer.optimizer_state("a", create=True)  # AdamW zeros, as a load of those makes
    engine.forward_backward([work("f0", "a", [ce_datum(gen, 16, VOCAB)])])
    dimuon = DimuonParams(learning_rate=0.01)
    assert isinstance(engine.optim_step([OptimStepWork("o0", "a", dimuon)])[0], OptimStepResult)
    state = engine.trainer.optimizer_state("a")
    assert state is not None and state.family == "dimuon" and state.num_steps == 1
    engine.forward_backward([work("f1", "a", [ce_datum(gen, 16, VOCAB)])])
    before = [p.detach().clone() for p in engine.bank.get("a").parameters()]
    refused = engine.optim_step([OptimStepWork("o1", "a", AdamParams())])[0]
    assert isinstance(refused, UserError) and refused.field == "optimizer_params.type"
    assert "'dimuon' (1 steps)" in str(refused)
    assert all(torch.equal(p, b) for p, b in zip(engine.bank.get("a").parameters(), before,
                                                  strict=True))
    assert engine.trainer.optimizer_state("a") is state and state.num_steps == 1
