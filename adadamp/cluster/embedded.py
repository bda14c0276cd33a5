"""The embedded cluster: one LocalCluster per process for the fits that run with no Dask client.

Starting worker processes costs seconds, a fit on a warm cluster a fraction of one, so a search,
a loop of fits or a notebook shares one: started by the first fit, grown for the largest, closed
after ``adadamp.embedded-cluster.idle-timeout`` (dask config) without a fit, on request
(:func:`close_embedded_cluster`) or at exit.  Other fits may be using it, so it never shrinks: a
fit uses only the workers it wants there (:attr:`adadamp.cluster.ClusterPolicy.shared`).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import inspect
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import dask
from dask.utils import parse_timedelta
from distributed import Client, LocalCluster, Security
from distributed.core import Status

from . import adaptive

logger = logging.getLogger(__name__)

# One per process, shared by the fits that run with no client (a search, a loop of fits, a
# notebook): starting worker processes costs seconds, a fit on a warm cluster a fraction of one.
IDLE_TIMEOUT = "10 minutes"  #: default of the dask config key ``adadamp.embedded-cluster.idle-timeout``

MAX_WORKERS_KEY = "adadamp.embedded-cluster.max-workers"  #: dask config: the most worker processes (None: 4 per core)

_LOCK = threading.Lock()  # guards _EMBEDDED: concurrent fits (a threaded search) start one cluster
_EMBEDDED: _Embedded | None = None
_INHERITED: list[_Embedded] = []  # a forked child's copies of its parent's cluster: never used nor closed

#: The HTTP routes the embedded scheduler serves beside Dask's Bokeh pages: the training page and a health
#: check.  Dask's defaults also serve logs, call stacks, worker folders, metrics and a proxy to every
#: worker, readable by any local user (docs/guide/security.rst).
ROUTES = ["distributed.http.health", "adadamp.dashboard"]

MAIN_GUARD = (
    "{where} runs a fit at the main script's top level, which each worker process of the embedded Dask "
    "cluster runs again when it imports the script: put the script's code under "
    '`if __name__ == "__main__":` (as for multiprocessing and PyTorch\'s DataLoader workers).'
)


class _Embedded:
    """The process's LocalCluster of single-threaded worker processes and the fits using it.

    Dask's nannies set ``MALLOC_TRIM_THRESHOLD_=65536``, which makes PyTorch
    1.5-2x slower in workers; the embedded cluster does
    not set it (the worker plugin also repairs it on other clusters).
    """

    def __init__(self, n_workers: int):
        if multiprocessing.get_start_method(allow_none=True) not in (None, *multiprocessing.get_all_start_methods()):
            # A joblib (loky) worker process: Dask's spawned workers would be told to use its start
            # method, unknown to them before they import loky ("cannot find context for 'loky'").
            multiprocessing.set_start_method(None, force=True)
        # Dask's scratch folder is the fixed ``$TMPDIR/dask-scratch-space``, which another local user can
        # create first (a file: no cluster starts; her folder: spilled data lands in it, and every
        # process puts it on ``sys.path``).  This cluster's is private (0700) and removed at close.
        self.folder = tempfile.mkdtemp(prefix="adadamp-cluster-")
        with dask.config.set({
            "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
            "distributed.scheduler.http.routes": ROUTES,
        }):
            try:
                self.cluster = LocalCluster(
                    n_workers=n_workers,
                    threads_per_worker=1,
                    processes=True,
                    # A Dask scheduler runs any connector's code: TLS with a key and certificate made
                    # now, in memory, and handed only to the workers it spawns, so that no other local
                    # user can connect (loopback alone does not keep them out).
                    security=MemorySecurity.temporary(),
                    host="127.0.0.1",
                    dashboard_address="127.0.0.1:0",  # the dashboard is read-only HTTP, on loopback
                    silence_logs=logging.ERROR,
                    local_directory=self.folder,
                    scheduler_kwargs={"local_directory": self.folder},
                )
            except Exception:
                shutil.rmtree(self.folder, ignore_errors=True)
                where = _unguarded_main_call()
                if where is not None:  # the workers failed importing the script: say why, not Dask's pages
                    raise RuntimeError(MAIN_GUARD.format(where=where)) from None
                raise
        self.client = Client(self.cluster, set_as_default=False)
        adaptive.ensure_allocator(self.client)
        self.size = n_workers  # the most workers a fit asked for: the cluster never shrinks below
        self.users = 0  # fits training on it now
        self.timer: threading.Timer | None = None  # closes it when idle
        logger.info("started the embedded cluster: %d workers, scheduler %s", n_workers, self.cluster.scheduler_address)
        if self.cluster.dashboard_link:
            logger.info("live training page: %s", self.cluster.dashboard_link.replace("/status", "/adadamp"))

    def alive(self) -> bool:
        return self.client.status == "running" and self.cluster.status == Status.running

    def grow(self, n: int) -> None:
        """At least ``n`` workers for a fit about to start (the allocator's adaptive, once a fit
        declared its wants, sizes it from then on: :mod:`adadamp.cluster.allocator`)."""
        self.size = max(self.size, n)
        if n > len(self.cluster.plan):
            self.cluster.scale(n)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        with contextlib.suppress(Exception):
            self.client.close()
        with contextlib.suppress(Exception):
            self.cluster.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class MemorySecurity(Security):
    """``Security.temporary()``'s credentials, with the key kept off every file system.

    Python's ``ssl`` loads a certificate and key only from a path, so Dask writes in-memory
    credentials to a temporary folder for each SSL context it makes (removed at once; left behind by
    a SIGKILL in between).  Here each process hands ``ssl`` the path of an anonymous memory file
    (``memfd_create``, Linux) holding them instead; elsewhere Dask's own way stands.
    """

    def get_tls_config_for_role(self, role):
        tls = super().get_tls_config_for_role(role)
        return {**tls, "cert": _memory_file(tls["cert"]), "key": _memory_file(tls["key"])}


_MEMORY_FILES: dict[tuple[int, str], str] = {}  # (process id, PEM text) -> /proc/self/fd path of its memory file
_MEMORY_LOCK = threading.Lock()  # not _LOCK: held while the cluster starts, which makes SSL contexts


def _memory_file(pem: str | None) -> str | None:
    """``pem`` as the path of a memory file of this process holding it; ``pem`` itself where it is a path
    already, or where the system has no memory files."""
    if pem is None or "\n" not in pem or not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return pem
    key = (os.getpid(), pem)
    with _MEMORY_LOCK:
        path = _MEMORY_FILES.get(key)
        if path is None:
            fd = os.memfd_create("adadamp-tls", os.MFD_CLOEXEC)
            os.write(fd, pem.encode())
            path = _MEMORY_FILES[key] = f"/proc/self/fd/{fd}"
        return path


def embedded_cluster() -> LocalCluster | None:
    """The embedded cluster of this process, or None if none is running.

    Fits with no Dask client share it; its ``dashboard_link`` is Dask's
    dashboard (adadamp's training page is at ``/adadamp``).

    Examples
    --------
    >>> from adadamp.cluster import embedded_cluster
    >>> DaskRegressor().fit(X, y)  # doctest: +SKIP
    >>> embedded_cluster().dashboard_link  # doctest: +SKIP
    'http://127.0.0.1:8787/status'
    """
    embedded = _EMBEDDED
    return None if embedded is None else embedded.cluster


def close_embedded_cluster() -> None:
    """Close the embedded cluster now, rather than when it is idle or at exit.

    Fits with no Dask client share one LocalCluster per process, started by
    the first of them and closed after ``adadamp.embedded-cluster.idle-timeout``
    (dask config, default 10 minutes) without a fit, or at interpreter exit.
    The next fit starts a new one.  A fit running on it when it closes fails;
    without an embedded cluster this does nothing.

    Examples
    --------
    >>> import adadamp
    >>> adadamp.close_embedded_cluster()
    """
    global _EMBEDDED
    with _LOCK:
        embedded, _EMBEDDED = _EMBEDDED, None
    if embedded is not None:
        embedded.close()
        logger.info("closed the embedded cluster")


@contextlib.contextmanager
def embedded_client(n_workers: int, timeout: float = 60.0):
    """The embedded cluster's client for one fit, with ``n_workers`` workers running.

    The first fit starts the cluster; the next ones reuse it, growing it (``cluster.scale``) for a
    fit that wants more workers.  It closes after ``adadamp.embedded-cluster.idle-timeout``
    without a fit (None: only at exit) or with :func:`close_embedded_cluster`.  ``timeout``: seconds
    to wait for the workers (a worker that died in an earlier fit is restarted by its nanny).
    """
    _refuse_reimported_main()
    idle = _idle_timeout()
    embedded = _acquire(n_workers)
    try:
        try:
            embedded.client.wait_for_workers(n_workers, timeout=timeout)
        except TimeoutError:
            logger.warning("the embedded cluster has fewer than %d workers after %.0f s", n_workers, timeout)
        yield embedded.client
    finally:
        _release(embedded, idle)


def _acquire(n_workers: int) -> _Embedded:
    global _EMBEDDED
    with _LOCK:
        embedded = _EMBEDDED
        if embedded is not None and not embedded.alive():
            logger.warning("the embedded cluster was closed or lost its scheduler; starting a new one")
            embedded.close()
            embedded = _EMBEDDED = None
        if embedded is None:
            embedded = _EMBEDDED = _Embedded(n_workers)
        else:
            embedded.grow(n_workers)
        embedded.users += 1
        if embedded.timer is not None:
            embedded.timer.cancel()
            embedded.timer = None
        return embedded


def _release(embedded: _Embedded, idle: float | None) -> None:
    with _LOCK:
        embedded.users -= 1
        if embedded.users or embedded is not _EMBEDDED or idle is None:
            return
        embedded.timer = threading.Timer(idle, _expire, args=(embedded, idle))
        embedded.timer.daemon = True
        embedded.timer.start()


def _expire(embedded: _Embedded, idle: float) -> None:
    global _EMBEDDED
    with _LOCK:
        if embedded is not _EMBEDDED or embedded.users:  # closed, or a fit came meanwhile
            return
        _EMBEDDED = None
    embedded.close()
    logger.info("closed the embedded cluster after %.0f s without a fit", idle)


def max_workers() -> int:
    """The most worker processes the embedded cluster starts: dask config
    ``adadamp.embedded-cluster.max-workers``, default four per core."""
    value = dask.config.get(MAX_WORKERS_KEY, None)
    if value is None:
        return 4 * max(1, os.cpu_count() or 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"dask config {MAX_WORKERS_KEY}={value!r} is not a positive integer (None: four per core).")
    return value


def _idle_timeout() -> float | None:
    value = dask.config.get("adadamp.embedded-cluster.idle-timeout", IDLE_TIMEOUT)
    try:
        return parse_timedelta(value)
    except (TypeError, ValueError, KeyError) as err:  # KeyError: an unknown unit
        raise ValueError(
            f"dask config adadamp.embedded-cluster.idle-timeout={value!r} is not a duration: give seconds or a "
            "string such as '10 minutes' (None keeps the embedded cluster until exit)."
        ) from err


def _after_fork_in_child() -> None:
    """A forked child (a joblib or multiprocessing worker) starts an embedded cluster of its own: the
    parent's client and cluster here are copies it must neither use nor close (nor collect)."""
    global _LOCK, _EMBEDDED
    if _EMBEDDED is not None:
        _INHERITED.append(_EMBEDDED)
    _LOCK, _EMBEDDED = threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(close_embedded_cluster)  # before distributed's own handler (atexit runs last-in first)


def _main_module_frame():
    """The frame of the main module's top-level code that calls this, or None."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in ("__main__", "__mp_main__"):
            return frame
        frame = frame.f_back
    return None


def _refuse_reimported_main() -> None:
    """In a process importing the main script as ``__mp_main__`` (a spawned worker process of the
    embedded cluster, re-running the script's unguarded code), stop before starting a cluster."""
    frame = _main_module_frame()
    if frame is not None and frame.f_globals["__name__"] == "__mp_main__":
        raise RuntimeError(MAIN_GUARD.format(where=f"{frame.f_code.co_filename}, line {frame.f_lineno}"))


def _unguarded_main_call() -> str | None:
    """``"file, line N"`` where the main script calls this at its top level outside
    ``if __name__ == "__main__":``, which spawned worker processes run again; else None."""
    frame = _main_module_frame()
    script = getattr(sys.modules["__main__"], "__file__", None)  # none in a notebook: nothing re-imported
    if frame is None or script is None or os.path.abspath(frame.f_code.co_filename) != os.path.abspath(script):
        return None
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    guards = ("__name__ == '__main__'", "'__main__' == __name__")
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in guards and node.lineno <= line <= node.end_lineno:
            return None
    return f"{path}, line {line}"
