"""Keys, sessions, runs and recorded sequences, and their survival across a reopen; a data dir
whose database is lost beside its checkpoints, or that cannot be written, refuses to open."""

from __future__ import annotations

import os
import sqlite3
import time
from array import array
from pathlib import Path

import pytest

from loraplex.domain.ids import TinkerPath
from loraplex.domain.lora import LoraConfig
from loraplex.domain.training_run import TrainingRun
from loraplex.errors import AuthError, NotFoundError, StorageError, UserError
from loraplex.store.stores import open_stores
from tests.store.fs_faults import read_only


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


def _data_dir_with_a_checkpoint(data: Path) -> Path:
    stores = open_stores(str(data))
    run_id = "s:train:0"
    stores.runs.insert(TrainingRun(run_id, "alice", "s", "Qwen/Qwen3-8B", LoraConfig(8),
                                   {"type": "adamw"}, {}))
    pending = stores.checkpoints.allocate(TinkerPath(run_id, "weights", "c1"), "alice",
                                          ttl_seconds=None, overwrite=False)
    os.makedirs(pending.directory)
    stores.checkpoints.commit(pending)
    stores.close()
    return Path(pending.directory)


def test_a_lost_database_beside_checkpoints_refuses_to_open(tmp_path: Path) -> None:
    directory = _data_dir_with_a_checkpoint(tmp_path)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"loraplex.sqlite3{suffix}").unlink(missing_ok=True)
    with pytest.raises(StorageError, match=r"refusing to start: .* holds 1 checkpoint "
                       r"directories but its database loraplex.sqlite3 is missing") as raised:
        open_stores(str(tmp_path))
    assert "restore loraplex.sqlite3" in raised.value.message
    assert "move the checkpoints directory aside" in raised.value.message
    assert not (tmp_path / "loraplex.sqlite3").exists(), "nothing was created"
    assert directory.is_dir()


def test_an_empty_database_beside_checkpoints_refuses_to_open(tmp_path: Path) -> None:
    directory = _data_dir_with_a_checkpoint(tmp_path)
    conn = sqlite3.connect(tmp_path / "loraplex.sqlite3")
    conn.execute("DELETE FROM checkpoints")
    conn.execute("DELETE FROM training_runs")
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="has no training runs or checkpoints"):
        open_stores(str(tmp_path))
    assert directory.is_dir()


def test_a_fresh_or_used_data_dir_opens(tmp_path: Path) -> None:
    open_stores(str(tmp_path / "fresh")).close()
    _data_dir_with_a_checkpoint(tmp_path / "used")
    again = open_stores(str(tmp_path / "used"))
    assert again.checkpoints.count_for_tenant("alice") == 1
    again.close()


def test_a_read_only_data_dir_fails_to_open_with_storage_read_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with read_only(data), pytest.raises(StorageError, match=r"^storage read-only: ") as raised:
        open_stores(str(data))
    assert str(tmp_path) not in raised.value.message
