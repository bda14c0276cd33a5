"""Where a fit's epochs run: a backend opened on the cluster, or kept open between calls.

:func:`train` runs the fit loop on a backend: on the embedded cluster (shared by the process's fits),
or on the user's, where a backend may be kept open between an estimator's calls on the same data
(``partial_fit`` loops).

Opening a backend sets the module up on every worker and places the data; a model-selection or
streaming loop that calls ``partial_fit`` again and again on the same data would pay that every
call.  After a ``partial_fit`` call that succeeded, the estimator keeps its backend suspended (workers,
their data and the channels stay; the module gets its own storage back) together with a key:
the client, the cluster policy, the device and the data's token.  The next warm call with the
same key resumes it; anything else, a failed call, ``KEEP_SECONDS`` without a call, or the
estimator being garbage-collected closes it.  ``fit`` keeps nothing: its memory on the workers
is released when it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import threading
import weakref

from distributed import Client

from ..cluster import policy as cl
from ..data import DataSource
from ..records import TrainingKit, TrainingState
from .backends import Backend, get_backend
from .loop import FitLoop

logger = logging.getLogger(__name__)

#: Seconds a suspended backend is kept without a call (well under the workers' idle timeout).
KEEP_SECONDS = 600.0


class KeptBackend:
    """A suspended backend and the key of the calls that may resume it.

    Closed after ``KEEP_SECONDS`` without a call (a timer), when its owner (the estimator) is
    garbage-collected, at interpreter exit, or by :meth:`claim` for a call that cannot resume it.
    """

    def __init__(self, owner, backend, key: tuple):
        self.backend = backend
        self.key = key
        self._lock = threading.Lock()
        self._claimed = False
        self._finalizer = weakref.finalize(owner, _close, backend)
        self._timer = threading.Timer(KEEP_SECONDS, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        logger.info("released the workers and data kept since the last call (%.0f s without a call)", KEEP_SECONDS)
        self._finalizer()

    def claim(self, key: tuple | None):
        """The backend if a call with ``key`` may resume it (it is then the caller's); else close it
        and return None."""
        self._timer.cancel()
        with self._lock:
            if self._claimed:  # expired meanwhile: closed already
                return None
            self._claimed = True
        if key is not None and key == self.key and getattr(key[0], "status", None) == "running":
            self._finalizer.detach()
            return self.backend
        self._finalizer()
        return None


def _close(backend) -> None:
    """Close ``backend``; called on a running event loop (an estimator collected there: dask-ml's
    incremental searches call ``partial_fit`` in a Dask worker's tasks, and the worker drops the
    estimator on its event loop), in a thread of its own, since closing waits on the client's loop
    (on the loop itself the release's RPCs were never sent: "coroutine ... was never awaited")."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running in this thread: close here
        with contextlib.suppress(Exception):  # the client or the cluster may be gone already
            _exit(backend, None, None, None)
        return
    threading.Thread(target=_close, args=(backend,), name="adadamp-release", daemon=True).start()


def _exit(backend: Backend, *exc) -> None:
    """Close ``backend`` (``exc``: what ended its call), then release its data on the cluster."""
    try:
        backend.__exit__(*exc)
    finally:
        backend.data.release()


def train(
    loop: FitLoop, data: DataSource, epochs: int, epoch_updates: list, *, backend: str, device: str,
    client: Client | None, policy: cl.ClusterPolicy, criterion=None, kept: KeptBackend | None = None,
    fresh: bool = True, keep: bool = False, owner=None, kit: TrainingKit | None = None,
) -> KeptBackend | None:
    """Run ``epochs`` epochs of ``loop`` on a ``backend`` (a registered name); returns the backend
    kept suspended for the next call on the same data (``keep``, on a cluster of the user's), or None.

    ``client`` None: the embedded cluster, started or grown for the first batch and shared by the
    process's fits, which keeps nothing.  ``kept``: the last call's backend, resumed when this call
    matches its key (a warm call, same client, policy, device, backend, optimizer and data), else
    closed.  ``criterion``: the workers' criterion, when not the state's (sample weights).
    ``owner``: whose garbage collection closes a kept backend.  ``kit``: precision and clipping.
    """
    call = _Call(loop, data, epochs, epoch_updates, backend, device, client, policy, criterion, kit or TrainingKit())
    if epochs <= 0 or client is None or policy.shared:  # nothing is kept
        if kept is not None:
            kept.claim(None)  # closes it
        if epochs <= 0:
            data.release()
        else:
            _train_once(call)
        return None
    return _train_keeping(call, kept, fresh=fresh, keep=keep, owner=owner)


@dataclasses.dataclass(frozen=True, eq=False)
class _Call:
    """What one call of :func:`train` runs, on which backend and cluster."""

    loop: FitLoop
    data: DataSource
    epochs: int
    epoch_updates: list
    backend: str
    device: str
    client: Client | None
    policy: cl.ClusterPolicy
    criterion: object = None
    kit: TrainingKit = dataclasses.field(default_factory=TrainingKit)

    def open(self, client: Client, policy: cl.ClusterPolicy) -> Backend:
        """The backend (not entered yet); the fit's page opens first, so that it shows the fit while
        the backend waits for its workers."""
        self.loop.open_page(client, self.epochs)
        return _open(self.backend, client, policy, self.loop.state, self.data, self.device, self.criterion, self.kit)

    def run(self, backend: Backend) -> None:
        self.loop.run(backend, self.epochs, self.epoch_updates)


def _train_once(call: _Call) -> None:
    """Train on a backend opened for this call and closed after it: on the embedded cluster
    (started or grown for the first batch) or on a shared one."""
    state = call.loop.state
    first = state.damper.forecast_batch_size(state.loop.epoch)
    try:
        with (
            cl.training_client(call.client, call.policy, first) as (on, sized),
            call.open(on, sized) as opened,
        ):
            call.run(opened)
    except BaseException as err:
        call.loop.close_page(err)  # (the loop closed it already where it failed while training)
        raise
    finally:
        call.data.release()


def _train_keeping(call: _Call, kept: KeptBackend | None, *, fresh: bool, keep: bool, owner) -> KeptBackend | None:
    """Train on the user's cluster, on the ``kept`` backend when this call may resume it, else on
    one opened now; returns it suspended (``keep``) or closes it."""
    opened, key = _claim(call, kept, fresh=fresh, keep=keep)
    opened = _resume_or_open(call, opened)
    try:
        call.run(opened)
        if keep:
            opened.suspend()
    except BaseException:
        _exit(opened, *sys.exc_info())
        raise
    if keep:
        return KeptBackend(owner, opened, key)
    _exit(opened, None, None, None)
    return None


def _claim(call: _Call, kept: KeptBackend | None, *, fresh: bool, keep: bool) -> tuple[Backend | None, tuple | None]:
    """The ``kept`` backend if this call may resume it (a warm call with its key; else it is
    closed), and this call's key (None unless it keeps or may resume a backend)."""
    # (the optimizer's class: an all-reduce backend's replicas hold one of theirs; the data's token
    # hashes thousands of examples, so only a call that keeps or may resume a backend computes it)
    resume = kept is not None and not fresh
    state = call.loop.state
    key = (call.client, call.policy, call.device, call.backend, call.kit, type(state.optimizer), call.data.token()) if keep or resume else None
    claimed = kept.claim(key if resume else None) if kept is not None else None
    return claimed, key


def _resume_or_open(call: _Call, claimed: Backend | None) -> Backend:
    """Resume the ``claimed`` backend with this call's state, or (None) open one; the call's data
    is released unless an opened backend holds it."""
    if claimed is not None:
        state = call.loop.state
        call.data.release()  # the resumed backend trains on its own copy of the same data
        claimed.resume(module=state.module, optimizer=state.optimizer, damper=state.damper, loop=state.loop)
        logger.info("resumed the workers and data of the last call")
        return claimed
    try:
        return call.open(call.client, call.policy).__enter__()
    except BaseException as err:
        call.loop.close_page(err)
        call.data.release()
        raise


def _open(name: str, client: Client, policy: cl.ClusterPolicy, state: TrainingState, data: DataSource,
          device: str, criterion=None, kit: TrainingKit | None = None) -> Backend:
    return get_backend(name)(
        client,
        module=state.module,
        criterion=state.criterion if criterion is None else criterion,
        optimizer=state.optimizer,
        damper=state.damper,
        loop=state.loop,
        data=data,
        policy=policy,
        device=device,
        kit=kit,
    )
