"""`LinearStates`: the sampler's per-sequence state of every linear-attention layer (a hybrid
model's counterpart of the KV pages): one `delta_net.Carry` per (sequence, layer), kept
beside the paged cache of the full-attention layers.

A sequence is named by the key its `SequenceInput.state_key` carries (the sampler's sequence
object). A forward reads the carry of every sequence that has cached positions and replaces
it with the one at its new end; a fork starts from a copy of its parent's (the shared prefix is
computed once); a released or preempted sequence drops its carries (resuming recomputes them,
bitwise the same). Carries are never shared, so replacing one never touches another.
Knows nothing about pages, requests or the computation.
"""

from __future__ import annotations

from collections.abc import Hashable

from loraplex.engine.model.delta_net import Carry
from loraplex.errors import user_error


class LinearStates:
    """Carries by sequence key and layer."""

    def __init__(self) -> None:
        self._carries: dict[Hashable, dict[int, Carry]] = {}

    def get(self, key: Hashable | None, layer: int) -> Carry:
        """The carry of a sequence with cached positions (a UserError if it has none: its
        cached positions came from somewhere a carry cannot, such as a prefix-cache page)."""
        carry = self._carries.get(key, {}).get(layer) if key is not None else None
        if carry is None:
            raise user_error("state_key", "a sequence with cached positions has no "
                                          "linear-attention state")
        return carry

    def put(self, key: Hashable | None, layer: int, carry: Carry) -> None:
        if key is None:
            raise user_error("state_key", "a sampler sequence of a hybrid model needs a key")
        self._carries.setdefault(key, {})[layer] = carry

    def copy(self, src: Hashable, dst: Hashable) -> None:
        """``dst`` continues from ``src``'s state (carries are immutable: shared safely)."""
        self._carries[dst] = dict(self._carries.get(src, {}))

    def drop(self, key: Hashable) -> None:
        self._carries.pop(key, None)

    def clear(self) -> None:
        self._carries.clear()

    def __len__(self) -> int:
        return len(self._carries)

    def nbytes(self) -> int:
        """Bytes of every carried tensor."""
        total = 0
        for layers in self._carries.values():
            for c in layers.values():
                rows = c.rows
                tensors = (c.state_H_K_V, c.conv_W_C, rows.q, rows.k, rows.v, rows.g, rows.beta)
                total += sum(t.numel() * t.element_size() for t in tensors)
        return total
