"""`Trainer`: the engine's training path: packed multi-adapter forward/backward with per-request
losses, gradient accumulation per adapter, and per-adapter AdamW.

``forward_backward(works)``: every work is validated alone (a bad one fails alone, nothing
changes for it) → the datums of all valid works, whatever their adapters, become one
`PackedBatch` (adapter segments; one forward, no Python loop over tenants) → one fp32
log-softmax over the rows, window by window (`head_chunks`) → per work: gather its target
logprobs, compute its loss → one
backward over the sum of the finite training losses, into the trained adapters' leaves only.
Knows nothing of scheduling, HTTP, files or tenants: adapter ids and domain objects only.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import assert_never

import torch

from loraplex.domain.custom_loss import CUSTOM_LOSS_FN
from loraplex.domain.optim import AdamParams, DimuonParams, OptimizerFamily
from loraplex.domain.results import (
    ForwardBackwardResult,
    FwdBwdOutcome,
    OptimOutcome,
    OptimStepResult,
)
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.engine.host_allocator import mapped_large_blocks
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.losses.custom_graph import validate_custom
from loraplex.engine.losses.loss_spec import LossOutput
from loraplex.engine.losses.registry import get_loss
from loraplex.engine.losses.validation import ValidatedLoss, resolve_config, validate
from loraplex.engine.model import head_chunks
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.stage_pipe import StagePipe
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.optim.adamw import adamw_step
from loraplex.engine.optim.dimuon import dimuon_step
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.errors import LoraplexError, user_error

#: A batch of at least this many tokens that recomputes layers runs with blocks of
#: `MAPPED_BLOCK_BYTES` or more mapped (`host_allocator.mapped_large_blocks`): on the retained
#: heap, its recomputed layers' and head windows' blocks left holes that smaller allocations
#: then split, so the heap grew well past the live bytes (SmolLM2 at 2 threads, every layer
#: recomputed: 2,048 tokens peaked at 3.48 GB retained, 2.48 GB mapped, 66 s a step either
#: way; 4,096 tokens: 3.76 GB with 32 MiB blocks mapped, 2.80 GB with 4 MiB, 209 s against
#: 231 s). Every other batch keeps the retained heap, whose reuse saves its page faults: a
#: SmolLM2 step of 2,048 tokens keeping its activations (``recompute = auto``) faulted 4.2 M
#: pages mapped (12-15 s of system time on an AVX2 EPYC VM, 71-84 s a step under load)
#: against none retained (37-40 s; peak 6.8 GB against 4.8 GB).
MAPPED_BATCH_TOKENS = 2048
MAPPED_BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class _Prepared:
    """A validated work and where its tokens sit in the packed input order."""

    index: int
    work: ForwardBackwardWork
    loss: ValidatedLoss
    token_start: int

    @property
    def is_training(self) -> bool:
        return not self.work.forward_only


def is_trainable(adapter: LoraAdapter) -> bool:
    """Training adapters have leaves that require grad; frozen sampler copies do not."""
    return adapter.is_trainable


def _compute(k: int, p: _Prepared, logprobs: torch.Tensor, failed: dict[int, LoraplexError]
             ) -> LossOutput:
    """Work ``k``'s loss; a user error it raises (a custom loss's bad node) fails only it and
    leaves a zero loss in its place."""
    try:
        return p.loss.compute(logprobs)
    except LoraplexError as err:
        failed[k] = err
        zero = logprobs.detach().sum() * 0
        return LossOutput(zero, torch.zeros_like(logprobs.detach()), {"loss:sum": zero})


@dataclass(eq=False)
class Trainer:
    """Forward/backward and AdamW for the adapters of one `AdapterBank` on one `Transformer`.

    Owns each adapter's optimizer state (created before its first step); gradients live in the
    adapters' own ``.grad`` until their optim_step frees them.
    """

    model: Transformer
    bank: AdapterBank
    max_context: int
    pipe: StagePipe | None = None
    _optimizers: dict[str, OptimizerState] = field(default_factory=dict, init=False)

    # ---- forward / backward ----------------------------------------------------------------

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        """One packed forward (and backward, unless every work is forward-only) for ``works``.

        Returns one outcome per work, in order: its result, or the `LoraplexError` that failed
        it alone (validation, or a non-finite loss / gradient; its adapter is then unchanged).
        """
        outcomes: list[FwdBwdOutcome | None] = [None] * len(works)
        prepared, start = [], 0
        for i, work in enumerate(works):
            try:
                loss = self._validate(work)
            except LoraplexError as err:
                outcomes[i] = err
                continue
            if loss is None:
                outcomes[i] = ForwardBackwardResult((), (), {"loss:sum": 0.0})
                continue
            prepared.append(_Prepared(i, work, loss, start))
            start += work.num_tokens
        if prepared:
            for p, outcome in zip(prepared, self._run(prepared), strict=True):
                outcomes[p.index] = outcome
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _validate(self, work: ForwardBackwardWork) -> ValidatedLoss | None:
        """The work's checked loss; None for a valid work without datums (nothing to run)."""
        adapter = self.bank.get(work.adapter_id)
        if not work.forward_only and not is_trainable(adapter):
            raise user_error("model_id", f"adapter {work.adapter_id!r} is a frozen sampler "
                             "snapshot; it cannot be trained")
        for i, datum in enumerate(work.data):
            if datum.length == 0:
                raise user_error(f"data[{i}].model_input", "must not be empty")
            if datum.length > self.max_context:
                raise user_error(f"data[{i}].model_input", f"length {datum.length} exceeds the "
                                 f"model's max_context {self.max_context}")
            self.model.image_spans(datum.images)  # decoded and encoded once, here
        vocab_size = self.model.spec.vocab_size
        if work.custom_loss is not None:
            return validate_custom(work.custom_loss, work.data, vocab_size).to(
                self.model.device) if work.data else None
        if work.loss_fn == CUSTOM_LOSS_FN:
            raise user_error("loss_fn_config.loss_id", "a custom work without its loss")
        if not work.data:
            resolve_config(get_loss(work.loss_fn), work.loss_fn_config)
            return None
        loss = validate(work.loss_fn, work.loss_fn_config, work.data, vocab_size)
        return loss.to(self.model.device)

    def _run(self, prepared: Sequence[_Prepared]) -> list[FwdBwdOutcome]:
        """The algorithm: pack → forward → per-work losses → backward → results (on a
        pipeline stage before the last: pack → its layers → the backward of what the last
        stage trained; its results are placeholders, the last stage's count)."""
        seqs = [SequenceInput(d.tokens.tolist(), p.work.adapter_id,
                              images=self.model.image_spans(d.images))
                for p in prepared for d in p.work.data]
        any_training = any(p.is_training for p in prepared)
        num_tokens = sum(len(s.tokens) for s in seqs)
        long_batch = (num_tokens >= MAPPED_BATCH_TOKENS and any_training
                      and self.model.recomputed_layers(num_tokens) > 0)
        with torch.set_grad_enabled(any_training), (
                mapped_large_blocks(MAPPED_BLOCK_BYTES) if long_batch else nullcontext()):
            batch = self.model.pack(seqs)
            lora = self.bank.stack(batch, rank_multiple=self.model.rank_multiple,
                                   dtype=self.model.dtype)
            if self.pipe is None:
                x_in, hidden_R_D = None, self.model.forward(batch, lora)
            else:
                x_in, hidden_R_D = self.pipe.run_layers(self.model, batch, lora,
                                                        train=any_training)
                if not self.pipe.is_last:
                    self._inner_stage_backward(x_in, hidden_R_D, any_training)
                    return [ForwardBackwardResult((), (), {}) for _ in prepared]
            logprobs = target_logprobs(self.model, prepared, hidden_R_D, lora,
                                       batch.row_index())
            failed: dict[int, LoraplexError] = {}
            losses = [_compute(k, p, lp, failed)
                      for k, (p, lp) in enumerate(zip(prepared, logprobs, strict=True))]
            computed = [k for k in range(len(prepared)) if k not in failed]
            is_finite = torch.stack([losses[k].loss.detach().isfinite()
                                     for k in computed]).tolist() if computed else []
            for k, finite in zip(computed, is_finite, strict=True):
                if not finite:
                    failed[k] = user_error("loss_fn", f"the {prepared[k].work.loss_fn} loss is "
                                           f"{losses[k].loss.item()} (e.g. overflowing "
                                           "importance ratios); no gradients were applied")
            trained = [k for k, p in enumerate(prepared) if p.is_training and k not in failed]
            adapter_ids = sorted({prepared[k].work.adapter_id for k in trained})
            if self.pipe is not None and any_training:
                self.pipe.from_last(adapter_ids)
            if trained:
                bad = self._backward([torch.stack([losses[k].loss for k in trained]).sum()],
                                     None, adapter_ids, x_in)
                for k in trained:
                    if prepared[k].work.adapter_id in bad:
                        failed[k] = user_error("loss_fn", "non-finite gradients; this "
                                               "batch's gradients were discarded, the "
                                               "adapter is unchanged")
        return [failed.get(k) or self._result(p, logprobs[k], losses[k])
                for k, p in enumerate(prepared)]

    def _inner_stage_backward(self, x_in: torch.Tensor | None, hidden_R_D: torch.Tensor,
                              any_training: bool) -> None:
        """A stage before the last: backpropagate the gradient of its output into the
        adapters the last stage trained (it says which), and send its input's on."""
        assert self.pipe is not None
        adapter_ids = self.pipe.from_last() if any_training else []
        if adapter_ids:
            self._backward([hidden_R_D], [self.pipe.receive_grad(hidden_R_D)], adapter_ids,
                           x_in)

    def _backward(self, roots: Sequence[torch.Tensor], root_grads: Sequence[torch.Tensor] | None,
                  adapter_ids: Sequence[str], x_in: torch.Tensor | None) -> set[str]:
        """Backpropagate from ``roots`` into the given adapters only; return those whose new
        gradients are not finite (on any pipeline stage: every stage then restores their
        earlier gradients and drops the new ones).

        New gradients are computed into empty ``.grad`` slots and then added to the earlier
        ones: ``old + new`` is what autograd's own accumulation computes, bit for bit.
        """
        params = {a: self.bank.get(a).parameters() for a in adapter_ids}
        earlier = {a: [p.grad for p in ps] for a, ps in params.items()}
        for ps in params.values():
            for p in ps:
                p.grad = None
        inputs = [p for ps in params.values() for p in ps]
        if x_in is not None and x_in.requires_grad:
            inputs.append(x_in)
        try:
            if inputs:
                torch.autograd.backward(list(roots), root_grads, inputs=inputs)
        except BaseException:  # a bug: leave every adapter as it was before this batch
            for a, ps in params.items():
                for p, old in zip(ps, earlier[a], strict=True):
                    p.grad = old
            raise
        new = {a: [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
               for a, ps in params.items()}
        bad = {a for a, gs in new.items() if gs and not torch.stack(
            torch._foreach_norm(gs)).isfinite().all()}
        if self.pipe is not None:
            self.pipe.send_grad(x_in)
            bad = set().union(*self.pipe.gather(sorted(bad)))
        for a, ps in params.items():
            if a in bad:
                for p, old in zip(ps, earlier[a], strict=True):
                    p.grad = old
                continue
            for p, g, old in zip(ps, new[a], earlier[a], strict=True):
                p.grad = g if old is None else g.add_(old)
        return bad

    @staticmethod
    def _result(p: _Prepared, logprobs: torch.Tensor, out: LossOutput) -> ForwardBackwardResult:
        split = p.loss.inputs.split
        return ForwardBackwardResult(
            logprobs=tuple(float32_array(x) for x in split(logprobs.detach())),
            elementwise_loss=tuple(float32_array(x) for x in split(out.elementwise_loss_T)),
            metrics=out.metric_values(),
            logprobs_trailing_shape=tuple(logprobs.shape[1:]),
        )

    # ---- optimizer -------------------------------------------------------------------------

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        """One optimizer step per work's adapter, in order; each frees that adapter's gradients."""
        outcomes: list[OptimOutcome] = []
        for work in works:
            try:
                outcomes.append(self._step(work))
            except LoraplexError as err:
                outcomes.append(err)
        return outcomes

    def _step(self, work: OptimStepWork) -> OptimStepResult:
        """AdamW or Dimuon (the family ``work.params`` names) on the adapter's accumulated
        gradients.

        An adapter with no accumulated gradients (no forward_backward since its last step)
        takes no step: weights, moments and step count stay as they are, as
        ``torch.optim.AdamW`` skips parameters whose ``.grad`` is None. A zero gradient (e.g.
        all-zero loss weights) is a real step: moments decay and the step counts.
        """
        adapter = self.bank.get(work.adapter_id)
        if not is_trainable(adapter):
            raise user_error("model_id", f"adapter {work.adapter_id!r} is a frozen sampler "
                             "snapshot; it has no optimizer")
        hyper = work.params.validate()
        named = adapter.named_parameters()
        grads = [p.grad for _, p in named]
        params = [p for _, p in named]
        # Every leaf of a trained adapter is in the graph, so its grads exist together; a
        # missing one would count as zero.
        full = [g if g is not None else torch.zeros_like(p) for p, g in zip(params, grads,
                                                                           strict=True)]
        has_grads = any(g is not None for g in grads)
        total_norm = None
        if self.pipe is not None:  # the step and the norm are the whole adapter's
            has_grads, total_norm = self._group_norm(full, has_grads)
        if not has_grads:
            return OptimStepResult({"grad_norm:mean": 0.0, "learning_rate:mean":
                                    hyper.learning_rate})
        state = self._state_for(work.adapter_id, hyper.family)
        try:
            match hyper:
                case AdamParams():
                    metrics = adamw_step(params, full, state, hyper, total_norm=total_norm)
                case DimuonParams():
                    metrics = dimuon_step(params, full, state, hyper, adapter.rank,
                                          total_norm=total_norm)
                case _:
                    assert_never(hyper)
        finally:
            adapter.free_grads()  # also after a non-finite norm: those gradients are unusable
        return OptimStepResult(metrics)

    def _group_norm(self, grads: list[torch.Tensor], has_grads: bool
                    ) -> tuple[bool, torch.Tensor]:
        """Whether any stage holds gradients of the adapter, and its global L2 norm: the norm
        of every stage's per-tensor norms (a stage holds its layers' rows of each tensor, so
        this equals one device's norm up to rounding, not bit for bit)."""
        assert self.pipe is not None
        local = [float(n) for n in torch._foreach_norm(grads)] if has_grads and grads else []
        shares = self.pipe.gather((has_grads, local))
        norms = torch.tensor([n for _, ns in shares for n in ns], dtype=torch.float32)
        return any(h for h, _ in shares), torch.linalg.vector_norm(norms)

    def optimizer_state(self, adapter_id: str, create: bool = False,
                        family: OptimizerFamily = "adamw") -> OptimizerState | None:
        """The adapter's optimizer state (zeros of ``family``, created now when ``create``),
        or None."""
        state = self._optimizers.get(adapter_id)
        if state is None and create:
            named = self.bank.get(adapter_id).named_parameters()
            state = OptimizerState.zeros([n for n, _ in named], [p for _, p in named], family)
            self._optimizers[adapter_id] = state
        return state

    def _state_for(self, adapter_id: str, family: OptimizerFamily) -> OptimizerState:
        """The state a step of ``family`` updates. A state of the other family that has taken
        no step (zeros saved before the first step) carries nothing and is replaced.

        Raises:
            UserError: the adapter's state has stepped with the other family.
        """
        state = self.optimizer_state(adapter_id, create=True, family=family)
        assert state is not None
        if state.family == family:
            return state
        if state.num_steps > 0:
            raise user_error("optimizer_params.type", f"this model's optimizer state is "
                             f"{state.family!r} ({state.num_steps} steps); a {family!r} step "
                             "cannot use it")
        self._optimizers.pop(adapter_id)
        fresh = self.optimizer_state(adapter_id, create=True, family=family)
        assert fresh is not None
        return fresh

    def set_optimizer_state(self, adapter_id: str, state: OptimizerState | None) -> None:
        """Install a restored state (None: start over from zero moments at the next step)."""
        if state is None:
            self._optimizers.pop(adapter_id, None)
        else:
            self._optimizers[adapter_id] = state

    def forget(self, adapter_id: str) -> None:
        """Drop an adapter's optimizer state (the adapter itself lives in the bank)."""
        self._optimizers.pop(adapter_id, None)


def target_logprobs(model: Transformer, prepared: Sequence[_Prepared], hidden_R_D: torch.Tensor,
                    lora: LoraBatch | None, rows_T: torch.Tensor) -> list[torch.Tensor]:
    """Each work's target logprobs, ``[T]`` (or top-K ``[T, K]``), datums concatenated.

    One windowed head pass for the whole batch (`head_chunks.target_logprobs`: the same
    row-local fp32 log-softmax as the sampler's, so trainer and sampler logprobs agree bitwise
    in invariant mode, and no ``[rows, vocab]`` tensor is ever whole).
    """
    rows, flat_targets = [], []
    for p in prepared:
        targets = p.loss.target_tokens
        targets_T_K = targets.reshape(p.work.num_tokens, targets.shape[1] if targets.dim() == 2
                                      else 1)
        rows_T_1 = rows_T[p.token_start:p.token_start + p.work.num_tokens, None]
        rows.append(rows_T_1.expand_as(targets_T_K).reshape(-1))
        flat_targets.append(targets_T_K.reshape(-1))
    picked = head_chunks.target_logprobs(model, hidden_R_D, lora, torch.cat(rows),
                                         torch.cat(flat_targets))
    sizes = [p.loss.target_tokens.numel() for p in prepared]
    return [lp.view(p.loss.target_tokens.shape)
            for lp, p in zip(picked.split(sizes), prepared, strict=True)]


def float32_array(values: torch.Tensor) -> array:
    """A flat ``array('f')`` of a tensor's values (row-major), via one host copy."""
    out = array("f")
    out.frombytes(values.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return out
