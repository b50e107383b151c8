"""Tar archives of checkpoints for SDK 0.27's ``get_checkpoint_archive_url``.

The archive holds the PEFT adapter files (``adapter_config.json``, ``adapter_model.*``; every
file when the checkpoint has none) plus the empty marker ``checkpoint_complete`` that
``tinker checkpoint push-hf`` requires. Archives are built once into a cache directory,
atomically, and reused until the cache is swept.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
COMPLETE_MARKER = "checkpoint_complete"


def archive_members(directory: str) -> list[str]:
    """Relative paths of the files an archive of ``directory`` contains (marker excluded)."""
    files = sorted(
        os.path.relpath(os.path.join(base, name), directory)
        for base, _, names in os.walk(directory) for name in names
    )
    peft = [f for f in files if f in PEFT_FILES]
    return peft or files


def build_archive(directory: str, cache_dir: str) -> str:
    """Path of a tar of ``directory`` (built on first use; keyed by the directory path)."""
    os.makedirs(cache_dir, exist_ok=True)
    key = hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()[:32]
    target = os.path.join(cache_dir, f"{key}.tar")
    if os.path.exists(target):
        return target
    tmp = f"{target}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    with tarfile.open(tmp, "w") as tar:
        for rel in archive_members(directory):
            tar.add(os.path.join(directory, rel), arcname=rel, recursive=False)
        marker = tarfile.TarInfo(COMPLETE_MARKER)
        marker.size = 0
        marker.mtime = int(time.time())
        tar.addfile(marker, io.BytesIO(b""))
    os.replace(tmp, target)
    return target


def sweep_archives(cache_dir: str, older_than: float) -> int:
    """Remove cached archives last modified before ``older_than`` (epoch seconds)."""
    if not os.path.isdir(cache_dir):
        return 0
    removed = 0
    for name in os.listdir(cache_dir):
        path = os.path.join(cache_dir, name)
        if os.path.getmtime(path) < older_than:
            os.remove(path)
            removed += 1
    return removed
