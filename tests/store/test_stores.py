"""Keys, sessions, runs and recorded sequences, and their survival across a reopen."""

from __future__ import annotations

import sqlite3
import time
from array import array
from pathlib import Path

import pytest

from loraplex.domain.lora import LoraConfig
from loraplex.domain.training_run import TrainingRun
from loraplex.errors import AuthError, NotFoundError, UserError
from loraplex.store.stores import open_stores


def test_keys_are_stored_hashed_and_resolve_to_their_tenant(tmp_path: Path) -> None:
    stores = open_stores(str(tmp_path))
    key = stores.keys.create("alice")
    assert key.startswith("tml-") and len(key) > 30
    assert stores.keys.tenant_for(key, open_access=False) == "alice"
    with pytest.raises(AuthError, match="unknown"):
        stores.keys.tenant_for("tml-other", open_access=False)
    open_a = stores.keys.tenant_for("tml-a", open_access=True)
    assert open_a != stores.keys.tenant_for("tml-b", open_access=True)
    assert stores.keys.tenant_for(key, open_access=True) == "alice"
    with pytest.raises(AuthError, match="tml-"):
        stores.keys.tenant_for("sk-nope", open_access=True)
    with pytest.raises(UserError):
        stores.keys.create("bad name/with slash")
    stores.close()
    raw = sqlite3.connect(tmp_path / "loraplex.sqlite3").execute(
        "SELECT key_hash FROM api_keys").fetchall()
    assert key not in str(raw)


def test_metadata_survives_reopening_the_data_dir(tmp_path: Path) -> None:
    stores = open_stores(str(tmp_path))
    session = stores.sessions.create("alice", tags=["t"], user_metadata={"a": 1},
                                     sdk_version="0.38.0")
    stores.runs.insert(TrainingRun(f"{session.session_id}:train:0", "alice",
                                   session.session_id, "Qwen/Qwen3-8B", LoraConfig(8),
                                   {"type": "adamw"}, {"k": "v"}))
    stores.runs.record_step(f"{session.session_id}:train:0", 12)
    secret = stores.secret
    stores.close()

    again = open_stores(str(tmp_path))
    assert again.secret == secret
    assert again.sessions.get(session.session_id, "alice").user_metadata == {"a": 1}
    run = again.runs.get(f"{session.session_id}:train:0", "alice")
    assert (run.run.lora.rank, run.num_steps, run.num_trained_tokens) == (8, 1, 12)
    with pytest.raises(NotFoundError):
        again.runs.get(run.run.model_id, "bob")
    with pytest.raises(NotFoundError):
        again.sessions.get(session.session_id, "bob")
    runs, total = again.runs.page("alice", include_public=False, limit=10, offset=0)
    assert total == 1 and runs[0].run.user_metadata == {"k": "v"}


def test_recorded_sequences_expire_unless_used(tmp_path: Path) -> None:
    stores = open_stores(str(tmp_path))
    stores.sequences.ttl_s = 100
    stores.sequences.record(request_id="r1", tenant="alice", session_id="s1",
                            prompt=array("q", [1, 2, 3]),
                            sequences=[("r1:0", array("i", [4, 5]), array("f", [-0.5, -1.5]))])
    [rec] = stores.sequences.lookup(["r1:0", "unknown"]).values()
    assert (list(rec.prompt), list(rec.tokens), list(rec.logprobs)) == (
        [1, 2, 3], [4, 5], [-0.5, -1.5])
    assert stores.sequences.expire(time.time() + 50) == 0
    assert stores.sequences.expire(time.time() + 101) == 1
    assert stores.sequences.lookup(["r1:0"]) == {}
