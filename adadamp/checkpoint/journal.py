"""A fit's history beside its checkpoint file, appended an epoch at a time.

A checkpoint holding the whole history would grow with the fit (measured with
``checkpoint_every=20`` on a 150-epoch fit: the epoch time rose from 0.76 s to 8.75 s by epoch 26,
3.1 MB a write at epoch 70).  So the fit loop's checkpoints keep the finished epochs' rows in ``<checkpoint>.history`` (JSON
lines, private as the checkpoint), appended once per epoch, and name how many rows they cover and
the rows' digest: a write costs the same at any length, and a resumed fit reads the rows once.
Rows past the count (an epoch whose checkpoint was never written) are dropped when the fit goes on.
The file is read through the checkpoint's guards (:mod:`~adadamp.checkpoint.files`), and a file
that is not the rows the checkpoint names is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from .checks import check_records
from .files import UnsafeCheckpointError, corrupt, open_private, write_private

SUFFIX = ".history"


def journal_path(checkpoint) -> Path:
    """Where the rows of the checkpoint at ``checkpoint`` are kept."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + SUFFIX)


def _line(row: dict) -> bytes:
    """One row as a JSON line (arrays and tensors as lists; floats exactly, NaN included)."""
    return json.dumps(row, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)).encode() + b"\n"


class Journal:
    """The history rows of the checkpoint at ``checkpoint``: those :meth:`take` counted, on disk once
    :meth:`write` wrote them."""

    def __init__(self, checkpoint, history: list[dict]):
        self.path = journal_path(checkpoint)
        self.rows = 0
        self.digest = hashlib.blake2b(digest_size=16)
        data = self.take(history)
        write_private(self.path, lambda f: f.write(data))  # drops rows no checkpoint counts

    def take(self, history: list[dict]) -> bytes:
        """The rows of ``history`` past those taken, as the bytes :meth:`write` appends; counted (and
        in :meth:`reference`) from now."""
        lines = [_line(r) for r in history[self.rows:]]
        for line in lines:
            self.digest.update(line)
        self.rows += len(lines)
        return b"".join(lines)

    def write(self, data: bytes) -> None:
        """Append ``data`` (from :meth:`take`), synced, to the end of the file."""
        if not data:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
                raise UnsafeCheckpointError(f"Refusing to append to {self.path}: it is no longer a private file of "
                                            "this user (it was replaced while the fit ran).")
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def reference(self) -> dict:
        """What a checkpoint names of its rows: the file, how many, and their digest."""
        return {"file": self.path.name, "rows": self.rows, "digest": self.digest.hexdigest()}


def read(checkpoint, reference) -> list[dict]:
    """The rows a checkpoint's ``reference`` names, from the file beside it."""
    if not (isinstance(reference, dict) and reference.keys() == {"file", "rows", "digest"}
            and reference["file"] == journal_path(checkpoint).name and type(reference["rows"]) is int
            and reference["rows"] >= 0 and isinstance(reference["digest"], str)):
        raise corrupt(checkpoint, "its history is neither a list of records nor the rows of its history file")
    path = journal_path(checkpoint)
    try:
        f = open_private(path)
    except FileNotFoundError as err:
        raise corrupt(checkpoint, f"its history file {path} is missing (copy it with the checkpoint)") from err
    with f:
        lines = f.read().splitlines(keepends=True)[: reference["rows"]]
    digest = hashlib.blake2b(digest_size=16)
    for line in lines:
        digest.update(line)
    if len(lines) != reference["rows"] or digest.hexdigest() != reference["digest"]:
        raise corrupt(checkpoint, f"its history file {path} does not hold the {reference['rows']} rows it was "
                                  "written with")
    try:
        rows = [json.loads(line) for line in lines]
    except ValueError as err:
        raise corrupt(checkpoint, f"its history file {path} is not JSON lines ({err})") from err
    check_records(rows, checkpoint, "history")
    return rows
