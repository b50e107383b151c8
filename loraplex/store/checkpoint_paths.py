"""Where checkpoint directories live, how the database names them, and what may be removed.

Layout: ``<data_dir>/checkpoints/<run_id>/<kind>/<name>.<version>``. The database keeps only the
part below the checkpoints root (``<run_id>/<kind>/<name>.<version>``), so a data dir named by
another spelling (``./d``, ``$PWD/d``, a symlink), copied or moved still finds its own files.
Older versions stored the whole path as spelled on the command line; `relative_of_old_row` maps
such a row onto the root at hand by the same layout, never onto the tree it used to name.
Nothing outside the root is ever removed (`remove_tree`), compared as real paths.
"""

from __future__ import annotations

import logging
import os
import shutil

from loraplex.domain.ids import TinkerPath

log = logging.getLogger("loraplex.store")


def relative_directory(path: TinkerPath, version: str) -> str:
    """The database's name of one version of a checkpoint's directory."""
    return os.path.join(path.run_id, path.kind, f"{path.name}.{version}")


def is_relative_row(directory: str, path: TinkerPath) -> bool:
    """Whether a stored directory is in this layout (else a row of an older version)."""
    parts = directory.split("/")
    return (len(parts) == 3 and parts[0] == path.run_id and parts[1] == path.kind
            and parts[2].startswith(f"{path.name}."))


def relative_of_old_row(directory: str, path: TinkerPath) -> str:
    """The layout name of a directory an older version stored as a whole path (absolute, or
    relative to that server's working directory). A copied or moved data dir's database still
    names the original tree: the same layout under the new root is where the copy's files are.
    """
    return os.path.join(path.run_id, path.kind, os.path.basename(os.path.normpath(directory)))


def is_inside(root: str, directory: str) -> bool:
    """Whether ``directory`` really lies strictly below ``root`` (both compared as real paths,
    so neither a symlink nor ``..`` can lead outside)."""
    real_root, real = os.path.realpath(root), os.path.realpath(directory)
    return real != real_root and os.path.commonpath([real_root, real]) == real_root


def remove_tree(root: str, directory: str) -> bool:
    """Delete a checkpoint directory if it lies under ``root``; returns whether it did.

    A symlink placed under the root is unlinked, never followed; a directory that resolves
    outside the root (another data dir's files) is left alone and logged.
    """
    if os.path.islink(directory) and is_inside(root, os.path.dirname(directory)):
        os.unlink(directory)
        return True
    if not is_inside(root, directory):
        if os.path.lexists(directory):
            log.warning("not deleting %s: it is outside the checkpoints directory %s",
                        directory, root)
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return True


def directories_on_disk(root: str) -> list[str]:
    """Every ``<run_id>/<kind>/<entry>`` directory under ``root`` (committed, interrupted and
    temporary ones alike), as layout names."""
    found = []
    for run_id in _subdirs(root):
        for kind in _subdirs(os.path.join(root, run_id)):
            for name in _subdirs(os.path.join(root, run_id, kind)):
                found.append(os.path.join(run_id, kind, name))
    return sorted(found)


def _subdirs(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return [d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d))]
