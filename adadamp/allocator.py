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
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref

import dask
from dask.utils import parse_timedelta
from distributed.deploy.adaptive import Adaptive
from distributed.diagnostics.plugin import SchedulerPlugin

from .wire.identity import scheduler_info

logger = logging.getLogger(__name__)

NAME = "adadamp-allocator"
LEASE = 30.0  #: seconds a grant lasts without a renewal (a fit renews it every membership look)
IDLE_TIMEOUT = "30 s"  #: default of dask config ``adadamp.cluster.idle-timeout``


def idle_timeout() -> float:
    """Seconds a worker no fit holds stays in a cluster the allocator sizes (dask config
    ``adadamp.cluster.idle-timeout``)."""
    value = dask.config.get("adadamp.cluster.idle-timeout", IDLE_TIMEOUT)
    try:
        return float(parse_timedelta(value))
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"dask config adadamp.cluster.idle-timeout={value!r} is not a duration: give seconds or "
                         "a string such as '30 s'.") from err


def shares(wants: dict[str, int], capacity: float, speedups: dict[str, list[float]] | None = None) -> dict[str, int]:
    """Max-min fair shares of ``capacity`` workers among fits that want ``wants`` (in the dict's
    order: the earlier fit gets a remainder first); the fits with a predicted speedup curve
    (``speedups``) then divide their shares together by it (:func:`by_speedup`).

    Examples
    --------
    >>> shares({"a": 6, "b": 1, "c": 4}, 8)
    {'a': 4, 'b': 1, 'c': 3}
    >>> shares({"a": 2, "b": 3}, math.inf)
    {'a': 2, 'b': 3}
    >>> shares({"a": 4, "b": 4}, 4, speedups={"a": [1, 1.1, 1.2, 1.3], "b": [1, 2, 3, 3.9]})
    {'a': 1, 'b': 3}
    """
    fair = _fair(wants, capacity)
    return fair if not speedups else by_speedup(fair, wants, speedups)


def by_speedup(fair: dict[str, int], wants: dict[str, int], speedups: dict[str, list[float]]) -> dict[str, int]:
    """The fair shares of the fits with a speedup curve pooled and dealt again among them: one
    worker each, then one at a time to the fit whose predicted speedup grows most with it.

    ``speedups[f][k - 1]`` is fit ``f``'s predicted speedup (goodput against one worker's) on
    ``k`` workers.  Pollux re-divides a cluster to maximize the sum of its jobs' speedups (Qiao et
    al. OSDI'21, section 4.2); on curves that grow less with each worker, this greedy deal is that
    maximum.  A worker no fit's speedup grows with stays in no share (the others' fair shares
    stand).  Here a share changes between two updates, where Pollux restarts the job.
    """
    fits = [f for f in wants if wants[f] > 0 and speedups.get(f)]
    pool = sum(fair[f] for f in fits)
    out = {f: (0 if f in fits else n) for f, n in fair.items()}
    for f in fits:
        if pool >= 1:
            out[f], pool = 1, pool - 1
    while pool >= 1:
        gain = {f: speedups[f][out[f]] - speedups[f][out[f] - 1] for f in fits
                if 0 < out[f] < min(wants[f], len(speedups[f]))}
        best = max(gain, key=lambda f: (gain[f], -fits.index(f)), default=None)
        if best is None or gain[best] <= 0:
            break
        out[best] += 1
        pool -= 1
    return out


