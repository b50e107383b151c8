"""Filesystem and SQLite failures under the data dir as loraplex errors.

A full disk or quota becomes ``StorageError("storage full: N bytes free under the data dir")``,
a read-only or unwritable directory ``StorageError("storage read-only: …")``, a damaged database
``StorageError("storage corrupt: …")``; anything else is a logged server bug. Messages reach
clients, so they name the part of the data dir (``checkpoints``, ``database``), never a server
path; the absolute path stays in the server's log.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sqlite3

from loraplex.errors import LoraplexError, StorageError, server_bug

log = logging.getLogger("loraplex.store")

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""No room: the filesystem, the user's quota, or the file size limit (RLIMIT_FSIZE)."""

READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""Not writable: a read-only mount, missing permissions, or an immutable directory."""

# SQLite primary result codes (the low byte of an extended code), as sqlite3.h numbers them.
SQLITE_READONLY, SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL = 8, 10, 11, 13
SQLITE_CANTOPEN, SQLITE_NOTADB = 14, 26


def free_bytes(root: str) -> int | None:
    """Bytes available to this process on the filesystem holding ``root`` (None: unknown)."""
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def storage_full(root: str, detail: str = "") -> StorageError:
    free = free_bytes(root)
    room = "free space unknown" if free is None else f"{free} bytes free"
    return StorageError(f"storage full: {room} under the data dir{detail}")


def storage_error(exc: BaseException, root: str, what: str = "data dir") -> LoraplexError:
    """The client-safe error of a failed filesystem write under the data dir.

    Args:
        exc: what the write raised: an OSError, or a library error carrying one (safetensors
            raises ``SafetensorError("… I/O error: No space left on device (os error 28)")``).
        root: a directory on the same filesystem (for the free-space figure).
        what: the part of the data dir that was being written, as a client may read it
            (``"checkpoints"``), never an absolute path.

    Returns:
        `StorageError` for a full disk or quota (with the free bytes) and for a read-only or
        unwritable directory; otherwise the `ServerError` of `server_bug` (logged with its
        traceback under an error id).
    """
    code = os_errno(exc)
    if code in FULL_ERRNOS | READ_ONLY_ERRNOS:
        log.warning("cannot write the data dir's %s: %s", what, exc)  # the path, for operators
    if code in FULL_ERRNOS:
        detail = {errno.EDQUOT: " (disk quota exceeded)",
                  errno.EFBIG: " (file size limit reached)"}.get(code, "")
        return storage_full(root, detail)
    if code in READ_ONLY_ERRNOS:
        return StorageError(f"storage read-only: the data dir's {what} cannot be written "
                            f"({os.strerror(code).lower()})")
    return server_bug(exc, f"writing the data dir's {what}")


def os_errno(exc: BaseException) -> int | None:
    """The errno behind ``exc``: its own, one in its text as Rust formats I/O errors
    (``(os error 28)``), or that of the exception it was raised from."""
    seen: BaseException | None = exc
    for _ in range(4):  # a short cause chain; never loop on a cyclic one
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        found = _RUST_OS_ERROR.search(str(seen))
        if found:
            return int(found[1])
        seen = seen.__cause__ or seen.__context__
    return None


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def sqlite_storage_error(exc: sqlite3.Error, root: str) -> StorageError | None:
    """The `StorageError` of a SQLite failure caused by the disk, or None for any other (a bug
    in a statement, a constraint: those keep their own type and traceback)."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    if primary == SQLITE_FULL:
        return storage_full(root)
    if primary == SQLITE_READONLY:
        return StorageError("storage read-only: the data dir's database cannot be written "
                            "(read-only file system or missing permissions)")
    if primary == SQLITE_CANTOPEN:
        return StorageError("storage read-only: the data dir's database cannot be opened "
                            "(read-only file system, missing permissions or no such directory)")
    if primary == SQLITE_IOERR:
        free = free_bytes(root)
        return StorageError(f"storage I/O error writing the data dir's database "
                            f"({'free space unknown' if free is None else f'{free} bytes free'})")
    if primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return StorageError("storage corrupt: the data dir's database file is damaged or not "
                            "a loraplex database; restore it from a backup")
    return None
