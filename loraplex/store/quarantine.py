"""The quarantine folder: where startup moves checkpoint directories no record names.

Such a directory is a save interrupted before its commit (the engine's ``.<name>.*.tmp`` or a
finished write whose commit never ran), or files the database does not know (restored from
elsewhere, a database restored from an older backup). Startup never deletes them: each moves,
keeping its layout name, to ``<data_dir>/quarantine/<UTC time>-<random>/<run_id>/<kind>/<entry>``
(a rename on the same filesystem), and is logged. An operator may inspect or delete them.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence

log = logging.getLogger("loraplex.store")


def quarantine(root: str, names: Sequence[str], quarantine_dir: str) -> list[str]:
    """Move the layout names ``names`` from under ``root`` into one new folder of
    ``quarantine_dir``; returns those moved (one that cannot be moved stays, logged)."""
    if not names:
        return []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    try:
        os.makedirs(quarantine_dir, exist_ok=True)
        target_root = tempfile.mkdtemp(prefix=f"{stamp}-", dir=quarantine_dir)
    except OSError as exc:
        log.warning("cannot create the quarantine folder (%s); leaving %d unknown checkpoint "
                    "directories in place: %s", exc, len(names), ", ".join(names))
        return []
    moved = []
    for name in names:
        target = os.path.join(target_root, name)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(os.path.join(root, name), target)
        except OSError as exc:
            log.warning("could not quarantine checkpoint directory %s (left in place): %s",
                        name, exc)
            continue
        moved.append(name)
    if moved:
        log.warning("moved %d checkpoint directories no record names (interrupted saves or "
                    "unknown files) to %s: %s", len(moved), target_root, ", ".join(moved))
    return moved
