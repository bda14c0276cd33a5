"""Weights and gradients in shared memory, private to the user who trains.

Workers on the client's machine map the client's weight buffer (the optimizer
writes it in place) and write their gradient sum into a buffer of their own,
so an update sends only example indices: no copy of the weights or gradients
crosses a socket.

Other local users are not trusted (docs/guide/security.rst).  Each fit gets one
directory made by ``mkdtemp`` (mode 0700) under the shared-memory directory,
with the owner's process id in its name; every file in it is created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600, and its space is reserved up
front with ``posix_fallocate``, so a /dev/shm too small for the fit (Docker's
default is 64 MiB) is an ``OSError`` at set-up and not a SIGBUS in the
middle of training.  A worker maps a file only if it is a regular file of its
own user, private and of the expected size, and only after reading the fit's
random token from the same directory (which proves same machine, same user).
Whatever goes wrong, the worker falls back to the socket path: shared memory
is a speed-up, never a requirement.

The directory is ``dask.config`` key ``adadamp.shm-dir`` (default
``/dev/shm``; environment variable ``DASK_ADADAMP__SHM_DIR``); ``None`` or an
empty string turns shared memory off.

This module runs on both sides and imports neither the client side nor Dask's
scheduler machinery; what a worker's set-up receives is a :class:`~adadamp.records.ShmOffer`.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import shutil
import stat
import tempfile
import uuid

import numpy as np

from ..records import SharedFile, ShmOffer

logger = logging.getLogger(__name__)

DEFAULT_DIR = "/dev/shm"
_OWNED = re.compile(r"adadamp-(\d+)-")  # a fit directory, with its owner's process id


def create_private_array(path: str, size: int) -> np.ndarray:
    """A new float32 array of ``size`` in a new file at ``path`` (mode 0600, space reserved).

    Raises ``FileExistsError`` if anything is at ``path`` already (a file, a
    symbolic link) and ``OSError`` (ENOSPC) if the file system cannot hold it.
    """
    return _map(path, size, os.O_CREAT | os.O_EXCL)


def open_private_array(path: str, size: int) -> np.ndarray:
    """Map the float32 array of ``size`` that another process of this user created at ``path``.

    Raises ``PermissionError`` unless ``path`` is a regular file (not a
    link) of this user, readable and writable by nobody else, of exactly the
    expected size.
    """
    return _map(path, size, 0)


def _map(path: str, size: int, create: int, dtype="float32", shape=None, writable: bool = True) -> np.ndarray:
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize * size
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC | create, 0o600)
    try:
        if create:
            os.posix_fallocate(fd, 0, max(1, nbytes))
        else:
            _check_private(os.fstat(fd), path, max(1, nbytes))
        buffer = mmap.mmap(fd, max(1, nbytes), access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        if create:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    os.close(fd)  # the mapping keeps the memory
    array = np.frombuffer(buffer, dtype=dtype, count=size)
    return array if shape is None else array.reshape(shape)


def _write_private(path: str, a: np.ndarray) -> None:
    """A new file at ``path`` (mode 0600) holding ``a``'s bytes (``OSError`` if there is no space).

    Written with ``write(2)``, not through a mapping: filling a fresh shared mapping page-faults
    every 4 KiB page, which measured up to 10x slower than the copy itself in a VM.  The write
    allocates the pages, so a full file system fails here, not as a SIGBUS in a worker later.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(a).cast("B") if a.nbytes else memoryview(b"\0")
        offset = 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset : offset + (64 << 20)], offset)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    os.close(fd)


