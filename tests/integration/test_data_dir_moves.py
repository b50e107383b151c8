"""The data dir under another spelling, copied or moved: the server keeps listing and loading
every checkpoint from its own files and deletes nothing at startup; a lost database or a
read-only data dir stops `loraplex serve` with one clear line, changing nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tinker

from loraplex.config import DEFAULT_MODEL_NAME as MODEL
from tests.api.live_server import free_port
from tests.api.test_training import ADAM, DATA, logprobs
from tests.integration.conftest import EXECUTOR, REPO, SERVER_THREADS, ServerProcess
from tests.integration.serve_fake import seed_builtin_tiny
from tests.store.fs_faults import read_only

KEY = "tml-data-dir-owner"


def _server(data_dir: Path) -> ServerProcess:
    threads = ("--threads", SERVER_THREADS) if SERVER_THREADS else ()
    return ServerProcess(data_dir, "--open", "--executor", EXECUTOR, *threads)


def _train_and_save(server: ServerProcess, names: list[str]) -> dict[str, list[np.ndarray]]:
    """One step, then a save_state per name; returns each state's forward logprobs."""
    client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    saved = {}
    for name in names:
        tc.forward_backward(DATA, "cross_entropy")
        tc.optim_step(ADAM).result()
        path = tc.save_state(name).result().path
        saved[path] = logprobs(tc.forward(DATA, "cross_entropy").result())
    client.close("success").result()
    return saved


def _check_listed_and_loadable(server: ServerProcess, saved: dict[str, list[np.ndarray]]
                               ) -> None:
    client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    listed = {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints}
    assert set(saved) <= listed
    for path, expected in saved.items():
        tc = client.create_training_client_from_state_with_optimizer(path).result()
        for a, b in zip(logprobs(tc.forward(DATA, "cross_entropy").result()), expected,
                        strict=True):
            np.testing.assert_array_equal(a, b)
    client.close("success").result()


def _checkpoint_dirs(data_dir: Path) -> set[str]:
    root = data_dir / "checkpoints"
    return {str(p.relative_to(root)) for p in root.glob("*/*/*")}


@pytest.mark.slow
def test_another_spelling_of_the_data_dir_lists_and_loads_every_checkpoint(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "data"
    seed_builtin_tiny(data, tiny_model_dir)
    server = _server(Path(os.path.relpath(data, REPO))).start()  # ./-style, from the repo
    try:
        saved = _train_and_save(server, ["c1", "c2"])
        server.stop()
        before = _checkpoint_dirs(data)
        (tmp_path / "link").symlink_to(data)
        for spelling in (data, tmp_path / "link"):
            server.data_dir = spelling
            server.start()
            _check_listed_and_loadable(server, saved)
            server.stop()
            assert _checkpoint_dirs(data) >= before, "a checkpoint directory went missing"
        assert not (data / "quarantine").exists()
    finally:
        server.stop()


@pytest.mark.slow
def test_a_copied_data_dir_serves_its_own_files_and_a_moved_one_keeps_working(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    data, copy, moved = tmp_path / "data", tmp_path / "copy", tmp_path / "moved"
    seed_builtin_tiny(data, tiny_model_dir)
    server = _server(data).start()
    try:
        saved = _train_and_save(server, ["c1", "c2"])
        server.stop()
        shutil.copytree(data, copy, symlinks=True)  # cp -a
        original = _checkpoint_dirs(data)
        server.data_dir = copy
        server.start()
        _check_listed_and_loadable(server, saved)
        doomed = sorted(saved)[-1]
        rest = tinker.RestClient(base_url=server.url, api_key=KEY)
        rest.delete_checkpoint_from_tinker_path(doomed).result()
        server.stop()
        name = doomed.removeprefix("tinker://").split("/")[-1]
        assert not any(d.split("/")[-1].startswith(f"{name}.") for d in _checkpoint_dirs(copy))
        assert _checkpoint_dirs(data) == original, "deleting in the copy touched the original"

        os.rename(data, moved)
        server.data_dir = moved
        server.start()
        _check_listed_and_loadable(server, saved)
    finally:
        server.stop()


def _serve_once(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`loraplex serve` on ``data_dir``, expected to refuse before it loads any model."""
    command = [sys.executable, "-m", "loraplex", "serve", "--host", "127.0.0.1", "--port",
               str(free_port()), "--data-dir", str(data_dir)]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)


def _data_dir_with_checkpoints(data: Path) -> set[str]:
    from loraplex.domain.ids import TinkerPath
    from loraplex.store.stores import open_stores

    stores = open_stores(str(data))
    for name in ("c1", "c2"):
        pending = stores.checkpoints.allocate(TinkerPath("s:train:0", "weights", name),
                                              "alice", ttl_seconds=None, overwrite=False)
        os.makedirs(pending.directory)
        (Path(pending.directory) / "adapter_model.safetensors").write_bytes(b"x")
        stores.checkpoints.commit(pending)
    stores.close()
    return _checkpoint_dirs(data)


def test_a_lost_database_refuses_to_start_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    before = _data_dir_with_checkpoints(data)
    for name in ("loraplex.sqlite3", "loraplex.sqlite3-wal", "loraplex.sqlite3-shm"):
        (data / name).unlink(missing_ok=True)
    done = _serve_once(data)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith(f"error: refusing to start: the data dir {data} holds 2 checkpoint "
                           "directories but its database loraplex.sqlite3 is missing")
    assert "restore loraplex.sqlite3" in line and "Nothing was changed." in line
    assert _checkpoint_dirs(data) == before and not (data / "loraplex.sqlite3").exists()


def test_a_read_only_data_dir_fails_to_start_with_one_clear_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with read_only(data):
        done = _serve_once(data)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "error: storage read-only: the data dir's database cannot be opened")
