"""Checkpoint records and directories: atomic commit, conflicts, overwrite, TTL, orphans."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from loraplex.domain.ids import TinkerPath
from loraplex.errors import ConflictError, NotFoundError
from loraplex.store.checkpoints import SCHEMA, CheckpointStore
from loraplex.store.db import Database

PATH = TinkerPath("s:train:0", "weights", "c1")


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(Database(str(tmp_path / "db.sqlite3"), [SCHEMA]),
                           str(tmp_path / "ckpt"))


def write(directory: str, content: str = "x") -> None:
    """What an executor does: create the directory and its files."""
    os.makedirs(directory)
    with open(os.path.join(directory, "adapter_model.safetensors"), "w") as f:
        f.write(content)


def test_nothing_is_listed_until_commit(store: CheckpointStore) -> None:
    pending = store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    assert not os.path.exists(pending.directory), "the executor creates it"
    write(pending.directory, "abc")
    assert store.find(PATH) is None
    record = store.commit(pending)
    assert record.size_bytes == 3 and record.tenant == "alice" and record.expires_at is None
    assert store.list_for_run("s:train:0") == [record]


def test_same_name_conflicts_unless_overwrite(store: CheckpointStore) -> None:
    first = store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    with pytest.raises(ConflictError, match="in progress"):
        store.allocate(PATH, "alice", ttl_seconds=None, overwrite=True)
    write(first.directory)
    store.commit(first)
    with pytest.raises(ConflictError, match="overwrite"):
        store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    second = store.allocate(PATH, "alice", ttl_seconds=None, overwrite=True)
    write(second.directory, "newer")
    store.commit(second)
    assert not os.path.exists(first.directory), "the replaced version's files are gone"
    assert store.get_owned(PATH, "alice").directory == second.directory


def test_abort_removes_partial_files_and_frees_the_name(store: CheckpointStore) -> None:
    pending = store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    write(pending.directory)
    store.abort(pending)
    assert not os.path.exists(pending.directory)
    store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)


def test_expired_checkpoints_lose_their_files(store: CheckpointStore) -> None:
    pending = store.allocate(PATH, "alice", ttl_seconds=60, overwrite=False)
    write(pending.directory)
    record = store.commit(pending)
    assert record.expires_at is not None and record.expires_at > time.time()
    assert store.expire(time.time()) == []
    assert store.expire(time.time() + 61) == [PATH]
    assert store.find(PATH) is None and not os.path.exists(pending.directory)


def test_visibility_owner_or_published(store: CheckpointStore) -> None:
    pending = store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    write(pending.directory)
    record = store.commit(pending)
    with pytest.raises(NotFoundError):
        store.get_readable(PATH, "bob")
    store.set_public(record, True)
    assert store.get_readable(PATH, "bob").public
    with pytest.raises(NotFoundError):
        store.get_owned(PATH, "bob")


def test_orphan_directories_of_interrupted_saves_are_removed(store: CheckpointStore) -> None:
    kept = store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    write(kept.directory)
    store.commit(kept)
    crashed = store.allocate(TinkerPath("s:train:0", "weights", "c2"), "alice",
                             ttl_seconds=None, overwrite=False)
    write(crashed.directory)  # the server died before commit
    assert store.remove_orphans() == [crashed.directory]
    assert os.path.exists(kept.directory)