def _fair(wants: dict[str, int], capacity: float) -> dict[str, int]:
    if math.isinf(capacity):
        return {f: max(0, w) for f, w in wants.items()}
    left, out = capacity, dict.fromkeys(wants, 0)
    hungry = [f for f, w in wants.items() if w > 0]
    while hungry and left >= 1:
        each = max(1, int(left // len(hungry)))
        for f in list(hungry):
            give = min(each, wants[f] - out[f], left)
            out[f] += int(give)
            left -= give
            if out[f] >= wants[f]:
                hungry.remove(f)
            if left < 1:
                break
    return out


def divide(workers: list[str], wants: dict[str, int], held: dict[str, list[str]], capacity: float,
           least: dict[str, int] | None = None, speedups: dict[str, list[float]] | None = None,
           potential: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Disjoint grants of ``workers`` (live, in the order to hand them out) to the fits' ``wants``.

    ``speedups`` and ``potential``: the fits that predict their speedup divide by it
    (:func:`shares`) what they could use (``potential``, their ``max_workers``), and are granted
    at most what they want now.

    Each fit keeps the workers it ``held`` up to its share of ``capacity`` (the most workers the
    cluster may have); free workers go to the fits below their share, earliest fit first.  A fit
    left below its ``least`` workers (its ``min_workers``; one for any fit that wants some: its
    workers are still starting, or there are more fits than workers) shares the least shared
    workers meanwhile, rather than wait or train on fewer than it was told to.

    Examples
    --------
    >>> divide(["w1", "w2", "w3"], {"a": 3, "b": 1}, {"a": ["w1", "w2", "w3"]}, capacity=8)  # b's worker is starting
    {'a': ['w1', 'w2', 'w3'], 'b': ['w1']}
    >>> divide(["w1", "w2", "w3"], {"a": 3, "b": 1}, {"a": ["w1", "w2", "w3"]}, capacity=3)
    {'a': ['w1', 'w2'], 'b': ['w3']}
    >>> divide(["w1"], {"a": 1, "b": 1}, {"a": ["w1"]}, capacity=1)
    {'a': ['w1'], 'b': ['w1']}
    >>> divide(["w1", "w2"], {"a": 2, "b": 2}, {}, capacity=2, least={"a": 2, "b": 2})
    {'a': ['w1', 'w2'], 'b': ['w2', 'w1']}
    """
    share = shares({**wants, **(potential or {})}, max(capacity, len(workers)), speedups)
    share = {f: min(share[f], w) for f, w in wants.items()}
    live, taken = set(workers), set()
    grants = {}
    for fit in wants:
        kept = [w for w in held.get(fit, []) if w in live and w not in taken][: share[fit]]
        grants[fit] = kept
        taken.update(kept)
    free = [w for w in workers if w not in taken]
    for fit in wants:
        need = share[fit] - len(grants[fit])
        if need > 0:
            grants[fit] += free[:need]
            free = free[need:]
    least = least or {}
    for fit, want in wants.items():
        floor = min(len(workers), max(least.get(fit, 0), 1 if want > 0 else 0))
        while len(grants[fit]) < floor:
            load = {w: sum(w in g for g in grants.values()) for w in workers if w not in grants[fit]}
            grants[fit] = [*grants[fit], min(load, key=lambda w: (load[w], workers.index(w)))]
    return grants


def lend(workers: list[str], grants: dict[str, list[str]], borrow: dict[str, int],
         lent: dict[str, list[str]]) -> dict[str, list[str]]:
    """The ``workers`` no grant holds, lent to the fits that can use more (``borrow``: how many
    more each), one worker at a time in the fits' order; a fit keeps the workers it was ``lent``
    before while they are still free.

    Examples
    --------
    >>> lend(["w1", "w2", "w3", "w4"], {"a": ["w1"], "b": ["w2"]}, {"a": 3, "b": 0}, {})
    {'a': ['w3', 'w4']}
    >>> lend(["w1", "w2", "w3"], {"a": ["w1"], "b": ["w3"]}, {"a": 1}, {"a": ["w3"]})  # b wants w3 now
    {'a': ['w2']}
    """
    held = {w for g in grants.values() for w in g}
    free = [w for w in workers if w not in held]
    out = {f: [w for w in lent.get(f, []) if w in free][:n] for f, n in borrow.items() if n > 0}
    free = [w for w in free if not any(w in g for g in out.values())]
    while free:
        hungry = [f for f in out if len(out[f]) < borrow[f]]
        if not hungry:
            break
        for f in hungry[: len(free)]:
            out[f].append(free.pop(0))
    return out


class Allocator(SchedulerPlugin):
    """The scheduler's allocator: each fit's wants and grant, and when each worker was last held.

    Handlers (called by fits and by :class:`AllocatorAdaptive` over Dask's comm):
    ``adadamp_allocate(fit, want, ahead, borrow)`` declares or renews a fit's wants and returns its
    grant (the workers lent to it included);
    ``adadamp_release_grant(fit)`` ends it; ``adadamp_target(maximum)`` and
    ``adadamp_workers_to_close(target)`` size the cluster.
    """

    name = NAME

    def __init__(self):
        self.idle = math.inf  # seconds a worker no fit holds is kept (the adaptive says, each time it asks)
        self.wants: dict[str, tuple[int, int]] = {}  # fit -> (now, ahead), in arrival order
        self.most: dict[str, int] = {}  # fit -> its max_workers
        self.least: dict[str, int] = {}  # fit -> its min_workers
        self.scaled: dict[str, bool] = {}  # fit -> whether it asked the cluster to grow for it (scale_cluster)
        self.speedups: dict[str, list[float]] = {}  # fit -> its predicted speedup on 1, 2, ... workers (Goodput)
        self.clients: dict[str, str] = {}  # fit -> the id of the Dask client that declared it
        self.grants: dict[str, list[str]] = {}
        self.borrow: dict[str, int] = {}  # fit -> how many more workers would shorten its updates
        self.lent: dict[str, list[str]] = {}  # fit -> workers no fit wants, lent to it (no one's share)
        self.renewed: dict[str, float] = {}
        self.free_since: dict[str, float] = {}  # worker -> when it was last held (or joined)
        self.capacity = math.inf  # the most workers the cluster may have (the adaptive's maximum)
        self.sized = False  # an AllocatorAdaptive reports: the cluster grows for the wants
        self.asked: tuple[float, int] | None = None  # (when, how many) the target last rose above the live workers
        self.start_latency: float | None = None  # seconds the cluster took to bring workers asked for
        self.scheduler = None

    def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update({
            "adadamp_allocate": self.allocate,
            "adadamp_release_grant": self.release,
            "adadamp_target": self.target,
            "adadamp_workers_to_close": self.workers_to_close,
        })

    # ------------------------------------------------------------------ workers
    def _live(self) -> list[str]:
        """Running workers, the most recently held first: a worker a fit just gave back is the
        warmest for the next (its kept all-reduce group, its copy of the data); then by address."""
        workers = [a for a, ws in self.scheduler.workers.items() if getattr(ws.status, "name", "running") == "running"]
        return sorted(workers, key=lambda w: (-self.free_since.get(w, 0.0), w))

    def add_worker(self, scheduler, worker: str) -> None:
        self.free_since[worker] = time.monotonic()
        if self.asked is not None and len(scheduler.workers) >= self.asked[1]:
            seconds = time.monotonic() - self.asked[0]
            self.start_latency = seconds if self.start_latency is None else max(0.5 * self.start_latency, seconds)
            self.asked = None
        self._divide()

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        self.free_since.pop(worker, None)
        for grant in [*self.grants.values(), *self.lent.values()]:
            if worker in grant:
                grant.remove(worker)
        self._divide()

    def log_event(self, topic: str, msg) -> None:
        """A worker registers as starting and reports running a moment later (Dask's
        ``worker-status-change`` event): divide again then, so a fit that shares a worker while its
        own starts moves to it at once."""
        if isinstance(msg, dict) and msg.get("action") == "worker-status-change":
            self._divide()

    def remove_client(self, scheduler, client: str) -> None:
        """A client that left (closed, or its process killed) releases its fits' workers at once."""
        for fit in [f for f, c in self.clients.items() if c == client]:
            self.release(fit)

    # ------------------------------------------------------------------ fits
    def allocate(self, fit: str, want: int | None = None, ahead: int | None = None, most: int | None = None,
                 least: int = 1, client: str | None = None, scaled: bool = False,
                 speedups: list[float] | None = None, borrow: int = 0) -> dict:
        """Declare (``want``, ``ahead``; ``most`` and ``least``: its ``max_workers`` and ``min_workers``;
        ``client``: the declaring client's id; ``scaled``: the fit had the cluster adapt;
        ``speedups``: its predicted speedup on 1, 2, ... workers; ``borrow``: how many workers no fit
        wants it would use) or renew (None) ``fit``'s wants; its grant (``lent``: the workers of it
        lent, :func:`lend`) and what the fit needs to plan ahead (``share``: the most workers it may
        have)."""
        now = time.monotonic()
        self._expire(now)
        self.sized = self.sized or scaled
        if want is not None:
            if client is not None:
                self.clients[fit] = client
            self.wants[fit] = (int(want), max(int(want), int(ahead or want)))
            self.most[fit] = int(most or self.wants[fit][1])
            self.least[fit] = int(least)
            self.scaled[fit] = bool(scaled)
            self.borrow[fit] = max(0, int(borrow or 0))
            if speedups:
                self.speedups[fit] = [float(v) for v in speedups]
            else:
                self.speedups.pop(fit, None)
        elif fit not in self.wants:
            return {"grant": None, "start_latency": self.start_latency}  # ended, or lost its lease
        self.renewed[fit] = now
        self._divide()
        share = shares(self._division_wants(), self._capacity(), self.speedups).get(fit, 0)
        lent = list(self.lent.get(fit, []))
        return {"grant": [*self.grants.get(fit, []), *lent], "lent": lent, "share": share,
                "others": len(self.wants) - 1, "start_latency": self.start_latency}

    def _division_wants(self) -> dict[str, int]:
        """What each fit's share is cut from: what it wants ahead, or, for a fit that predicts its
        speedup, every worker it may use (its curve says what more would give it)."""
        return {f: (self.most[f] if f in self.speedups else w[1]) for f, w in self.wants.items()}

    def release(self, fit: str) -> None:
        self.wants.pop(fit, None)
        self.most.pop(fit, None)
        self.least.pop(fit, None)
        self.scaled.pop(fit, None)
        self.speedups.pop(fit, None)
        self.clients.pop(fit, None)
        self.renewed.pop(fit, None)
        self.borrow.pop(fit, None)
        now = time.monotonic()
        for w in [*self.grants.pop(fit, []), *self.lent.pop(fit, [])]:
            self.free_since[w] = now
        self._divide()

    def _expire(self, now: float) -> None:
        for fit in [f for f, t in self.renewed.items() if now - t > LEASE]:
            logger.info("the fit %s renewed its workers for %.0f s: releasing them", fit, LEASE)
            self.release(fit)

    def _divide(self) -> None:
        if self.scheduler is None:
            return
        wants = {f: w[1] for f, w in self.wants.items()}  # ahead: the workers a fit sets up beforehand too
        before = self._held()
        potential = {f: self.most[f] for f in self.speedups if f in self.wants}
        live = self._live()
        self.grants = divide(live, wants, self.grants, self._capacity(), self.least, self.speedups, potential)
        self.lent = lend(live, self.grants, {f: self.borrow.get(f, 0) for f in self.wants}, self.lent)
        now = time.monotonic()
        held = self._held()
        for w in held | before:
            self.free_since[w] = now  # held now, or just given back

    def _held(self) -> set[str]:
        """The workers some fit trains on: granted, or lent."""
        return {w for g in [*self.grants.values(), *self.lent.values()] for w in g}

    def _capacity(self) -> float:
        """The workers to divide: a cluster that grows for the wants divides its bound (the
        adaptive's maximum where one was given, else the largest ``max_workers`` of the fits); a
        fixed one, the workers it has."""
        bound = (self.capacity if math.isfinite(self.capacity) else max(self.most.values(), default=0)) if self.sized else 0
        return max(bound, len(self._live()))

    # ------------------------------------------------------------------ sizing
    def target(self, maximum: float | None = None, minimum: int = 0, idle: float | None = None) -> int:
        """Workers the cluster should have: what the fits that scale the cluster want ahead (a fit
        with ``scale_cluster=False`` counts the workers it holds: it never grows the cluster), and
        the workers no fit holds that are still within their ``idle`` seconds (kept warm), within
        ``[minimum, maximum]``."""
        self.sized = True
        self.idle = math.inf if idle is None else idle
        self.capacity = math.inf if maximum is None else maximum
        now = time.monotonic()
        self._expire(now)
        wanted = sum(ahead if self.scaled.get(f) else len(self.grants.get(f, ())) for f, (_, ahead) in self.wants.items())
        held = self._held()  # a lent worker is kept while it trains, never asked for
        live = self._live()
        warm = [w for w in live if w not in held and now - self.free_since.get(w, now) < self.idle]
        # The bound limits growth; workers held or still warm stay until their idle time is over.
        n = int(max(min(wanted, self._capacity()), len(held) + len(warm), minimum))
        if n > len(live) and self.asked is None:
            self.asked = (now, n)
        self._divide()
        return n

    def workers_to_close(self, target: int) -> list[str]:
        """Names of workers to retire down to ``target``: only workers no fit holds, idle longest first."""
        held = self._held()
        live = self._live()
        idle = [w for w in reversed(live) if w not in held]  # idle longest first
        excess = max(0, len(live) - target)
        return [self.scheduler.workers[w].name for w in idle[:excess]]


class AllocatorAdaptive(Adaptive):
    """Dask's ``Adaptive`` sized by the allocator: the sum of the fits' wants, shrinking lazily
    and only through workers no fit holds (``Adaptive`` keeps its ``wait_count`` hysteresis and
    retires gracefully)."""

    idle: float | None = None  #: seconds a worker no fit holds is kept (None: dask config adadamp.cluster.idle-timeout)

    async def target(self) -> int:
        maximum = None if math.isinf(self.maximum) else int(self.maximum)
        idle = idle_timeout() if self.idle is None else self.idle
        return await self.scheduler.adadamp_target(maximum=maximum, minimum=int(self.minimum),
                                                   idle=None if math.isinf(idle) else idle)

    async def workers_to_close(self, target: int) -> list[str]:
        return await self.scheduler.adadamp_workers_to_close(target=target)


_ADAPTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cluster -> its AllocatorAdaptive
_LOCK = threading.Lock()


def _adapting(adaptive: Adaptive) -> bool:
    """Whether ``adaptive`` was not stopped: ``Adaptive.state`` from distributed 2024.12.0 on; before
    it, ``stop()`` drops the periodic callback that ``__init__`` made."""
    state = getattr(adaptive, "state", None)
    return state != "stopped" if state is not None else adaptive.periodic_callback is not None


def adapt(cluster, minimum: int | None = None, maximum: float | None = None, interval: float = 0.5,
          idle: float | None = None) -> AllocatorAdaptive | None:
    """Size ``cluster`` (a LocalCluster, a dask-jobqueue cluster: any ``SpecCluster``) for the
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


class Grant:
    """One fit's grant, as the allocator last answered: its workers (None until the first answer
    or when the allocator forgot the fit) and the cluster's measured worker start time."""

    def __init__(self, client, fit: str, bounds: tuple[int, int], scaled: bool):
        self.client, self.fit, self.scaled = client, fit, scaled
        self.least, self.most = bounds  # the fit's min_workers and max_workers
        self.workers: set[str] | None = None
        self.share = 0  # the workers the fit's fair share allows (its want when the cluster has room)
        self.others = 0  # the other fits the allocator divides the cluster among
        self.start_latency: float | None = None
        self.declared: tuple[int, int] | None = None
        self.speedups: list[float] | None = None  # the damper's predicted speedup on 1, 2, ... workers
        self._sent_speedups: list[float] | None = None
        self.borrow = 0  # how many workers no fit wants this fit would use (its update-time model says)
        self._sent_borrow = 0
        self.lent: list[str] = []  # the workers of the grant lent to the fit (no one's share)

    def declare(self, want: int, ahead: int) -> None:
        """Tell the allocator what the fit wants now and ahead (only when it, the speedups or what
        the fit would borrow changed)."""
        if (self.declared == (want, ahead) and self.workers is not None and self._sent_speedups == self.speedups
                and self._sent_borrow == self.borrow):
            return
        self.declared, self._sent_speedups, self._sent_borrow = (want, ahead), self.speedups, self.borrow
        self._take(self.client.sync(self.client.scheduler.adadamp_allocate, fit=self.fit, want=want, ahead=ahead,
                                    most=self.most, least=self.least, client=self.client.id, scaled=self.scaled,
                                    speedups=self.speedups, borrow=self.borrow))

    async def renew(self) -> None:
        """Renew the lease (the membership watcher's loop, every look); declare again if the
        allocator forgot the fit (a scheduler restart, an expired lease)."""
        if self.declared is None:  # released (a suspended partial_fit): nothing to renew
            return
        reply = await self.client.scheduler.adadamp_allocate(fit=self.fit)
        if reply["grant"] is None and self.declared is not None:
            want, ahead = self.declared
            reply = await self.client.scheduler.adadamp_allocate(fit=self.fit, want=want, ahead=ahead, most=self.most,
                                                                 least=self.least, client=self.client.id,
                                                                 scaled=self.scaled, speedups=self._sent_speedups,
                                                                 borrow=self._sent_borrow)
        self._take(reply)

    def _take(self, reply: dict) -> None:
        if reply["grant"] is not None:
            self.workers = set(reply["grant"])
            self.share = reply.get("share", len(self.workers))
            self.lent = list(reply.get("lent", []))
            self.others = reply.get("others", 0)
        self.start_latency = reply.get("start_latency")

    def release(self) -> None:
        """Give the workers back (the fit ended, or is suspended until its next ``partial_fit``)."""
        self.declared, self.workers, self.lent = None, None, []
        with contextlib.suppress(Exception):
            self.client.sync(self.client.scheduler.adadamp_release_grant, fit=self.fit)
