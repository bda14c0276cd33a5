"""Sizing a dask-gateway cluster for the fits that share it.

A ``GatewayCluster`` (dask-gateway) is not a ``SpecCluster``: Dask's ``Adaptive`` cannot drive it
(it has no plan and no ``scale_down``), and its own ``adapt()`` runs the gateway's adaptive, sized by
the scheduler's task load, which a fit's calls to its workers do not create.  :class:`GatewaySizer`
asks the scheduler's allocator for the cluster's target (``adadamp_target``: the sum of the fits'
wants and the workers kept warm) and passes it to ``GatewayCluster.scale``.  On a scale-down the
gateway's scheduler picks the workers to retire with Dask's ``Scheduler.workers_to_close``, which
the allocator limits to workers no fit holds (``Allocator.valid_workers_downscaling``): a fit
keeps its workers while the cluster shrinks, and the gateway starts no replacement for them.

dask-gateway is an optional dependency: a cluster is recognised by its type's name and module.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import weakref

from distributed.protocol.pickle import dumps

from .allocator import NAME, Allocator, idle_timeout

logger = logging.getLogger(__name__)

#: Seconds one call to the scheduler or the gateway may take before the sizer gives up on it.
CALL_TIMEOUT = 30.0


def is_gateway_cluster(cluster) -> bool:
    """Whether ``cluster`` is a dask-gateway ``GatewayCluster`` (without importing dask_gateway)."""
    return any(t.__name__ == "GatewayCluster" and t.__module__.split(".")[0] == "dask_gateway"
               for t in type(cluster).__mro__)


class GatewaySizer:
    """Scales a ``GatewayCluster`` to the allocator's target every ``interval`` seconds, from a
    daemon thread, until the cluster closes or :meth:`stop`.  It grows at once and shrinks only
    after ``wait_count`` looks in a row asked for fewer workers (as Dask's ``Adaptive`` does).

    ``minimum``, ``maximum`` and ``idle`` may be changed while it runs (as an
    :class:`~adadamp.cluster.AllocatorAdaptive`'s); ``state`` is "running" or "stopped".
    """

    def __init__(self, cluster, minimum: int = 0, maximum: float = math.inf, interval: float = 0.5,
                 idle: float | None = None, wait_count: int = 3):
        self.minimum = minimum
        self.maximum = maximum
        self.idle = idle  #: seconds a worker no fit holds is kept (None: dask config adadamp.cluster.idle-timeout)
        self.interval = interval
        self.wait_count = wait_count
        self.requested: int | None = None  #: the workers this sizer last asked the gateway for
        self.state = "running"
        self._cluster = weakref.ref(cluster)  # the sizer does not keep a cluster its user dropped
        self._installed = False
        self._failed = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adadamp-gateway-sizer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sizing (the cluster keeps the workers it has)."""
        self.state = "stopped"
        self._stopped.set()

    def _run(self) -> None:
        lower = 0  # looks in a row that asked for fewer workers
        while not self._stopped.is_set():
            cluster = self._cluster()
            if cluster is None or getattr(cluster, "status", None) in ("closing", "closed"):
                break
            try:
                lower = self._step(cluster, lower)
                self._failed = False
            except Exception as err:  # noqa: BLE001 -- the scheduler or the gateway did not answer: try again next time
                if getattr(cluster, "status", None) in ("closing", "closed"):
                    break
                (logger.debug if self._failed else logger.warning)("sizing %r failed: %r", cluster, err)
                self._failed = True
            del cluster
            self._stopped.wait(self.interval)
        self.state = "stopped"

    def _step(self, cluster, lower: int) -> int:
        """One look: ask the allocator for the target and scale the cluster to it when it should."""
        if self.requested is None:
            self.requested = len(cluster.scheduler_info.get("workers", {}))
        target = self._on_loop(cluster, self._target(cluster))
        if target > self.requested:
            lower = 0
        elif target < self.requested:
            lower += 1
            if lower < self.wait_count:
                return lower
            lower = 0
        else:
            return 0
        logger.info("scaling %r from %d to %d workers", cluster, self.requested, target)
        if cluster.asynchronous:  # scale() answers a coroutine, to await on the cluster's loop
            self._on_loop(cluster, _awaited(cluster.scale, target))
        else:
            cluster.scale(target)
        self.requested = target
        return lower

    async def _target(self, cluster) -> int:
        comm = cluster.scheduler_comm
        if not self._installed:  # before any fit registered it
            await comm.register_scheduler_plugin(plugin=dumps(Allocator()), name=NAME, idempotent=True)
            self._installed = True
        maximum = None if math.isinf(self.maximum) else int(self.maximum)
        idle = idle_timeout() if self.idle is None else self.idle
        return await comm.adadamp_target(maximum=maximum, minimum=int(self.minimum),
                                         idle=None if math.isinf(idle) else idle, planned=self.requested)

    @staticmethod
    def _on_loop(cluster, coroutine):
        """Run ``coroutine`` on the cluster's event loop and answer its result."""
        loop = cluster.loop.asyncio_loop
        if not loop.is_running():
            coroutine.close()
            raise RuntimeError(f"the event loop of {cluster!r} is not running")
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout=CALL_TIMEOUT)
        except BaseException:
            future.cancel()
            raise


async def _awaited(function, *args):
    return await function(*args)
