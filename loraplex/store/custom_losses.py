"""Uploaded custom losses (`CustomLoss`) by ``loss_id``, in SQLite: a loss outlives a server
restart like the session that made it. Stores the graph as the JSON the SDK sent, already
checked by `loraplex.domain.custom_loss.check_graph`; knows nothing of what the nodes mean."""

from __future__ import annotations

import json
import time
from typing import Any

from loraplex.domain.custom_loss import CustomLoss, LossNode
from loraplex.errors import NotFoundError
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS custom_losses (
    loss_id     TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    name        TEXT NOT NULL,
    inputs      TEXT NOT NULL,
    nodes       TEXT NOT NULL,
    created_at  REAL NOT NULL
);
"""


class CustomLossStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def insert(self, loss: CustomLoss) -> CustomLoss:
        """Store ``loss`` unless its id exists; returns the stored one (the first, for a
        retried create)."""
        nodes = [{"op": n.op, "name": n.name, "target": n.target, "args": list(n.args),
                  "kwargs": n.kwargs} for n in loss.nodes]
        self._db.execute(
            "INSERT OR IGNORE INTO custom_losses (loss_id, tenant, session_id, name, inputs,"
            " nodes, created_at) VALUES (?,?,?,?,?,?,?)",
            (loss.loss_id, loss.tenant, loss.session_id, loss.name,
             json.dumps([list(i) for i in loss.inputs]), json.dumps(nodes), time.time()))
        row = self._db.query_one("SELECT * FROM custom_losses WHERE loss_id = ?",
                                 (loss.loss_id,))
        assert row is not None, "inserted or already there"
        return _loss(row)

    def count_for_session(self, session_id: str) -> int:
        row = self._db.query_one("SELECT COUNT(*) AS n FROM custom_losses WHERE session_id = ?",
                                 (session_id,))
        return int(row["n"]) if row is not None else 0

    def exists(self, loss_id: str) -> bool:
        return self._db.query_one("SELECT 1 FROM custom_losses WHERE loss_id = ?",
                                  (loss_id,)) is not None

    def get(self, loss_id: str, tenant: str, session_id: str,
            field: str = "loss_fn_config.loss_id") -> CustomLoss:
        """The loss, if ``tenant``'s session ``session_id`` made it; otherwise NotFoundError
        (another session's or tenant's loss is as unknown as a missing one)."""
        row = self._db.query_one("SELECT * FROM custom_losses WHERE loss_id = ?", (loss_id,))
        if row is None or row["tenant"] != tenant or row["session_id"] != session_id:
            raise NotFoundError(f"{field}: no custom loss {loss_id!r} in this session",
                                field=field)
        return _loss(row)


def _loss(row: Any) -> CustomLoss:
    nodes = tuple(LossNode(n["op"], n["name"], n["target"], tuple(n["args"]), n["kwargs"])
                  for n in json.loads(row["nodes"]))
    inputs = tuple((str(name), int(rank)) for name, rank in json.loads(row["inputs"]))
    return CustomLoss(str(row["loss_id"]), str(row["tenant"]), str(row["session_id"]),
                      str(row["name"]), inputs, nodes)
