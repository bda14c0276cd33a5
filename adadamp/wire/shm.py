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

A fit that ends cleanly leaves its training data's files for ``adadamp.shm-keep-data`` seconds
(default 60; 0: never) in a private directory of their own (:class:`KeptData`): the next fit of
this process writes its data over them instead of into new files.  New tmpfs pages are allocated
and zeroed by the kernel (and, in a virtual machine, first touched on the host): writing W1's
188 MB into new files took 0.07-0.44 s a fit on the 2-core development VM, over kept ones 0.04 s.
A grid search pays that once per fit.

This module runs on both sides and imports neither the client side nor Dask's
scheduler machinery; what a worker's set-up receives is a :class:`~adadamp.records.ShmOffer`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid

import numpy as np

from ..records import SharedFile, ShmOffer

logger = logging.getLogger(__name__)

DEFAULT_DIR = "/dev/shm"
#: ``dask.config`` key: seconds a clean fit's data files are kept for the next fit of the process.
KEEP_DATA = "adadamp.shm-keep-data"
KEEP_DATA_SECONDS = 60.0
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


def _write_private(path: str, a: np.ndarray, kept: str | None = None) -> None:
    """A new file at ``path`` (mode 0600) holding ``a``'s bytes (``OSError`` if there is no space).

    Written with ``write(2)``, not through a mapping: filling a fresh shared mapping page-faults
    every 4 KiB page, which measured up to 10x slower than the copy itself in a VM.  The write
    allocates the pages, so a full file system fails here, not as a SIGBUS in a worker later.
    ``kept`` (a file of :class:`KeptData`, moved to ``path`` here) is written over and cut to
    size instead: its pages are there already.
    """
    fd = _take_kept(kept, path) if kept is not None else None
    if fd is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(a).cast("B") if a.nbytes else memoryview(b"\0")
        offset = 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset : offset + (64 << 20)], offset)
        os.ftruncate(fd, len(view))  # a kept file may hold more: cut to this data (a new one: no-op)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    os.close(fd)


def _take_kept(kept: str, path: str) -> int | None:
    """``kept`` moved to ``path`` and opened for writing, if it is still a private regular file of
    this user (else removed: None, and the caller creates a new file)."""
    fd = None
    try:
        os.rename(kept, path)
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        _check_private(os.fstat(fd), path, None)
        return fd
    except OSError as err:
        logger.warning("not writing over the kept data file %s (%s)", kept, err)
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(path)
        return None


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

    def __init__(self, directory: str, size: int, keep_data: float = 0.0):
        self.directory, self.size, self.keep_data = directory, size, float(keep_data)
        self.root = os.path.dirname(directory)
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
    def create(cls, size: int, root: str | None = DEFAULT_DIR, keep_data: float = 0.0) -> SharedBuffers | None:
        """A fit's buffers under ``root``; None (after one log line) if that is not possible.
        ``keep_data``: seconds :meth:`close` keeps the data files for the next fit (0: none)."""
        if not root or not os.path.isdir(root) or not os.access(root, os.W_OK):
            return None
        sweep(root)
        directory = None
        try:
            directory = tempfile.mkdtemp(prefix=f"adadamp-{os.getpid()}-", dir=root)
            return cls(directory, size, keep_data)
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
                _write_private(path, np.ascontiguousarray(a), KEPT_DATA.take(self.root, name))
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

    def close(self, clean: bool = False) -> None:
        """Remove the fit's directory (mappings stay valid until their arrays are gone); after a
        ``clean`` fit its data files are kept ``keep_data`` seconds first (:class:`KeptData`)."""
        if clean and self._data and self.keep_data > 0:
            KEPT_DATA.keep(self.root, {n: f.path for n, f in self._data.items()}, self.keep_data)
        self._data = {}
        self.gradients.clear()
        self.maps_data.clear()
        self._paths.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


class KeptData:
    """The data files of this process's last clean fit, kept for the next fit to write over.

    They wait in a private directory of their own (``mkdtemp``, mode 0700, the process id in its
    name, so :func:`sweep` removes it after a SIGKILL), one set at a time, for the seconds the fit
    asked; then, or at the process's exit, they are removed.  The next fit on the same root takes
    them one by one (:func:`_write_private`, which checks each is still a private regular file of
    this user).  The workers of the fit that wrote them have been released by then: nobody reads
    the old contents.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._root: str | None = None
        self._directory: str | None = None
        self._files: dict[str, str] = {}
        self._timer: threading.Timer | None = None

    def keep(self, root: str, files: dict[str, str], seconds: float) -> None:
        """Move ``files`` (name: path, under ``root``) here for ``seconds``, dropping what was kept."""
        with self._lock:
            self._drop()
            try:
                directory = tempfile.mkdtemp(prefix=f"adadamp-{os.getpid()}-kept-", dir=root)
            except OSError:
                return
            moved = {}
            for name, path in files.items():
                with contextlib.suppress(OSError):
                    os.rename(path, os.path.join(directory, name))
                    moved[name] = os.path.join(directory, name)
            self._root, self._directory, self._files = root, directory, moved
            self._timer = threading.Timer(seconds, self._expire, args=(directory,))
            self._timer.daemon = True
            self._timer.start()

    def take(self, root: str, name: str) -> str | None:
        """The kept file ``name`` under ``root``, now the caller's to move (None: nothing kept)."""
        with self._lock:
            return self._files.pop(name, None) if root == self._root else None

    def drop(self) -> None:
        """Remove what is kept (the process exits)."""
        with self._lock:
            self._drop()

    def _expire(self, directory: str) -> None:
        with self._lock:
            if directory == self._directory:
                self._drop()

    def _drop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._root, self._directory, self._files = None, None, {}


KEPT_DATA = KeptData()
atexit.register(KEPT_DATA.drop)


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
