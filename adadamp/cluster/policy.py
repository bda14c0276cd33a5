"""Cluster policy: how many workers a batch wants, and how the cluster is asked for them.

The batch size decides the workers a fit trains on, on any cluster (Holt & Sievert 2021,
"Architecture"): ``workers = clip(ceil(B / grads_per_worker), min, max)``; the others stay free.
With ``scale_cluster`` it decides the cluster's size too, through the cluster's allocator
(:mod:`adadamp.cluster.allocator`), which sizes it for the sum of the wants of the fits sharing it and
retires the workers no fit holds gracefully, after their idle time.

With no client, fits share the process's embedded LocalCluster (:mod:`adadamp.cluster.embedded`),
bounded by the machine (``ClusterPolicy.shared``).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import threading
import warnings
import weakref
from dataclasses import dataclass

from distributed import Client, Nanny
from distributed.core import Status

from ..wire.identity import ALL_WORKERS, scheduler_info
from . import embedded

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterPolicy:
    """How the trainer sizes and waits for the cluster.

    Attributes
    ----------
    grads_per_worker : int
        Examples one worker should compute per update.
    min_workers, max_workers : int
        Bounds on the number of workers a batch trains on (and asked for).
    scale : bool
        Call ``cluster.scale`` as the batch size changes.
    prescale_epochs : float
        How far ahead (in epochs) a known schedule is read at least to set
        up workers and ask for them before the batch grows; it is read
        further, one worker start ahead, once updates were timed.
    scale_wait : float
        When the batch outgrows the live workers, seconds to wait (once per
        size) for the workers asked for; training then goes on with the
        workers that came.  Queue waits longer than this are hidden by
        asking ahead (``prescale_epochs``), never by blocking.
    worker_timeout : float
        Seconds to wait for a first worker when none is alive.
    update_timeout : float
        Seconds one worker may take for one gradient before it is treated
        as lost and its share is recomputed elsewhere.
    shared : bool
        The fit trains on the embedded cluster: bounded by the machine, its
        idle workers kept while it runs, the all-reduce backend allowed on its
        loopback TLS.
    shares : {"equal", "speed"}
        How an update's batch is shared among the workers: equally, or by each
        worker's measured speed (:mod:`adadamp.engine.speeds`).
    """

    grads_per_worker: int = 128
    min_workers: int = 1
    max_workers: int = 16
    scale: bool = False
    prescale_epochs: float = 1.0
    scale_wait: float = 30.0
    worker_timeout: float = 60.0
    update_timeout: float = 120.0
    shared: bool = False
    shares: str = "equal"

    @classmethod
    def of(cls, params: dict, embedded: bool) -> ClusterPolicy:
        """The policy an estimator's parameters ask for; ``embedded``: the fit takes the embedded
        cluster (then it scales by default, up to one worker per core)."""
        scale = params["scale_cluster"] if params["scale_cluster"] is not None else embedded
        max_workers = params["max_workers"] or (default_n_workers() if embedded else 16)
        if embedded:
            max_workers = bounded_by_machine(params["min_workers"], max_workers)
        return cls(
            grads_per_worker=params["grads_per_worker"],
            min_workers=params["min_workers"],
            max_workers=max_workers,
            scale=bool(scale),
            scale_wait=float(params["scale_wait"]),
            worker_timeout=float(params["worker_timeout"]),
            update_timeout=float(params["update_timeout"]),
            shares=params.get("shares", "equal"),
        )

    def wanted(self, batch_size: int, preferred: int | None = None) -> int:
        """Workers wanted for ``batch_size`` examples per update: ``preferred`` (a damper that picks
        the workers itself, :meth:`~adadamp.dampers.BaseDamper.workers_for`) or
        ``ceil(batch_size / grads_per_worker)``, within ``[min_workers, max_workers]``."""
        n = math.ceil(batch_size / self.grads_per_worker) if preferred is None else preferred
        return int(min(max(n, self.min_workers), self.max_workers))

    def first_workers(self, first_batch: int | None) -> int:
        """Workers a fit starts with: those its first batch wants when the cluster scales and the
        damper knows that batch, else ``max_workers``."""
        return self.wanted(first_batch) if (first_batch and self.scale) else self.max_workers


def default_n_workers() -> int:
    """Worker processes of the embedded cluster: one per core."""
    return max(1, os.cpu_count() or 1)


def bounded_by_machine(min_workers: int, max_workers: int) -> int:
    """``max_workers`` for the embedded cluster, within what this machine may start (dask config
    ``adadamp.embedded-cluster.max-workers``, default four per core: emulated accelerators sleep);
    a ``min_workers`` above it is refused before any process starts.  Search spaces and configs
    written by others reach these parameters."""
    bound = embedded.max_workers()
    if min_workers > bound:
        raise ValueError(
            f"min_workers={min_workers} asks the embedded cluster for more worker processes than this machine "
            f"may start ({bound}: {embedded.MAX_WORKERS_KEY}, default four per core). Lower min_workers, pass a "
            f"client= of a cluster that has them, or raise the bound: dask.config.set({{{embedded.MAX_WORKERS_KEY!r}: n}})."
        )
    if max_workers > bound:
        warnings.warn(
            f"max_workers={max_workers} is capped at {bound} on the embedded cluster ({embedded.MAX_WORKERS_KEY}, "
            "default four per core); pass a client= of a larger cluster or raise the bound in dask config.",
            UserWarning, stacklevel=4,
        )
    return min(max_workers, bound)


def live_workers(client: Client) -> dict[str, dict]:
    """Address -> info of the workers the scheduler knows and considers running."""
    info = scheduler_info(client)
    if "workers" not in info:  # the client lost its scheduler
        raise ConnectionError(f"no answer from the Dask scheduler (client status: {client.status})")
    return running(info["workers"])


def running(workers: dict[str, dict]) -> dict[str, dict]:
    """The workers of a scheduler identity that are running (not closing or paused)."""
    return {a: w for a, w in workers.items() if w.get("status", "running") == "running"}


async def watch_workers(client: Client, interval: float, report, before=None) -> None:
    """Call ``report(running_workers_or_exception)`` every ``interval`` s, on the client's event loop
    (after ``await before()``, where given: the fit's grant renewed).

    The training thread reads the latest report instead of waiting for the
    scheduler each time it looks at the membership.
    """
    while True:
        try:
            if before is not None:
                await before()
            info = await client.scheduler.identity(**ALL_WORKERS)
            report(running(info["workers"]))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 -- the training thread decides what a failure means
            report(err)
        await asyncio.sleep(interval)


#: attempts of :func:`register_worker_plugin` (each retry follows a worker lost mid-broadcast)
PLUGIN_ATTEMPTS = 3

#: client -> {plugin name: (scheduler id, workers) it was registered with} (see :func:`ensure_plugin`)
_REGISTERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REGISTERING = threading.Lock()  # guards _REGISTERED and the broadcast that follows a miss


def ensure_plugin(client: Client, make_plugin, name: str, register=None) -> bool:
    """Register the plugin ``make_plugin()`` as ``name`` (``register(client, plugin, name)``, default
    ``client.register_plugin``) unless this client registered it already with the same scheduler
    and the same workers; returns whether it registered now.

    Registering the worker plugin again for every fit cost a broadcast in which every worker tore
    the plugin down and set it up again (up to 0.4 s of a fit on a loaded 2-core machine), so a
    warm cluster's next fit skips it.  The scheduler is told apart by its id (a scheduler restarted
    at the same address has another); any change of the workers (a host lost and replaced, a
    worker joining) registers again: on the multi-host test bed a worker that came back after its
    host was killed trained without the plugin's handlers otherwise (tests/system/test_multihost.py).
    """
    with _REGISTERING:  # concurrent fits (a threaded search): one broadcast, not one tearing down another's
        identity = scheduler_info(client)
        seen = (identity.get("id"), frozenset(identity.get("workers", {})))
        known = _REGISTERED.setdefault(client, {})
        if seen[0] is not None and known.get(name) == seen:
            return False
        if register is None:
            client.register_plugin(make_plugin(), name=name)
        else:
            register(client, make_plugin(), name)
        known[name] = seen
        return True


def register_worker_plugin(client: Client, plugin, name: str) -> None:
    """``client.register_plugin(plugin, name=name)`` for a worker plugin, surviving a worker lost meanwhile.

    The scheduler sends the plugin to every worker it lists.  When one of them is lost mid-broadcast
    (a host gone or cut off before the scheduler dropped it: the broadcast's connection closes when
    the scheduler removes the worker), the scheduler takes the broadcast's ``CommClosedError`` for
    its caller's and closes the client's connection (``distributed.core.Server.handle_comm``): the
    client raises ``CommClosedError`` (an ``OSError``) although the scheduler is up.  The worker is
    gone from the scheduler by then, so the registration is sent again if the scheduler answers
    (``client.nthreads()``, on a new connection); if it does not answer, that error is raised.
    """
    for attempt in range(1, PLUGIN_ATTEMPTS + 1):
        try:
            client.register_plugin(plugin, name=name)
            return
        except OSError as err:  # CommClosedError included
            if attempt == PLUGIN_ATTEMPTS:
                raise
            client.nthreads()  # raises where the scheduler itself is lost (scheduler_info would not)
            logger.warning("registering worker plugin %s failed (%s: %s), a worker was likely lost "
                           "mid-broadcast; registering again", name, type(err).__name__, err)


def heal(client: Client, gone: set[str]) -> None:
    """Let the cluster replace workers it lost (preempted jobs, lifetimes).

    SpecCluster keeps the spec of a job that died and resubmits it only after
    ``lost-worker-timeout`` (dask-jobqueue's default, minutes); dropping the specs of the
    workers that are ``gone`` (by name) makes the allocator's adaptive submit replacements now.  Kept: the specs of workers still starting or queued, of running nannies
    (restarting their worker already), and of workers the scheduler still lists (on a shared
    cluster, the embedded one, another fit may be training on a worker this fit left out).
    """
    cluster = getattr(client, "cluster", None)
    if cluster is None or not hasattr(cluster, "scale"):
        return
    specs = getattr(cluster, "worker_spec", {})
    # A name the scheduler still lists is alive (a worker this fit gave up on, or another fit's on a
    # shared cluster): only the specs of workers the scheduler dropped are scaled down.
    registered = {str(w.get("name")) for w in scheduler_info(client)["workers"].values()}
    dead = [
        name for name in specs
        if (str(name) in gone or any(g.startswith(f"{name}-") for g in gone))
        and not any(r == str(name) or r.startswith(f"{name}-") for r in registered)
        and not _restarting(getattr(cluster, "workers", {}).get(name))
    ]
    if dead and hasattr(cluster, "scale_down"):
        cluster.sync(cluster.scale_down, dead)


def _restarting(worker) -> bool:
    """Whether a spec's worker is a running nanny, which restarts its dead worker process itself
    (in about the time a process takes to import torch): stopping it would start a new one from
    nothing, and a nanny stopped mid-restart has left a replacement unregistered for minutes."""
    return isinstance(worker, Nanny) and worker.status == Status.running


@contextlib.contextmanager
def training_client(client: Client | None, policy: ClusterPolicy, first_batch: int | None):
    """The client a fit trains on: ``client`` as given, or (None) the embedded cluster's, with the
    workers the fit starts with (:meth:`ClusterPolicy.first_workers`).  Yields ``(client, policy)``;
    on the embedded cluster the policy is ``shared``."""
    if client is not None:
        yield client, policy
        return
    with embedded.embedded_client(policy.first_workers(first_batch), timeout=policy.worker_timeout) as shared:
        yield shared, dataclasses.replace(policy, shared=True)


@contextlib.contextmanager
def reading_client(client: Client | None, policy: ClusterPolicy, workers_read: bool):
    """The client whose workers read the data before training.  Yields ``(client, policy)``:
    ``client`` as given, or (None, when ``workers_read``: a torch Dataset) the embedded cluster's,
    taken now and shared; else None, and the training takes the embedded cluster later."""
    if client is not None or not workers_read:
        yield client, policy
        return
    with training_client(None, policy, None) as taken:
        yield taken


def active_client() -> Client | None:
    """The current Dask client (also inside a task), or None."""
    from distributed import default_client, get_client

    for find in (default_client, get_client):
        with contextlib.suppress(ValueError):
            return find()
    return None


def as_current(client: Client | None):
    """``client.as_current()``, or nothing to do without a client."""
    return client.as_current() if client is not None else contextlib.nullcontext()
