"""Real filesystem faults for tests: a read-only directory, a read-only mount, a full disk.

A normal user makes a directory read-only with its mode bits. Root ignores those, so as root the
directory gets the immutable attribute instead (``chattr +i``: creating an entry in it fails with
EPERM). A read-only mount (EROFS) and a small full disk (a tmpfs: ENOSPC) are made in a private
mount namespace (``unshare -m``, root only) around one subprocess, so nothing outside that
process ever sees them. Each helper skips the test where the machine cannot make the fault.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` refuses new entries inside the block (mode bits, or ``chattr +i``)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("as root, a read-only directory needs chattr +i (not supported here)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@functools.cache
def can_mount_privately() -> bool:
    """Root with ``unshare -m`` and mount permission (a container may have neither)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=4k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


def on_small_disk(directory: Path, size_kib: int, argv: Sequence[str]) -> list[str]:
    """A command running ``argv`` with ``directory`` on a fresh tmpfs of ``size_kib`` KiB
    (empty at the start; gone when the command exits)."""
    if not can_mount_privately():
        pytest.skip("a full disk needs root and unshare -m (a private tmpfs)")
    script = 'mount -t tmpfs -o size="$1"k tmpfs "$2" && shift 2 && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
            str(size_kib), str(directory), *argv]


def on_read_only_mount(directory: Path, argv: Sequence[str]) -> list[str]:
    """A command running ``argv`` with ``directory`` bind-mounted read-only (EROFS)."""
    if not can_mount_privately():
        pytest.skip("a read-only mount needs root and unshare -m")
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift '
              '&& exec "$@"')
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
            str(directory), *argv]
