"""Disk failures as client-safe errors: full (with the free bytes), read-only, damaged; no
server path in any message. The OSErrors and SQLite errors here are real ones: /dev/full,
an immutable or read-only directory, SQLite's own page limit and query-only mode, a full tmpfs
(Python, safetensors and SQLite writes), a read-only mount."""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.errors import ServerError, StorageError
from loraplex.store.db import Database
from loraplex.store.disk import storage_error
from tests.store.fs_faults import on_read_only_mount, on_small_disk, read_only

REPO = Path(__file__).resolve().parents[2]


def _raised(call: object) -> OSError:
    try:
        call()  # type: ignore[operator]
    except OSError as exc:
        return exc
    raise AssertionError("no OSError")


def _write_dev_full() -> None:
    with open("/dev/full", "w") as f:
        f.write("x")
        f.flush()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_storage_full_naming_the_free_bytes(tmp_path: Path) -> None:
    exc = _raised(_write_dev_full)
    assert exc.errno == errno.ENOSPC
    error = storage_error(exc, str(tmp_path))
    assert isinstance(error, StorageError) and error.category == "server"
    found = re.fullmatch(r"storage full: (\d+) bytes free under the data dir", error.message)
    assert found is not None and int(found[1]) > 0, error.message  # tmp_path's own free space


def test_quota_and_file_size_limits_are_storage_full(tmp_path: Path) -> None:
    for code, detail in ((errno.EDQUOT, "quota"), (errno.EFBIG, "size limit")):
        error = storage_error(OSError(code, os.strerror(code), str(tmp_path / "f")),
                              str(tmp_path))
        assert isinstance(error, StorageError) and "storage full" in error.message
        assert detail in error.message and str(tmp_path) not in error.message


def test_an_unwritable_directory_is_storage_read_only(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    with read_only(target):
        exc = _raised(lambda: os.mkdir(target / "run"))
    assert exc.errno in (errno.EACCES, errno.EPERM)
    error = storage_error(exc, str(tmp_path), "checkpoints")
    assert isinstance(error, StorageError)
    assert error.message.startswith("storage read-only: the data dir's checkpoints")
    assert str(tmp_path) not in error.message


def test_other_os_errors_are_logged_server_bugs_without_paths(tmp_path: Path) -> None:
    exc = _raised(lambda: os.rmdir(tmp_path / "missing"))
    error = storage_error(exc, str(tmp_path))
    assert isinstance(error, ServerError) and "error id" in error.message
    assert str(tmp_path) not in error.message


def test_sqlite_reporting_a_full_disk_is_storage_full(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db.sqlite3"), ["CREATE TABLE t (x TEXT)"])
    pages = db.query_one("PRAGMA page_count")
    db.execute(f"PRAGMA max_page_count = {pages[0] + 1}")  # SQLite's own SQLITE_FULL
    with pytest.raises(StorageError, match=r"^storage full: \d+ bytes free under the data dir"):
        for _ in range(100):
            db.execute("INSERT INTO t VALUES (?)", ("x" * 4000,))
    with pytest.raises(StorageError, match="storage full"), db.transaction() as conn:
        conn.execute("INSERT INTO t VALUES (?)", ("x" * 40_000,))
    assert db.query_one("SELECT COUNT(*) FROM t") is not None  # still usable after a rollback


def test_sqlite_refusing_a_write_is_storage_read_only(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db.sqlite3"), ["CREATE TABLE t (x TEXT)"])
    db.execute("PRAGMA query_only = 1")  # SQLite's own SQLITE_READONLY
    with pytest.raises(StorageError, match=r"^storage read-only: the data dir's database"):
        db.execute("INSERT INTO t VALUES ('x')")


def test_other_sqlite_errors_keep_their_type(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db.sqlite3"), ["CREATE TABLE t (x TEXT PRIMARY KEY)"])
    db.execute("INSERT INTO t VALUES ('a')")
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO t VALUES ('a')")
    with pytest.raises(sqlite3.OperationalError, match="syntax"):
        db.query("SELEC 1")


def test_a_damaged_database_file_is_storage_corrupt(tmp_path: Path) -> None:
    (tmp_path / "db.sqlite3").write_bytes(b"not a database at all, just text" * 100)
    with pytest.raises(StorageError, match=r"^storage corrupt: the data dir's database"):
        Database(str(tmp_path / "db.sqlite3"), ["CREATE TABLE t (x TEXT)"])


# A child process on a small tmpfs: fill it, then report what the stores raise (JSON lines).
_FULL_DISK_SCRIPT = r"""
import json, os, sys
from loraplex.domain.ids import TinkerPath
from loraplex.errors import LoraplexError
from loraplex.store.stores import open_stores
data = sys.argv[1]
stores = open_stores(data)
path = TinkerPath("s:train:0", "weights", "c1")
pending = stores.checkpoints.allocate(path, "alice", ttl_seconds=None, overwrite=False)
os.makedirs(pending.directory)
with open(os.path.join(data, "filler"), "wb") as f:  # take every free block
    try:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    except OSError:
        pass
def write():
    with open(os.path.join(pending.directory, "w"), "wb") as f:
        f.write(b"x" * 65536)

def safetensors():  # what the engine writes a checkpoint with
    import torch
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(65536)}, os.path.join(pending.directory, "a.safetensors"))

errors = {}
for what, call in (("write", write), ("safetensors", safetensors),
                   ("commit", lambda: stores.checkpoints.commit(pending))):
    try:
        call()
        errors[what] = None
    except LoraplexError as exc:
        errors[what] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        errors[what] = str(stores.checkpoints.storage_error(exc))
print(json.dumps(errors))
"""


def test_a_real_full_disk_fails_writes_with_storage_full(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    command = on_small_disk(data, 512, [sys.executable, "-c", _FULL_DISK_SCRIPT, str(data)])
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert errors["write"].startswith("storage full: 0 bytes free under the data dir")
    assert errors["safetensors"].startswith("storage full: 0 bytes free under the data dir")
    assert errors["commit"].startswith("StorageError: storage full: 0 bytes free"), errors
    assert str(data) not in done.stdout


def test_a_read_only_mount_fails_opening_the_stores_with_storage_read_only(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    script = ("import sys\nfrom loraplex.errors import StorageError\n"
              "from loraplex.store.stores import open_stores\n"
              "try:\n    open_stores(sys.argv[1])\nexcept StorageError as e:\n    print(e)\n")
    command = on_read_only_mount(data, [sys.executable, "-c", script, str(data)])
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("storage read-only: the data dir's database"), done.stdout
