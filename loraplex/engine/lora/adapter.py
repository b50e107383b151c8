"""`LoraAdapter`: one adapter's trainable tensors at their exact rank, plus naming and init.

Per target one leaf pair ``a_L_Rk_I`` (``[layers, rank, d_in]``) and ``b_L_O_Rk``
(``[layers, d_out, rank]``), fp32, ``requires_grad`` (an expert target's carry an expert axis
after the layers: ``[layers, 1 or E, rank, d_in]``, `engine.lora.experts`); gradients
accumulate in their ``.grad`` until the optimizer frees them. ``named_parameters`` is the
stable order the optimizer and checkpoint IO use; ``peft_state_dict`` splits layers into PEFT keys
(``base_model.model.<module>.lora_A.weight`` of shape ``(r, d_in)``, ``lora_B`` ``(d_out, r)``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.stage_slices import stage_rows
from loraplex.engine.lora.targets import PEFT_PREFIX, UNEMBED, peft_key, target_shape, targets_of
from loraplex.engine.model.spec import ModelSpec
from loraplex.errors import user_error


@dataclass
class LoraWeights:
    """One target across all its layers (``layers``: the model layer of each; empty: 0, 1,
    ... as for every target of a dense model)."""

    a_L_Rk_I: torch.Tensor
    b_L_O_Rk: torch.Tensor
    layers: tuple[int, ...] = ()

    def model_layer(self, index: int) -> int:
        return self.layers[index] if self.layers else index


@dataclass
class LoraAdapter:
    """An adapter: its config and one `LoraWeights` per trained target (canonical order)."""

    config: LoraConfig
    weights: dict[str, LoraWeights]

    @staticmethod
    def create(spec: ModelSpec, config: LoraConfig, device: torch.device | str = "cpu"
               ) -> LoraAdapter:
        """A fresh adapter: A ~ U(±1/√d_in) (PEFT's kaiming-uniform), B = 0 (a pipeline
        stage's: its rows of the whole model's adapter of that seed).

        A is drawn on CPU from a generator seeded with ``config.seed`` (random when None),
        target by target and layer by layer, so the same seed gives the same adapter on any
        device.
        """
        seed = config.seed if config.seed is not None else secrets.randbits(63)
        gen = torch.Generator().manual_seed(seed)
        weights = {}
        whole = spec.whole_spec  # a pipeline stage draws the whole init and keeps its rows
        mine = targets_of(config, spec)
        for target in targets_of(config, whole):
            shape = target_shape(whole, target)
            bound = 1.0 / shape.d_in ** 0.5
            a = torch.empty(shape.a_shape(config.rank))
            a.uniform_(-bound, bound, generator=gen)  # in place: no temporaries left behind
            if target not in mine:
                continue
            if spec.stage is not None:
                a = a[stage_rows(spec, target)].clone()
            shape = target_shape(spec, target)
            weights[target] = LoraWeights(
                a.to(device).requires_grad_(),
                torch.zeros(shape.b_shape(config.rank), device=device).requires_grad_(),
                shape.layers,
            )
        return LoraAdapter(config, weights)

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def scale(self) -> float:
        return self.config.scale

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, leaf)`` in a stable order: ``<target>.lora_A``, ``<target>.lora_B``, ..."""
        out = []
        for target, w in self.weights.items():
            out += [(f"{target}.lora_A", w.a_L_Rk_I), (f"{target}.lora_B", w.b_L_O_Rk)]
        return out

    def parameters(self) -> list[torch.Tensor]:
        return [p for _, p in self.named_parameters()]

    @property
    def is_trainable(self) -> bool:
        """Training adapters have leaves that require grad; frozen sampler copies do not."""
        return all(p.requires_grad for p in self.parameters())

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def nbytes(self) -> int:
        """Bytes of parameters and of any gradients currently held (none while paged out:
        the leaves are then ``meta`` placeholders, see `set_parameters`)."""
        total = 0
        for p in self.parameters():
            if p.is_meta:
                continue
            total += p.numel() * p.element_size()
            if p.grad is not None:
                total += p.grad.numel() * p.grad.element_size()
        return total

    def set_parameters(self, leaves: list[torch.Tensor]) -> None:
        """Replace the leaves, in `named_parameters` order (same shapes): how the pager swaps
        an adapter's tensors for ``meta`` placeholders on page-out and back on page-in, keeping
        this object (and so its prefix-cache identity, `AdapterVersions`)."""
        pairs = iter(leaves)
        for w in self.weights.values():
            a, b = next(pairs), next(pairs)
            assert a.shape == w.a_L_Rk_I.shape and b.shape == w.b_L_O_Rk.shape
            w.a_L_Rk_I, w.b_L_O_Rk = a, b
        assert next(pairs, None) is None, "more leaves than the adapter has"

    def with_parameters(self, leaves: list[torch.Tensor]) -> LoraAdapter:
        """A new adapter of this config whose leaves are ``leaves`` (this one is unchanged)."""
        other = LoraAdapter(self.config, {t: LoraWeights(w.a_L_Rk_I, w.b_L_O_Rk, w.layers)
                                          for t, w in self.weights.items()})
        other.set_parameters(leaves)
        return other

    def free_grads(self) -> None:
        """Drop gradients (set to None) so persistent memory is parameters (+ moments) only."""
        for p in self.parameters():
            p.grad = None

    def frozen_copy(self) -> LoraAdapter:
        """A detached copy (no grad): a sampler version that later training cannot change."""
        return LoraAdapter(self.config, {
            t: LoraWeights(w.a_L_Rk_I.detach().clone(), w.b_L_O_Rk.detach().clone(), w.layers)
            for t, w in self.weights.items()
        })

    def peft_state_dict(self) -> dict[str, torch.Tensor]:
        """PEFT-named per-layer tensors (fresh, contiguous CPU copies; an expert target's are
        3-D, ``(1 or E, r, d_in)`` and ``(E or 1, d_out, r)``, as Tinker exports them)."""
        state = {}
        for target, w in self.weights.items():
            for i in range(w.a_L_Rk_I.shape[0]):
                layer = w.model_layer(i)
                state[peft_key(target, layer, "A")] = w.a_L_Rk_I[i].detach().cpu().clone()
                state[peft_key(target, layer, "B")] = w.b_L_O_Rk[i].detach().cpu().clone()
        return state

    def load_peft_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy PEFT-named tensors into this adapter's leaves (shapes must match exactly).

        Raises:
            UserError: a key is missing or has the wrong shape.
        """
        with torch.no_grad():
            for target, w in self.weights.items():
                for i in range(w.a_L_Rk_I.shape[0]):
                    for which, dst in (("A", w.a_L_Rk_I[i]), ("B", w.b_L_O_Rk[i])):
                        key = peft_key(target, w.model_layer(i), which)
                        peft_head = f"{PEFT_PREFIX}lm_head.lora_{which}.weight"
                        if key not in state and target == UNEMBED and peft_head in state:
                            key = peft_head  # PEFT's name for the head
                        if key not in state:
                            raise user_error("adapter_weights", f"missing {key}")
                        src = state[key]
                        if tuple(src.shape) != tuple(dst.shape):
                            raise user_error("adapter_weights", f"{key} has shape "
                                             f"{tuple(src.shape)}, expected {tuple(dst.shape)}")
                        dst.copy_(src)
