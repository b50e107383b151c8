"""`Stage`: one rank's share of a model split into pipeline stages, and `plan_stages`, which
cuts a model into stages of about equal memory.

A stage holds a contiguous range of decoder layers; the first stage also holds the embedding
and the last the final norm and head, except in a tied model, whose one matrix stays on the
last stage (never stored twice: the last stage looks the tokens up and sends the rows to the
first). A forward runs the layers stage by stage and ends on the last stage (final norm, head,
losses, sampling). Every row keeps the bits it has on one device: the same ops on the same
values, only on other processes.

Why stages and not tensor parallelism: a row-parallel GEMM's reduction across ranks changes a
row's bits (every token would differ from one device's, and from the sampler's unless every
reduction is fixed-order), and it needs two all-reduces per layer; stages exchange one
``[rows, hidden]`` tensor per stage boundary and keep every bit. Knows nothing about
processes or communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loraplex.errors import user_error


@dataclass(frozen=True)
class Stage:
    """Stage ``index`` of ``count``: decoder layers ``first_layer .. end_layer - 1``."""

    index: int
    count: int
    first_layer: int
    end_layer: int

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """The last stage also holds the head."""
        return self.index == self.count - 1

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.first_layer


def plan_stages(layer_bytes: Sequence[int], first_bytes: int, last_bytes: int, count: int
                ) -> list[Stage]:
    """Contiguous layer ranges for ``count`` stages minimising the largest stage's bytes (the
    first stage's include ``first_bytes``, the last's ``last_bytes``: the embedding and the
    head); every stage gets at least one layer.

    Raises:
        UserError: fewer layers than stages.
    """
    num_layers = len(layer_bytes)
    if not 1 <= count <= num_layers:
        raise user_error("model_parallel", f"{count} stages need 1 to {num_layers} (the "
                         "model's layers)")
    prefix = [0]
    for b in layer_bytes:
        prefix.append(prefix[-1] + b)
    inf = float("inf")
    # best[s][i]: the least possible largest stage when stages s.. take layers i..
    best = [[inf] * (num_layers + 1) for _ in range(count + 1)]
    cut = [[0] * (num_layers + 1) for _ in range(count + 1)]
    for i in range(num_layers):
        best[count - 1][i] = prefix[num_layers] - prefix[i] + last_bytes + (
            first_bytes if count == 1 else 0)
    for s in range(count - 2, -1, -1):
        extra = first_bytes if s == 0 else 0
        for i in range(num_layers - (count - s) + 1):
            for j in range(i + 1, num_layers - (count - s - 1) + 1):
                worst = max(prefix[j] - prefix[i] + extra, best[s + 1][j])
                if worst < best[s][i]:
                    best[s][i], cut[s][i] = worst, j
    stages, first = [], 0
    for s in range(count):
        end = num_layers if s == count - 1 else cut[s][first]
        stages.append(Stage(s, count, first, end))
        first = end
    return stages
