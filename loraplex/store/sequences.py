"""Sampled sequences recorded for ``stable_reinforce`` (``record_stability_info``).

Each sampled sequence is stored under its ``sequence_id`` with its prompt, sampled tokens and
per-token logprobs, owned by the session that sampled it. Records live for a day after their
last use; `lookup` refreshes them.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loraplex.store.db import Database

DEFAULT_TTL_S = 24 * 3600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS sampled_prompts (
    request_id TEXT PRIMARY KEY,
    tokens     BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS sampled_sequences (
    sequence_id TEXT PRIMARY KEY,
    request_id  TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    tokens      BLOB NOT NULL,
    logprobs    BLOB NOT NULL,
    expires_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sequences_by_expiry ON sampled_sequences (expires_at);
"""


@dataclass(frozen=True)
class RecordedSequence:
    """What the sampler saw and produced for one sequence.

    Attributes:
        prompt: prompt token ids (typecode ``q``).
        tokens: sampled token ids (typecode ``i``).
        logprobs: sampling-time logprob of each sampled token (typecode ``f``).
    """

    sequence_id: str
    tenant: str
    session_id: str
    prompt: array
    tokens: array
    logprobs: array


class SequenceStore:
    def __init__(self, db: Database, ttl_s: float = DEFAULT_TTL_S) -> None:
        self._db = db
        self.ttl_s = ttl_s

    def record(
        self,
        *,
        request_id: str,
        tenant: str,
        session_id: str,
        prompt: array,
        sequences: Sequence[tuple[str, array, array]],
    ) -> None:
        """Store one sample request's prompt and its ``(sequence_id, tokens, logprobs)``."""
        expires = time.time() + self.ttl_s
        with self._db.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO sampled_prompts VALUES (?, ?)",
                         (request_id, array("q", prompt).tobytes()))
            conn.executemany(
                "INSERT OR REPLACE INTO sampled_sequences VALUES (?,?,?,?,?,?,?)",
                [(sid, request_id, tenant, session_id, array("i", toks).tobytes(),
                  array("f", lps).tobytes(), expires) for sid, toks, lps in sequences],
            )

    def lookup(self, sequence_ids: Iterable[str]) -> dict[str, RecordedSequence]:
        """The recorded sequences among ``sequence_ids`` (unknown ids are absent); refreshes
        their expiry."""
        ids = sorted(set(sequence_ids))
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self._db.query(
            "SELECT s.*, p.tokens AS prompt FROM sampled_sequences s JOIN sampled_prompts p"
            f" ON p.request_id = s.request_id WHERE s.sequence_id IN ({marks})", ids,
        )
        self._db.execute(f"UPDATE sampled_sequences SET expires_at = ? WHERE sequence_id IN"
                         f" ({marks})", [time.time() + self.ttl_s, *ids])
        return {r["sequence_id"]: RecordedSequence(
            r["sequence_id"], r["tenant"], r["session_id"], _arr("q", r["prompt"]),
            _arr("i", r["tokens"]), _arr("f", r["logprobs"])) for r in rows}

    def expire(self, now: float) -> int:
        with self._db.transaction() as conn:
            n = conn.execute("DELETE FROM sampled_sequences WHERE expires_at <= ?", (now,)).rowcount
            conn.execute("DELETE FROM sampled_prompts WHERE request_id NOT IN"
                         " (SELECT DISTINCT request_id FROM sampled_sequences)")
        return int(n)


def _arr(typecode: str, blob: bytes) -> array:
    out = array(typecode)
    out.frombytes(blob)
    return out
