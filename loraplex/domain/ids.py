"""Identifiers the Tinker SDK computes or parses: model ids, sampling session ids, tinker:// paths.

The SDK derives a model id as ``{session_id}:train:{model_seq_id}`` itself (create-via-load), and
parses checkpoint paths as exactly three ``/``-separated parts after ``tinker://``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loraplex.errors import user_error

CheckpointKind = Literal["weights", "sampler_weights", "external_weights"]
CHECKPOINT_KINDS: tuple[CheckpointKind, ...] = ("weights", "sampler_weights", "external_weights")
CHECKPOINT_TYPE_OF_KIND = {"weights": "training", "sampler_weights": "sampler",
                           "external_weights": "external"}
TINKER_SCHEME = "tinker://"


def model_id(session_id: str, model_seq_id: int) -> str:
    """The training-run id the SDK expects for the ``model_seq_id``-th model of a session."""
    return f"{session_id}:train:{model_seq_id}"


def sampling_session_id(session_id: str, sampling_session_seq_id: int) -> str:
    """Production-style sampling session id."""
    return f"{session_id}:sample:{sampling_session_seq_id}"


@dataclass(frozen=True)
class TinkerPath:
    """``tinker://{run_id}/{kind}/{name}``; ``run_id`` is the training model id."""

    run_id: str
    kind: CheckpointKind
    name: str

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def checkpoint_type(self) -> str:
        return CHECKPOINT_TYPE_OF_KIND[self.kind]

    def __str__(self) -> str:
        return f"{TINKER_SCHEME}{self.run_id}/{self.kind}/{self.name}"

    @staticmethod
    def parse(path: str, field: str = "path") -> TinkerPath:
        """Parse like the SDK does; raise a user error naming `field` otherwise."""
        if not isinstance(path, str) or not path.startswith(TINKER_SCHEME):
            raise user_error(field, f"expected a tinker:// path, got {path!r}")
        parts = path[len(TINKER_SCHEME):].split("/")
        if len(parts) != 3 or not all(parts):
            raise user_error(field, f"expected tinker://<run_id>/<kind>/<name>, got {path!r}")
        run_id, kind, name = parts
        if kind not in CHECKPOINT_KINDS:
            raise user_error(field, f"unknown checkpoint kind {kind!r} in {path!r}")
        return TinkerPath(run_id, kind, name)

    @staticmethod
    def from_checkpoint_id(run_id: str, checkpoint_id: str) -> TinkerPath:
        """Build from a REST ``{run_id}`` + ``{kind}/{name}`` pair."""
        return TinkerPath.parse(f"{TINKER_SCHEME}{run_id}/{checkpoint_id}", "checkpoint_id")


MAX_NAME_BYTES = 200
"""Longest checkpoint name in UTF-8 bytes: a path component (file systems allow 255 bytes; the
store appends a 9-byte version suffix)."""


def validate_checkpoint_name(name: str, field: str = "path") -> str:
    """Checkpoint names become path components: no slashes, no dot-dot, not empty, at most
    `MAX_NAME_BYTES` bytes of UTF-8."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        raise user_error(field, f"invalid checkpoint name {name!r} (no '/', not empty)")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise user_error(field, "checkpoint name is not valid Unicode text") from None
    if size > MAX_NAME_BYTES:
        raise user_error(field, f"checkpoint name is {size} bytes of UTF-8; at most "
                         f"{MAX_NAME_BYTES} are allowed")
    return name
