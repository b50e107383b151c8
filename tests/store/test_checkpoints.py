"""Checkpoint records and directories: atomic commit, conflicts, overwrite, TTL, paths relative
to the data dir (another spelling, a copy, a move, rows of older versions), quarantine of
unknown directories, deletes confined to the root, storage failures, per-tenant totals."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from loraplex.domain.ids import TinkerPath
from loraplex.errors import ConflictError, NotFoundError, StorageError
from loraplex.store.checkpoints import SCHEMA, CheckpointStore
from loraplex.store.db import Database
from tests.store.fs_faults import read_only

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


def saved(store: CheckpointStore, path: TinkerPath = PATH, tenant: str = "alice",
          content: str = "x") -> str:
    """Save and commit ``path``; returns its directory."""
    pending = store.allocate(path, tenant, ttl_seconds=None, overwrite=False)
    write(pending.directory, content)
    return store.commit(pending).directory


def open_store(data: Path | str) -> CheckpointStore:
    """The checkpoint store of a data dir, as `open_stores` lays it out."""
    os.makedirs(data, exist_ok=True)
    return CheckpointStore(Database(os.path.join(data, "db.sqlite3"), [SCHEMA]),
                           os.path.join(data, "ckpt"), os.path.join(data, "quarantine"))


def stored_directories(data: Path) -> list[str]:
    rows = sqlite3.connect(data / "db.sqlite3").execute("SELECT directory FROM checkpoints")
    return [r[0] for r in rows]


def test_rows_name_directories_relative_to_the_checkpoints_root(tmp_path: Path) -> None:
    directory = saved(open_store(tmp_path))
    [stored] = stored_directories(tmp_path)
    assert stored == os.path.relpath(directory, tmp_path / "ckpt")
    assert stored.startswith("s:train:0/weights/c1.") and not os.path.isabs(stored)


def test_another_spelling_of_the_data_dir_finds_the_same_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    directory = saved(open_store("./d"))
    (tmp_path / "link").symlink_to(tmp_path / "d")
    for spelling in (str(tmp_path / "d"), "link", "d/../d"):
        again = open_store(spelling)
        assert again.quarantine_unknown() == []
        record = again.get_owned(PATH, "alice")
        assert os.path.isabs(record.directory)
        assert os.path.realpath(record.directory) == os.path.realpath(directory)
    assert os.listdir(os.path.dirname(directory)) == [os.path.basename(directory)]


def test_a_copied_data_dir_uses_and_deletes_only_its_own_files(tmp_path: Path) -> None:
    original = saved(open_store(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)
    copy = open_store(tmp_path / "b")
    record = copy.get_owned(PATH, "alice")
    assert record.directory.startswith(str(tmp_path / "b" / "ckpt") + os.sep)
    copy.delete(record)
    assert not os.path.exists(record.directory) and os.path.isdir(original)


def test_a_moved_data_dir_finds_its_checkpoints(tmp_path: Path) -> None:
    saved(open_store(tmp_path / "a"))
    os.rename(tmp_path / "a", tmp_path / "moved")
    moved = open_store(tmp_path / "moved")
    assert moved.quarantine_unknown() == []
    assert os.path.isdir(moved.get_owned(PATH, "alice").directory)


def _as_older_version(data: Path, spelled: str) -> None:
    """Rewrite the rows the way older versions stored them: the path as spelled then."""
    conn = sqlite3.connect(data / "db.sqlite3")
    for (rel,) in conn.execute("SELECT directory FROM checkpoints").fetchall():
        conn.execute("UPDATE checkpoints SET directory = ? WHERE directory = ?",
                     (os.path.join(spelled, "ckpt", rel), rel))
    conn.commit()
    conn.close()


def test_rows_of_older_versions_are_migrated_to_relative_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = saved(open_store(tmp_path / "d"))
    saved(open_store(tmp_path / "d"), TinkerPath("s:train:0", "sampler_weights", "s1"))
    monkeypatch.chdir(tmp_path)
    _as_older_version(tmp_path / "d", "./d")  # started as --data-dir ./d
    again = open_store(str(tmp_path / "d"))  # now started as $PWD/d
    assert all(not os.path.isabs(d) and d.startswith("s:train:0/")
               for d in stored_directories(tmp_path / "d"))
    assert again.quarantine_unknown() == []
    assert again.get_owned(PATH, "alice").directory == directory


def test_older_rows_naming_another_data_dir_resolve_inside_this_one(tmp_path: Path) -> None:
    original = saved(open_store(tmp_path / "a"))
    _as_older_version(tmp_path / "a", str(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)  # its rows name a/
    copy = open_store(tmp_path / "b")
    record = copy.get_owned(PATH, "alice")
    assert record.directory == str(tmp_path / "b" / "ckpt" / os.path.relpath(
        original, tmp_path / "a" / "ckpt"))
    assert copy.quarantine_unknown() == []
    copy.delete(record)
    assert os.path.isdir(original), "the original data dir was not touched"


def test_unknown_directories_are_quarantined_not_deleted(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    kept = saved(store)
    crashed = store.allocate(TinkerPath("s:train:0", "weights", "c2"), "alice",
                             ttl_seconds=None, overwrite=False)
    write(crashed.directory)  # the server died before commit
    partial = os.path.join(os.path.dirname(kept), ".c3.abc.tmp")  # died mid-write
    write(partial)
    name = os.path.relpath(crashed.directory, store.root)
    assert store.quarantine_unknown() == sorted([name, "s:train:0/weights/.c3.abc.tmp"])
    assert os.path.exists(kept) and not os.path.exists(crashed.directory)
    [folder] = os.listdir(tmp_path / "quarantine")
    assert os.path.isfile(tmp_path / "quarantine" / folder / name / "adapter_model.safetensors")
    assert store.quarantine_unknown() == []


def test_delete_never_removes_a_directory_outside_the_root(tmp_path: Path) -> None:
    store = open_store(tmp_path / "d")
    directory = saved(store)
    outside = tmp_path / "elsewhere"
    write(str(outside))
    shutil.rmtree(directory)
    os.symlink(outside, directory)  # a checkpoint directory that leads out of the root
    store.delete(store.get_owned(PATH, "alice"))
    assert not os.path.lexists(directory) and (outside / "adapter_model.safetensors").exists()
    saved(store)
    conn = sqlite3.connect(tmp_path / "d" / "db.sqlite3")
    conn.execute("UPDATE checkpoints SET directory = '../../elsewhere'")
    conn.commit()
    store.delete(store.get_owned(PATH, "alice"))
    assert (outside / "adapter_model.safetensors").exists()


def test_a_read_only_checkpoints_dir_fails_the_save_and_frees_the_name(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with read_only(tmp_path / "ckpt"), pytest.raises(
            StorageError, match=r"^storage read-only: the data dir.s checkpoints") as raised:
        store.allocate(PATH, "alice", ttl_seconds=None, overwrite=False)
    assert str(tmp_path) not in raised.value.message
    saved(store)  # not "a save of … is already in progress"


def test_tenant_totals_count_committed_checkpoints_only(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    saved(store, content="abc")
    saved(store, TinkerPath("s:train:0", "sampler_weights", "s1"), content="defgh")
    saved(store, TinkerPath("s:train:1", "weights", "c1"), tenant="bob", content="z")
    store.allocate(TinkerPath("s:train:0", "weights", "pending"), "alice", ttl_seconds=None,
                   overwrite=False)
    assert (store.bytes_for_tenant("alice"), store.count_for_tenant("alice")) == (8, 2)
    assert (store.bytes_for_tenant("bob"), store.count_for_tenant("bob")) == (1, 1)
    assert (store.bytes_for_tenant("carol"), store.count_for_tenant("carol")) == (0, 0)