def _check_private(info: os.stat_result, path: str, nbytes: int | None) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise PermissionError(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to user id {info.st_uid}, not {os.geteuid()}")
    if info.st_mode & 0o077:
        raise PermissionError(f"{path} is open to other users (mode {stat.filemode(info.st_mode)})")
    if nbytes is not None and info.st_size != nbytes:
        raise PermissionError(f"{path} holds {info.st_size} bytes, not {nbytes}")


class SharedBuffers:
    """The client's side: one private directory per fit, the weights, one gradient per local worker.

    The client owns and removes every file.  Make one with :meth:`create`,
    which returns None when shared memory cannot be used here.
    """

    def __init__(self, directory: str, size: int):
        self.directory, self.size = directory, size
        self.token = uuid.uuid4().hex
        self._token_path = os.path.join(directory, "token")
        fd = os.open(self._token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        self._weights_path = os.path.join(directory, "weights")
        self.weights = create_private_array(self._weights_path, size)
        self.gradients: dict[str, np.ndarray] = {}
        self.maps_data: set[str] = set()  # workers that read the training data from shared memory
        self._data: dict[str, SharedFile] = {}  # the training data's files, once shared
        self._paths: dict[str, str] = {}
        self._count = 0
        self._warned = False

    @classmethod
    def create(cls, size: int, root: str | None = DEFAULT_DIR) -> SharedBuffers | None:
        """A fit's buffers under ``root``; None (after one log line) if that is not possible."""
        if not root or not os.path.isdir(root) or not os.access(root, os.W_OK):
            return None
        sweep(root)
        directory = None
        try:
            directory = tempfile.mkdtemp(prefix=f"adadamp-{os.getpid()}-", dir=root)
            return cls(directory, size)
        except OSError as err:
            logger.warning(
                "no shared memory for this fit (%s: %s); weights and gradients go over sockets. "
                "Give %s more space or point dask config 'adadamp.shm-dir' elsewhere.",
                type(err).__name__, err, root,
            )
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
            return None

    def share_data(self, X: np.ndarray, y: np.ndarray) -> None:
        """Copy the training data here once, for the workers on this machine to map (read-only)
        instead of each receiving its blocks over a socket.  Without the space: the sockets."""
        files = {}
        try:
            for name, a in (("X", X), ("y", y)):
                path = os.path.join(self.directory, f"data-{name}")
                _write_private(path, np.ascontiguousarray(a))
                files[name] = SharedFile(path, a.dtype.str, a.shape)
        except OSError as err:
            logger.warning("no shared memory for the training data (%s); it goes to the workers over sockets", err)
            for part in files.values():
                with contextlib.suppress(OSError):
                    os.remove(part.path)
            return
        self._data = files

    def offer(self, worker: str) -> ShmOffer | None:
        """Create ``worker``'s gradient buffer; what its set-up call needs to map both (None: no space)."""
        self._count += 1
        path = os.path.join(self.directory, f"gradient-{self._count}")
        try:
            self.gradients[worker] = create_private_array(path, self.size)
        except OSError as err:
            if not self._warned:
                logger.warning(
                    "no shared memory for more workers (%s); their gradients go over sockets", err
                )
                self._warned = True
            return None
        self._paths[worker] = path
        return ShmOffer(self._weights_path, path, self._token_path, self.token, **self._data)

    def drop(self, worker: str) -> None:
        self.gradients.pop(worker, None)
        self.maps_data.discard(worker)
        path = self._paths.pop(worker, None)
        if path is not None:
            with contextlib.suppress(OSError):
                os.remove(path)

    def close(self) -> None:
        """Remove the fit's directory (mappings stay valid until their arrays are gone)."""
        self.gradients.clear()
        self.maps_data.clear()
        self._paths.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def attach(offer: ShmOffer, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The worker's side: map the client's weights and this worker's gradient (``size`` floats), or None.

    None means "use the socket": another machine (no such token file),
    another user, or anything unexpected about the files.
    """
    try:
        if not _same_user_here(offer):
            return None
        return open_private_array(offer.weights, size), open_private_array(offer.gradient, size)
    except OSError as err:
        if not isinstance(err, FileNotFoundError):  # another machine is the usual reason, and no news
            logger.warning("not mapping the client's shared memory (%s); using the socket", err)
        return None


def attach_data(offer: ShmOffer) -> tuple[np.ndarray, np.ndarray] | None:
    """The worker's side: the training data the client shared (read-only ``X`` and ``y``), or None."""
    if offer.X is None or offer.y is None:
        return None
    try:
        if not _same_user_here(offer):
            return None
        return tuple(
            _map(p.path, int(np.prod(p.shape)), 0, p.dtype, tuple(p.shape), writable=False) for p in (offer.X, offer.y)
        )
    except OSError as err:
        logger.warning("not mapping the client's training data (%s); it comes over the socket", err)
        return None


def _same_user_here(offer: ShmOffer) -> bool:
    """Whether the fit's token file is here, private to this user, and holds the fit's token."""
    fd = os.open(offer.token_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as f:
        _check_private(os.fstat(f.fileno()), offer.token_path, None)
        return f.read() == offer.token


def sweep(root: str) -> None:
    """Remove fit directories of this user whose owning process is gone (a client killed with SIGKILL)."""
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            match = _OWNED.match(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != os.geteuid() or _alive(int(match.group(1))):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
