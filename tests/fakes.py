"""Fakes with behaviour for testing everything above the `BatchExecutor` protocol.

`ToyExecutor` is a deterministic toy language model whose only trainable parameter per adapter
is one scalar θ: next-token logits are ``base[prev, :] + θ · feat[prev, :]`` (a bigram model),
so logprobs depend on the tokens and on the adapter; forward_backward accumulates the exact
gradient of the Tinker losses w.r.t. θ; optim_step moves θ by AdamW; sampling draws tokens from a
seeded RNG with continuous batching across `sample_step` calls; save/load write and read real
files (JSON state, plus PEFT-named ``adapter_config.json`` + ``adapter_model.safetensors``).

The benchmarks' no-op engine, `NoopExecutor`, lives in `benchmarks/harness/fakes.py`.
"""

from __future__ import annotations

import json
import math
import os
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loraplex.domain.cycle import CycleOutcome, run_cycle_calls
from loraplex.domain.data import Datum
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.model_card import ModelCard
from loraplex.domain.optim import AdamParams, OptimParams
from loraplex.domain.results import (
    AdapterMemory,
    ForwardBackwardResult,
    FwdBwdOutcome,
    LoadResult,
    OptimOutcome,
    OptimStepResult,
    SampleOutcome,
    SampleStep,
    SaveResult,
)
from loraplex.domain.sampling import (
    SampledSequence,
    SampleResult,
    SequenceDelta,
    TopkLogprobs,
    cancelled_error,
)
from loraplex.domain.work import (
    RECORDED_LOGPROBS_KEY,
    ForwardBackwardWork,
    LoadWork,
    OptimStepWork,
    SampleWork,
    SaveWork,
)
from loraplex.errors import LoraplexError, UserError, user_error

TOY_STATE_FILE = "toy_adapter.json"
SENTINEL = (0, -99999.0)
RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "stable_reinforce")


def toy_detokenize(tokens: Sequence[int]) -> str:
    """The toy vocabulary's text: token j is one character (EOS is a newline)."""
    return "".join("\n" if t == 1 else chr(ord("a") + t % 26) for t in tokens)


@dataclass
class ToyAdapter:
    config: LoraConfig
    theta: float = 0.0
    grad: float = 0.0
    m: float = 0.0
    v: float = 0.0
    step: int = 0


@dataclass(frozen=True)
class ToyCheckpoint:
    """A toy checkpoint read into memory, waiting to be installed."""

    adapter: ToyAdapter

    @property
    def config(self) -> LoraConfig:
        return self.adapter.config


@dataclass
class _Running:
    work: SampleWork
    theta: float
    rngs: list[random.Random]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    topk: list[list[list[tuple[int, float]]]]
    done: list[str | None]
    prompt_result: tuple[array | None, TopkLogprobs | None] = (None, None)
    max_tokens: int = 16
    reported: list[int] = field(default_factory=list)


