"""One allocator per cluster, living with the scheduler: the fits that share a cluster get
disjoint workers, and the cluster follows the sum of what they want.

Each fit declares the workers it wants now and ahead (its schedule's forecast, about one worker
start ahead) and trains only on the workers it is granted; no fit takes, shrinks or retires a
worker another fit holds.  The scheduler is the one place every fit can reach (from threads,
joblib's processes, other clients), so the allocator is a scheduler plugin (:class:`Allocator`),
registered idempotently by the first fit.

Sizing: :class:`AllocatorAdaptive` is Dask's own ``Adaptive`` with ``target()`` the sum of the
wants (plus the workers kept warm) and ``workers_to_close()`` the workers no fit holds that have
been idle for ``adadamp.cluster.idle-timeout`` (dask config), so a search's next candidate and
back-to-back fits find them warm.  Retiring goes through ``Adaptive.scale_down``: the scheduler
retires the workers gracefully before the cluster closes them.

Division: when the wants exceed what the cluster may have, each fit gets an equal share of the
workers (max-min fair: a fit that wants less than its share leaves the rest to the others); the
fits that predict their speedup per worker count (``Goodput``) divide their shares together by
marginal speedup, as Pollux re-divides a cluster among jobs (Qiao et al. OSDI'21, section 4.2)
but without restarts: a grant changes between two updates.  A fit keeps the workers it holds up to its share, so
grants move only when they must.  A fit whose client leaves the scheduler loses its grant at
once; one that stops renewing it otherwise, after ``LEASE`` seconds.

Lending: a worker no fit wants is lent to a fit that says more workers would shorten its
updates (``borrow``: its own update-time model, :meth:`~adadamp.engine.speeds.Speeds.helpers`).
A lent worker is in no one's share: the next division hands it to a fit that wants it, and the
fit it was lent to gives it back between two updates (:func:`lend`).

The parts: :mod:`~adadamp.cluster.division` (pure functions: shares, division, lending),
:mod:`~adadamp.cluster.allocator` (the scheduler's side: one :class:`FitEntry` per fit, handlers that
check their arguments first) and :mod:`~adadamp.cluster.grant` (a fit's side).
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
import weakref

from distributed import SpecCluster
from distributed.deploy.adaptive import Adaptive
from distributed.protocol.pickle import dumps

from ..wire.identity import scheduler_info
from .allocator import LEASE, MAX_COUNT, MAX_FITS_PER_CLIENT, NAME, Allocator, FitEntry, idle_timeout
from .division import by_speedup, divide, lend, shares
from .gateway import GatewaySizer, is_gateway_cluster
from .grant import Grant

__all__ = ["LEASE", "MAX_COUNT", "MAX_FITS_PER_CLIENT", "NAME", "Allocator", "AllocatorAdaptive", "FitEntry",
           "GatewaySizer", "Grant", "adapt", "by_speedup", "divide", "ensure_allocator", "idle_timeout", "lend", "shares"]

logger = logging.getLogger(__name__)

class AllocatorAdaptive(Adaptive):
    """Dask's ``Adaptive`` sized by the allocator: the sum of the fits' wants, shrinking lazily
    and only through workers no fit holds (``Adaptive`` keeps its ``wait_count`` hysteresis and
    retires gracefully)."""

    idle: float | None = None  #: seconds a worker no fit holds is kept (None: dask config adadamp.cluster.idle-timeout)
    _installed = False

    async def target(self) -> int:
        if not self._installed:  # before any fit registered it: joblib's "dask" backend waits for a worker first
            await self.scheduler.register_scheduler_plugin(plugin=dumps(Allocator()), name=NAME, idempotent=True)
            self._installed = True
        maximum = None if math.isinf(self.maximum) else int(self.maximum)
        idle = idle_timeout() if self.idle is None else self.idle
        return await self.scheduler.adadamp_target(maximum=maximum, minimum=int(self.minimum),
                                                   idle=None if math.isinf(idle) else idle, planned=len(self.plan))

    async def workers_to_close(self, target: int) -> list[str]:
        return await self.scheduler.adadamp_workers_to_close(target=target)

    async def scale_down(self, workers) -> None:
        """Retire ``workers`` (names) with one close each: the scheduler drains them (they take no
        task, hold no data) and the cluster closes them.

        Dask's own ``scale_down`` also has the scheduler close them (``close_workers=True``) while
        the cluster closes their nannies: two closes of one worker at once.  A nanny whose worker
        exited during the cluster's close then logged ``ERROR`` with a ``CancelledError`` (4 in 20
        retirements of idle LocalCluster workers), and the nanny killed each process after
        waiting 4 s for it.  Only a ``SpecCluster`` (LocalCluster, dask-jobqueue) is known to close
        what its ``scale_down`` drops; any other cluster retires as Dask's ``Adaptive`` does.
        Left: the scheduler tells a worker it is closing gracefully on a batched stream, which the
        nanny's close can overtake (then the worker logs ``ERROR`` ``Invalid Worker.status
        transition: Status.closing -> Status.closing_gracefully``; seen once in 48 retirements).
        """
        if not workers or not isinstance(self.cluster, SpecCluster):
            return await super().scale_down(workers)
        logger.info("retiring idle workers %s", workers)
        # remove=False: each stays listed, closing gracefully (no fit is granted it), until it is closed
        await self.scheduler.retire_workers(names=workers, remove=False, close_workers=False)
        closing = self.cluster.scale_down(workers)
        if inspect.isawaitable(closing):
            await closing


_ADAPTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cluster -> its AllocatorAdaptive
_LOCK = threading.Lock()


def _adapting(adaptive: Adaptive) -> bool:
    """Whether ``adaptive`` was not stopped: ``Adaptive.state`` from distributed 2024.12.0 on; before
    it, ``stop()`` drops the periodic callback that ``__init__`` made."""
    state = getattr(adaptive, "state", None)
    return state != "stopped" if state is not None else adaptive.periodic_callback is not None


def adapt(cluster, minimum: int | None = None, maximum: float | None = None, interval: float = 0.5,
          idle: float | None = None) -> AllocatorAdaptive | GatewaySizer | None:
    """Size ``cluster`` (a LocalCluster, a dask-jobqueue cluster: any ``SpecCluster``; a dask-gateway
    ``GatewayCluster``, through its ``scale``: :class:`~adadamp.cluster.gateway.GatewaySizer`) for the
    fits that share it: the sum of their wants, within ``[minimum, maximum]`` (``minimum`` None:
    the workers it has now, so it never shrinks below what it was started with; ``maximum``
    None: the largest ``max_workers`` of the fits; ``idle``: seconds a worker no fit holds is kept,
    None: dask config ``adadamp.cluster.idle-timeout``, read each time).  A fit with
    ``scale_cluster`` calls this for the cluster of its client (once per cluster); None for a
    cluster that cannot adapt."""
    if not hasattr(cluster, "adapt"):
        return None
    with _LOCK:
        adaptive = _ADAPTIVE.get(cluster)
        if adaptive is not None and _adapting(adaptive):
            if maximum is not None:
                adaptive.maximum = maximum
            if idle is not None:
                adaptive.idle = idle
            return adaptive
        if is_gateway_cluster(cluster):
            if minimum is None:
                minimum = len(cluster.scheduler_info.get("workers", {}))
            adaptive = GatewaySizer(cluster, minimum=minimum, maximum=math.inf if maximum is None else maximum,
                                    interval=interval, idle=idle)
            _ADAPTIVE[cluster] = adaptive
            return adaptive
        if minimum is None:
            minimum = len(getattr(cluster, "plan", ()))
        adaptive = cluster.adapt(Adaptive=AllocatorAdaptive, minimum=minimum,
                                 maximum=math.inf if maximum is None else maximum,
                                 interval=interval, wait_count=3)
        adaptive.idle = idle
        _ADAPTIVE[cluster] = adaptive
        return adaptive


_REGISTERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> scheduler ids it registered with


def ensure_allocator(client) -> None:
    """Register the allocator on ``client``'s scheduler unless it is there (idempotent: a second
    registration keeps the first allocator and its state)."""
    ident = scheduler_info(client).get("id")
    with _LOCK:
        if ident is not None and ident in _REGISTERED.get(client, set()):
            return
    client.run_on_scheduler(_install)
    with _LOCK:
        _REGISTERED.setdefault(client, set()).add(ident)


def _install(dask_scheduler=None) -> None:
    """On the scheduler's event loop (atomic among fits): add the allocator unless it is there."""
    if NAME not in dask_scheduler.plugins:
        plugin = Allocator()
        dask_scheduler.add_plugin(plugin, name=NAME)
        plugin.start(dask_scheduler)
