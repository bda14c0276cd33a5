"""Checkpoint files on disk: read only when private to this user, written atomically and privately.

A file is not trusted (docs/guide/security.rst): only a regular file of this user that only it may
write is read, opened without blocking (a FIFO at the path is refused, not waited on), and its
archive must store every part as ``torch.save`` does, uncompressed, so no tensor takes more memory
than the file.  Every file adadamp writes (checkpoints and ``save_params``'s parts) goes to a fresh
``mkstemp`` file (mode 0600, never a fixed name, never through a symbolic link) in the target's
directory, synced and renamed over the target, so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import zipfile
from pathlib import Path

import torch

from ..exceptions import CorruptCheckpointError, UnsafeCheckpointError

FORMAT = 2  #: the checkpoint format this adadamp writes and reads


def corrupt(path, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Refusing the checkpoint {path}: {why}. adadamp writes checkpoints of format {FORMAT} for the estimator "
        "that reads them; this file was changed, written by another program or for another estimator. Delete it, "
        "or pass another checkpoint path, to start afresh."
    )


def open_private(path):
    """``path`` opened for reading if it is a regular file of this user that only it may write.

    Opened with ``O_NONBLOCK`` so that a FIFO planted at the path is refused instead of blocking
    ``open``; the checks are on the file opened (``fstat``), not on what the name points to later.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: it is not a regular file (mode {stat.filemode(info.st_mode)})."
            )
        if info.st_uid != os.geteuid():
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: it belongs to user id {info.st_uid}, not to this user "
                f"({os.geteuid()}). Copy it if you trust it, or pass another checkpoint path."
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: group or others may write it (mode "
                f"{stat.filemode(info.st_mode)}). Check it, then `chmod go-w {path}`."
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_archive(f, path):
    """``torch.load(weights_only=True)`` of a zip archive whose parts are stored as they are (as
    ``torch.save`` writes them), so no tensor's data takes more memory than the file."""
    not_ours = (f"it is not an adadamp checkpoint of format {FORMAT} (it holds something other than tensors and "
                "plain data, or was written by an older adadamp)")
    try:
        with zipfile.ZipFile(f) as archive:
            packed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
        f.seek(0)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise corrupt(path, not_ours) from err
    if packed:
        raise corrupt(path, f"its part {packed[0]} is compressed (torch.save stores every part as it is)")
    try:
        return torch.load(f, weights_only=True)
    except Exception as err:
        raise corrupt(path, f"{not_ours}: {err}") from err


def size_of(f) -> int:
    """The bytes of an open file (what its contents may expand to is bounded by it)."""
    with contextlib.suppress(OSError, AttributeError, ValueError):
        return os.fstat(f.fileno()).st_size
    position = f.tell()
    end = f.seek(0, os.SEEK_END)
    f.seek(position)
    return end


def write_private(path, write) -> None:
    """Call ``write(f)`` on a fresh private temporary file beside ``path``, then rename it over ``path``;
    a file object (not a path) is written as it is."""
    if hasattr(path, "write"):
        write(path)
        return
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