@dataclass
class ToyExecutor:
    """A BatchExecutor over a bigram toy model (see module docstring).

    Attributes:
        vocab_size, max_context, eos_token_id: the toy model's facts.
        max_lora_rank: create_adapter refuses larger ranks (a user error).
        bug_token: a datum or prompt containing this token makes the whole engine call raise
            RuntimeError (simulates an engine bug); None disables.
        calls: (method, adapter ids) of every batch call, for packing assertions.
        last_fwd_bwd: the works of the latest forward_backward call, as the engine saw them.
        memory_releases: how many times the clock loop called `release_memory`.
    """

    vocab_size: int = 64
    max_context: int = 512
    eos_token_id: int = 1
    max_lora_rank: int = 64
    bug_token: int | None = None
    calls: list[tuple[str, tuple[str | None, ...]]] = field(default_factory=list)
    compute: str = "toy"
    last_fwd_bwd: tuple[ForwardBackwardWork, ...] = ()
    memory_releases: int = 0

    def __post_init__(self) -> None:
        v = np.arange(self.vocab_size, dtype=np.float64)
        self._base_VV = 2.0 * np.sin(0.37 * np.outer(v + 1, v + 1))
        self._feat_VV = np.cos(0.11 * np.outer(v + 2, v + 3))
        self._adapters: dict[str, ToyAdapter] = {}
        self._running: dict[str, _Running] = {}

    # ---- adapters ------------------------------------------------------------------------

    def model_info(self) -> ModelInfo:
        card = ModelCard(name="toy", num_layers=1, hidden_size=8, num_heads=1, num_kv_heads=1,
                         head_dim=8, intermediate_size=16, vocab_size=self.vocab_size)
        return ModelInfo(arch="toy", card=card, max_context=self.max_context,
                         eos_token_ids=(self.eos_token_id,), num_params=2 * self.vocab_size**2,
                         compute=self.compute)

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        config.validate(self.max_lora_rank)
        self._adapters[adapter_id] = ToyAdapter(config)

    def delete_adapter(self, adapter_id: str) -> None:
        self._adapters.pop(adapter_id, None)

    def has_adapter(self, adapter_id: str) -> bool:
        return adapter_id in self._adapters

    def theta(self, adapter_id: str) -> float:
        return self._adapters[adapter_id].theta

    # ---- training ------------------------------------------------------------------------

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        self.calls.append(("forward_backward", tuple(w.adapter_id for w in works)))
        self.last_fwd_bwd = tuple(works)
        self._check_bug(t for w in works for d in w.data for t in d.tokens)
        return [self._guard(lambda w=w: self._fwd_bwd_one(w)) for w in works]

    def _fwd_bwd_one(self, work: ForwardBackwardWork) -> ForwardBackwardResult:
        adapter = self._adapter(work.adapter_id)
        logprobs, losses, total_grad = [], [], 0.0
        for i, datum in enumerate(work.data):
            lp_T, grad_T = self._logprobs_and_grads(datum, adapter.theta, i)
            loss_T, dloss_dlp_T = self._loss(work, datum, lp_T, i)
            total_grad += float(np.dot(dloss_dlp_T, grad_T))
            logprobs.append(array("f", lp_T.astype(np.float32).tobytes()))
            losses.append(array("f", loss_T.astype(np.float32).tobytes()))
        if not work.forward_only:
            adapter.grad += total_grad
        loss_sum = float(sum(sum(x) for x in losses))
        return ForwardBackwardResult(tuple(logprobs), tuple(losses), {"loss:sum": loss_sum})

    def _logprobs_and_grads(self, datum: Datum, theta: float, i: int
                            ) -> tuple[np.ndarray, np.ndarray]:
        tokens_T = np.frombuffer(datum.tokens, dtype=np.int64)
        targets = datum.loss_fn_inputs.get("target_tokens")
        if targets is None:
            raise user_error(f"data[{i}].loss_fn_inputs.target_tokens", "required")
        if targets.shape != (len(tokens_T),):
            raise user_error(f"data[{i}].loss_fn_inputs.target_tokens",
                             f"shape {targets.shape} does not match model_input ({len(tokens_T)})")
        target_T = np.frombuffer(targets.data, dtype=np.int64)
        if target_T.size and (target_T.min() < 0 or target_T.max() >= self.vocab_size):
            raise user_error(f"data[{i}].loss_fn_inputs.target_tokens", "token outside vocab")
        logits_TV = self._base_VV[tokens_T] + theta * self._feat_VV[tokens_T]
        logz_T = np.logaddexp.reduce(logits_TV, axis=1)
        probs_TV = np.exp(logits_TV - logz_T[:, None])
        rows = np.arange(len(tokens_T))
        lp_T = logits_TV[rows, target_T] - logz_T
        feat_TV = self._feat_VV[tokens_T]
        grad_T = feat_TV[rows, target_T] - (probs_TV * feat_TV).sum(axis=1)
        return lp_T, grad_T

    def _loss(self, work: ForwardBackwardWork, datum: Datum, lp_T: np.ndarray, i: int
              ) -> tuple[np.ndarray, np.ndarray]:
        """Per-token loss and d(loss)/d(logprob) for the Tinker losses (sums over tokens)."""
        n = len(lp_T)

        def inp(name: str) -> np.ndarray:
            t = datum.loss_fn_inputs.get(name)
            if t is None:
                raise user_error(f"data[{i}].loss_fn_inputs.{name}", f"required by {work.loss_fn}")
            if t.shape != (n,):
                raise user_error(f"data[{i}].loss_fn_inputs.{name}",
                                 f"shape {t.shape} does not match target_tokens ({n})")
            return np.frombuffer(t.data, dtype=np.float32).astype(np.float64)

        if work.loss_fn == "cross_entropy":
            w_T = inp("weights")
            return -lp_T * w_T, -w_T
        if work.loss_fn not in RL_LOSSES:
            raise user_error("loss_fn", f"unknown loss {work.loss_fn!r}")
        adv_T = inp("advantages")
        q_T = inp("logprobs")
        if work.loss_fn == "stable_reinforce":
            if RECORDED_LOGPROBS_KEY not in datum.loss_fn_inputs:
                raise user_error(f"data[{i}].loss_fn_input_spans", "stable_reinforce needs "
                                 "provenance")
            rec_T = inp(RECORDED_LOGPROBS_KEY)
            q_T = np.where(np.isnan(rec_T), q_T, rec_T)
        ratio_T = np.exp(lp_T - q_T)
        cfg = work.loss_fn_config
        if work.loss_fn == "ppo":
            lo, hi = float(cfg.get("clip_low_threshold", 0.8)), float(
                cfg.get("clip_high_threshold", 1.2))
            clipped = np.clip(ratio_T, lo, hi)
            use_raw = ratio_T * adv_T <= clipped * adv_T
            loss_T = -np.minimum(ratio_T * adv_T, clipped * adv_T)
            return loss_T, np.where(use_raw, -ratio_T * adv_T, 0.0)
        if work.loss_fn == "cispo":
            lo, hi = float(cfg.get("clip_low_threshold", 0.0)), float(
                cfg.get("clip_high_threshold", 4.0))
            clipped = np.clip(ratio_T, lo, hi)
            return -clipped * lp_T * adv_T, -clipped * adv_T
        if work.loss_fn == "dro":
            beta = float(cfg.get("beta", 0.1))
            loss_T = -(lp_T * adv_T - 0.5 * beta * (lp_T - q_T) ** 2)
            return loss_T, -(adv_T - beta * (lp_T - q_T))
        return -ratio_T * adv_T, -ratio_T * adv_T  # importance_sampling, stable_reinforce

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        self.calls.append(("optim_step", tuple(w.adapter_id for w in works)))
        return [self._guard(lambda w=w: self._adam(self._adapter(w.adapter_id), w.params))
                for w in works]

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> CycleOutcome:
        return run_cycle_calls(self.forward_backward, self.optim_step, fwd_bwd, optim)

    @staticmethod
    def _adam(a: ToyAdapter, p: OptimParams) -> OptimStepResult:
        if not isinstance(p, AdamParams):
            raise user_error("optimizer_params.type", "the fake engine implements AdamW only")
        g = a.grad
        norm = abs(g)
        if p.grad_clip_norm > 0 and norm > p.grad_clip_norm:
            g *= p.grad_clip_norm / norm
        a.step += 1
        a.m = p.beta1 * a.m + (1 - p.beta1) * g
        a.v = p.beta2 * a.v + (1 - p.beta2) * g * g
        m_hat = a.m / (1 - p.beta1**a.step)
        v_hat = a.v / (1 - p.beta2**a.step)
        a.theta -= p.learning_rate * p.weight_decay * a.theta
        a.theta -= p.learning_rate * m_hat / (math.sqrt(v_hat) + p.eps)
        a.grad = 0.0
        return OptimStepResult({"grad_norm:mean": norm})

    # ---- checkpoints ---------------------------------------------------------------------

    def save_adapter(self, work: SaveWork) -> SaveResult:
        a = self._adapter(work.adapter_id)
        if os.path.exists(work.directory):
            raise LoraplexError(f"checkpoint directory {work.directory} exists")
        tmp = work.directory + ".tmp"
        os.makedirs(tmp)
        state: dict[str, object] = {"theta": a.theta, "config": _config_json(a.config)}
        if work.with_optimizer:
            state.update(m=a.m, v=a.v, step=a.step)
        _write_json(os.path.join(tmp, TOY_STATE_FILE), state)
        if work.peft_export:
            self._write_peft(tmp, a)
        os.rename(tmp, work.directory)
        size = sum(os.path.getsize(os.path.join(work.directory, f))
                   for f in os.listdir(work.directory))
        return SaveResult(size)

    @staticmethod
    def _write_peft(directory: str, a: ToyAdapter) -> None:
        from safetensors.numpy import save_file

        _write_json(os.path.join(directory, "adapter_config.json"), {
            "peft_type": "LORA", "r": a.config.rank, "lora_alpha": a.config.alpha,
            "target_modules": ["q_proj"], "base_model_name_or_path": "toy"})
        prefix = "base_model.model.model.layers.0.self_attn.q_proj"
        save_file({
            f"{prefix}.lora_A.weight": np.full((a.config.rank, 8), a.theta, dtype=np.float32),
            f"{prefix}.lora_B.weight": np.zeros((8, a.config.rank), dtype=np.float32),
        }, os.path.join(directory, "adapter_model.safetensors"))

    def read_checkpoint(self, work: LoadWork) -> ToyCheckpoint:
        state = _read_state(work.directory)
        config = LoraConfig(**state["config"])
        if work.expect_config is not None and work.expect_config.rank != config.rank:
            raise user_error("path", f"checkpoint has rank {config.rank}, the model has rank "
                             f"{work.expect_config.rank}")
        adapter = ToyAdapter(config, theta=float(state["theta"]))
        if work.with_optimizer:
            if "step" not in state:
                raise user_error("path", "checkpoint has no optimizer state")
            adapter.m, adapter.v, adapter.step = state["m"], state["v"], state["step"]
        return ToyCheckpoint(adapter)

    def install_adapter(self, adapter_id: str, prepared: object) -> LoadResult:
        assert isinstance(prepared, ToyCheckpoint)
        self._adapters[adapter_id] = prepared.adapter
        return LoadResult(prepared.config)

    def load_adapter(self, work: LoadWork) -> LoadResult:
        return self.install_adapter(work.adapter_id, self.read_checkpoint(work))

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        src = self._adapter(src_adapter_id)
        self._adapters[dst_adapter_id] = ToyAdapter(src.config, theta=src.theta)

    # ---- sampling ------------------------------------------------------------------------

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int,
                    cancel: Sequence[str] = ()) -> SampleStep:
        self.calls.append(("sample_step", tuple(w.adapter_id for w in admit)))
        self._check_bug(t for w in admit for t in w.prompt)
        finished: list[SampleOutcome] = [(rid, cancelled_error()) for rid in cancel
                                         if self._running.pop(rid, None) is not None]
        for work in admit:
            try:
                self._running[work.request_id] = self._start(work)
            except UserError as exc:
                finished.append((work.request_id, exc))
        for request_id in list(self._running):
            run = self._running[request_id]
            for _ in range(max_decode_steps):
                if all(d is not None for d in run.done):
                    break
                self._decode_one(run)
            if all(d is not None for d in run.done):
                del self._running[request_id]
                finished.append((request_id, self._result(run)))
        return SampleStep(tuple(finished), tuple(self._progress()))

    def _progress(self) -> list[SequenceDelta]:
        deltas = []
        for rid, run in self._running.items():
            if not run.work.stream:
                continue
            run.reported += [0] * (len(run.tokens) - len(run.reported))
            for s, tokens in enumerate(run.tokens):
                start = run.reported[s]
                if len(tokens) > start:
                    deltas.append(SequenceDelta(rid, s, start, array("i", tokens[start:]),
                                                array("f", run.logprobs[s][start:])))
                    run.reported[s] = len(tokens)
        return deltas

    def num_running_samples(self) -> int:
        return len(self._running)

    def release_memory(self) -> None:
        self.memory_releases += 1

    def adapter_memory(self) -> AdapterMemory:
        return AdapterMemory(resident_adapters=len(self._adapters),
                             bytes_resident=8 * len(self._adapters))

    def close(self) -> None:
        self._running.clear()

    def _start(self, work: SampleWork) -> _Running:
        theta = 0.0
        if work.adapter_id is not None:
            if work.adapter_id not in self._adapters:
                if work.adapter_dir is None:
                    raise UserError(f"adapter {work.adapter_id!r} is not resident")
                state = _read_state(work.adapter_dir)
                self._adapters[work.adapter_id] = ToyAdapter(
                    LoraConfig(**state["config"]), theta=float(state["theta"]))
            theta = self._adapters[work.adapter_id].theta
        prompt = list(work.prompt)
        if any(not 0 <= t < self.vocab_size for t in prompt):
            raise user_error("prompt", "token outside vocab")
        seed = work.params.seed
        rngs = [random.Random(f"{seed}:{i}" if seed is not None else f"{work.request_id}:{i}")
                for i in range(work.num_samples)]
        room = self.max_context - len(prompt)
        max_tokens = min(work.params.max_tokens if work.params.max_tokens is not None else 16,
                         room)
        n = work.num_samples
        run = _Running(work, theta, rngs, [[] for _ in range(n)], [[] for _ in range(n)],
                       [[] for _ in range(n)], [None] * n, max_tokens=max_tokens)
        run.prompt_result = self._prompt_scores(work, theta)
        if max_tokens <= 0:
            run.done = ["length"] * n
        return run

    def _dist(self, prev: int, theta: float) -> np.ndarray:
        logits_V = self._base_VV[prev] + theta * self._feat_VV[prev]
        return np.asarray(logits_V - np.logaddexp.reduce(logits_V))

    def _prompt_scores(self, work: SampleWork, theta: float
                       ) -> tuple[array | None, TopkLogprobs | None]:
        prompt = list(work.prompt)
        lps = array("f", [math.nan])
        rows: list[list[tuple[int, float]]] = [[SENTINEL] * work.topk_prompt_logprobs]
        for i in range(1, len(prompt)):
            lp_V = self._dist(prompt[i - 1], theta)
            scored = work.prompt_logprobs_last_n is None or i >= len(prompt) - \
                work.prompt_logprobs_last_n
            lps.append(float(lp_V[prompt[i]]) if scored else math.nan)
            rows.append(_topk(lp_V, work.topk_prompt_logprobs))
        topk = _pack_topk(rows, work.topk_prompt_logprobs) if work.topk_prompt_logprobs else None
        return (lps if work.prompt_logprobs else None), topk

    def _decode_one(self, run: _Running) -> None:
        work, params = run.work, run.work.params
        for s in range(work.num_samples):
            if run.done[s] is not None:
                continue
            prev = run.tokens[s][-1] if run.tokens[s] else work.prompt[-1]
            lp_V = self._dist(prev, run.theta)
            token = self._draw(lp_V, params.temperature, params.top_k, params.top_p, run.rngs[s])
            run.tokens[s].append(token)
            run.logprobs[s].append(float(lp_V[token]))
            if work.topk_sample_logprobs:
                run.topk[s].append(_topk(lp_V, work.topk_sample_logprobs))
            stop = params.stop
            text = toy_detokenize(run.tokens[s])
            if (token in stop.token_ids or (stop.use_eos and token == self.eos_token_id)
                    or any(x and x in text for x in stop.strings)):
                run.done[s] = "stop"
            elif len(run.tokens[s]) >= run.max_tokens:
                run.done[s] = "length"

    @staticmethod
    def _draw(lp_V: np.ndarray, temperature: float, top_k: int, top_p: float,
              rng: random.Random) -> int:
        if temperature == 0:
            return int(np.argmax(lp_V))
        logits = lp_V / temperature
        order = np.argsort(-logits)
        if top_k > 0:
            order = order[:top_k]
        probs = np.exp(logits[order] - logits[order].max())
        probs /= probs.sum()
        if top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        u, acc = rng.random(), 0.0
        for token, p in zip(order, probs, strict=True):
            acc += p
            if u <= acc:
                return int(token)
        return int(order[-1])

    def _result(self, run: _Running) -> SampleResult:
        k = run.work.topk_sample_logprobs
        seqs = tuple(SampledSequence(
            array("i", run.tokens[s]), array("f", run.logprobs[s]),
            "stop" if run.done[s] == "stop" else "length",
            _pack_topk(run.topk[s], k) if k else None) for s in range(run.work.num_samples))
        prompt_lps, topk_prompt = run.prompt_result
        return SampleResult(seqs, prompt_lps, topk_prompt, 0)

    # ---- helpers -------------------------------------------------------------------------

    def _adapter(self, adapter_id: str) -> ToyAdapter:
        if adapter_id not in self._adapters:
            raise UserError(f"model_id: adapter {adapter_id!r} is not loaded", field="model_id")
        return self._adapters[adapter_id]

    def _check_bug(self, tokens: object) -> None:
        if self.bug_token is not None and self.bug_token in list(tokens):  # type: ignore[call-overload]
            raise RuntimeError("toy engine bug triggered on purpose")

    @staticmethod
    def _guard(fn: object) -> object:
        try:
            return fn()  # type: ignore[operator]
        except LoraplexError as exc:
            return exc


def _topk(lp_V: np.ndarray, k: int) -> list[tuple[int, float]]:
    order = np.argsort(-lp_V)[:k]
    return [(int(t), float(lp_V[t])) for t in order]


def _pack_topk(rows: list[list[tuple[int, float]]], k: int) -> TopkLogprobs:
    ids = array("i", [t for row in rows for t, _ in row])
    lps = array("f", [lp for row in rows for _, lp in row])
    return TopkLogprobs(k, len(rows), ids, lps)


def _config_json(c: LoraConfig) -> dict[str, object]:
    return {"rank": c.rank, "alpha": c.alpha, "train_attn": c.train_attn,
            "train_mlp": c.train_mlp, "train_unembed": c.train_unembed, "seed": c.seed}


def _write_json(path: str, value: object) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


def _read_state(directory: str) -> dict:
    path = os.path.join(directory, TOY_STATE_FILE)
    if not os.path.exists(path):
        raise user_error("path", f"no adapter checkpoint in {os.path.basename(directory)}")
    with open(path) as f:
        return dict(json.load(f))
