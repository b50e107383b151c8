"""Token-id range checks: the one function every layer uses.

Which layer checks what: the API checks every token id of a request (prompt, datum tokens,
integer targets, stop tokens) against the served model's `ModelInfo` before an op exists, so
the error names the request's own field. The engine calls the same function again on the work
it is handed: an id outside the vocabulary would index past the embedding table and crash the
shared batch, so the engine never trusts its caller on this. The check is two C-speed passes
(``min``/``max``) over an ``array`` or a numpy array; only a failure scans for the position.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from loraplex.errors import user_error


class TokenIds(Protocol):
    """Token ids: a list, an ``array.array`` or a 1-D numpy array."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[int]: ...


def check_token_range(tokens: TokenIds, vocab_size: int, field: str) -> None:
    """Every id in ``[0, vocab_size)``.

    Args:
        tokens: token ids (a list, an ``array.array`` or a 1-D numpy array; pass a top-K
            ``[N, K]`` array flattened, positions then count row-major).
        field: the request field they came from (``data[3].model_input``).

    Raises:
        UserError: naming ``field[i]`` of the first id outside the vocabulary.
    """
    if not len(tokens):
        return
    if min(tokens) >= 0 and max(tokens) < vocab_size:
        return
    for i, token in enumerate(tokens):
        if not 0 <= token < vocab_size:
            raise user_error(f"{field}[{i}]", f"token id {int(token)} outside the vocabulary "
                             f"[0, {vocab_size})")
