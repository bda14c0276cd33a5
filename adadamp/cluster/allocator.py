"""The allocator itself: a scheduler plugin holding one record per fit, and its handlers.

The scheduler is the one place every fit can reach (from threads, joblib's processes, other
clients), so the allocator lives there; its handlers are reached over Dask's comm by fits and by
:class:`~adadamp.cluster.AllocatorAdaptive`, and check their arguments before they change anything.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import dask
from dask.utils import parse_timedelta
from distributed.diagnostics.plugin import SchedulerPlugin

from ..records import to_message
from .division import divide, lend, shares

logger = logging.getLogger("adadamp.cluster.allocator")

NAME = "adadamp-allocator"
LEASE = 30.0  #: seconds a grant lasts without a renewal (a fit renews it every membership look)
#: A worker that retires at its lifetime has its replacement asked for this many seconds ahead while
#: the cluster's worker start is not measured yet; then twice that start, and a second.
LIFETIME_LEAD = 10.0
#: Where a worker tells its life in the scheduler's metadata (``Scheduler.set_metadata``), under its
#: address: ``{"created": ..., "ends": ...}``, seconds since the epoch on its clock (``ends`` None
#: without a lifetime).  Metadata, not a handler of the allocator: a worker set up before the
#: allocator exists (or on a scheduler that never has one) tells it all the same.
LIFE_KEY = ("adadamp", "worker-life")
MAX_START = 600.0  #: seconds; a worker's start told above this is not kept (clocks apart, a stopped process)
STARTS_KEPT = 16  #: the latest workers' starts whose median is the start latency before a growth is measured


#: Default of dask config ``adadamp.cluster.idle-timeout``: long enough that a search's next candidates
#: find the workers warm while joblib's processes start (a warm SLURM allocation lost its 4 jobs at 30 s).
IDLE_TIMEOUT = "2 minutes"


def idle_timeout() -> float:
    """Seconds a worker no fit holds stays in a cluster the allocator sizes (dask config
    ``adadamp.cluster.idle-timeout``)."""
    value = dask.config.get("adadamp.cluster.idle-timeout", IDLE_TIMEOUT)
    try:
        return float(parse_timedelta(value))
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"dask config adadamp.cluster.idle-timeout={value!r} is not a duration: give seconds or "
                         "a string such as '30 s'.") from err


@dataclass
class FitEntry:
    """One fit the allocator divides the cluster for: what it declared and what it holds."""

    client: str | None  #: the id of the Dask client that declared it (its fits end when it leaves)
    want: int  #: workers it trains on now
    ahead: int  #: workers it will want about one worker start ahead (>= want)
    most: int  #: its max_workers
    least: int  #: its min_workers
    scaled: bool  #: it asked the cluster to grow for it (scale_cluster)
    speedups: list[float] | None  #: its predicted speedup on 1, 2, ... workers (Goodput)
    borrow: int  #: how many more workers would shorten its updates
    renewed: float  #: when it last renewed its lease (time.monotonic)
    grant: list[str] = field(default_factory=list)
    lent: list[str] = field(default_factory=list)  #: workers no fit wants, lent to it (no one's share)


@dataclass
class GrantReply:
    """What ``adadamp_allocate`` answers a fit: its grant and what the fit needs to plan ahead.

    A plain dict on the wire (:func:`~adadamp.records.to_message`); the fit's
    :class:`~adadamp.cluster.grant.Grant` makes it this record again.

    Examples
    --------
    >>> from adadamp.records import to_message
    >>> to_message(GrantReply(None, start_latency=4.5))  # the allocator holds no such fit
    {'grant': None, 'lent': [], 'share': None, 'others': 0, 'start_latency': 4.5, 'adapted_ago': None}
    """

    grant: list[str] | None  #: the fit's workers, those lent to it included (None: it ended, or its lease ran out)
    lent: list[str] = field(default_factory=list)  #: the workers of ``grant`` lent to it (in no one's share)
    share: int | None = None  #: the most workers the fit may have, its fair share (None: those it holds)
    others: int = 0  #: the other fits the allocator divides the cluster among
    start_latency: float | None = None  #: seconds the cluster took to bring workers asked for (None: not measured)
    adapted_ago: float | None = None  #: seconds since an adaptive last asked for the cluster's target (None: never)


MAX_COUNT = 65536  #: the most workers any count a fit declares may name
MAX_FITS_PER_CLIENT = 256  #: fits one client may have declared at once (a search's concurrent candidates)
_MAX_ID = 128  #: characters of a fit id


def _count(handler: str, name: str, value, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise ValueError(f"{handler}: {name}={value!r} is not an integer in [{least}, {MAX_COUNT}]")
    return value


def _number(handler: str, name: str, value, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{handler}: {name}={value!r} is not a finite number >= 0" + (" or None" if optional else ""))
    return float(value)


class Allocator(SchedulerPlugin):
    """The scheduler's allocator: each fit's wants and grant (:class:`FitEntry`), and when each
    worker was last held.

    Handlers (called by fits and by :class:`AllocatorAdaptive` over Dask's comm):
    ``adadamp_allocate(fit, want, ahead, borrow)`` declares or renews a fit's wants and answers its
    grant (a :class:`GrantReply`, the workers lent to it included);
    ``adadamp_release_grant(fit)`` ends it; ``adadamp_target(maximum)`` and
    ``adadamp_workers_to_close(target)`` size the cluster.  Every handler checks its arguments before
    it changes anything (a malformed message from one client is refused, never kept), and a client
    may hold at most :data:`MAX_FITS_PER_CLIENT` fits.
    """

    name = NAME

    def __init__(self):
        self.idle = math.inf  # seconds a worker no fit holds is kept (the adaptive says, each time it asks)
        self.fits: dict[str, FitEntry] = {}  # in arrival order
        self.free_since: dict[str, float] = {}  # worker -> when it was last held (or joined)
        self.capacity = math.inf  # the most workers the cluster may have (the adaptive's maximum)
        self.sized = False  # an AllocatorAdaptive reports: the cluster grows for the wants
        self.adapted: float | None = None  # when an adaptive last asked for the target (time.monotonic)
        self.asked: tuple[float, int] | None = None  # (when, how many) the target last rose above the live workers
        self.start_latency: float | None = None  # seconds the cluster took to bring workers asked for
        self.ends: dict[str, float] = {}  # worker -> when it retires at its lifetime (time.monotonic), as it told
        self.starts: list[float] = []  # seconds the latest workers' processes took to register (as they told)
        self._started: set[str] = set()  # the workers whose start is counted in ``starts``
        self.scheduler = None

    @property
    def grants(self) -> dict[str, list[str]]:
        """Each fit's granted workers (lent ones apart)."""
        return {f: e.grant for f, e in self.fits.items()}

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
        self.ends.pop(worker, None)
        self._started.discard(worker)
        for entry in self.fits.values():
            for held in (entry.grant, entry.lent):
                if worker in held:
                    held.remove(worker)
        self._divide()

    def valid_workers_downscaling(self, scheduler, workers: list) -> list:
        """Dask's ``Scheduler.workers_to_close`` picks only workers no fit trains on: what a
        dask-gateway scheduler retires on a scale-down, Dask's default ``Adaptive`` and
        ``retire_workers()`` without names (a distributed too old to call this hook picks any)."""
        held = self._held()
        return [ws for ws in workers if ws.address not in held]

    def _read_lives(self) -> None:
        """What the workers told of their lives at their set-up (:data:`LIFE_KEY` in the scheduler's
        metadata, :mod:`adadamp.worker.lifetime`): a worker's start (its process's creation to its
        registration, the scheduler's ``add-worker`` event) once; its lifetime's end each time, as
        ``self.ends``.  Until a growth is measured, the latest starts' median is the cluster's start
        latency; an end sizes the cluster for the replacement ahead (:meth:`target`), and the fit
        holding the worker moves to the replacement once it runs (:meth:`_divide`).  Values that are
        not finite numbers are ignored: anyone who reaches the scheduler may set metadata."""
        now, wall = time.monotonic(), time.time()
        for worker in self.scheduler.workers:
            life = self.scheduler.get_metadata(keys=[*LIFE_KEY, worker], default=None)
            if not isinstance(life, dict) or not _finite(created := life.get("created")):
                continue
            if worker not in self._started:
                self._started.add(worker)
                registered = [t for t, msg in self.scheduler.get_events(worker)
                              if isinstance(msg, dict) and msg.get("action") == "add-worker"]
                if registered and 0 < registered[-1] - created < MAX_START:  # two hosts' clocks: bounded
                    self.starts = [*self.starts[-(STARTS_KEPT - 1):], registered[-1] - created]
            if _finite(end := life.get("ends")):
                self.ends[worker] = now + (end - wall)

    def start_seconds(self) -> float | None:
        """Seconds the cluster takes to bring a worker: measured at its growths, else the median of
        the workers' own starts (None: neither yet)."""
        self._read_lives()
        if self.start_latency is not None or not self.starts:
            return self.start_latency
        return float(sorted(self.starts)[len(self.starts) // 2])

    def _ending(self, now: float) -> set[str]:
        """Workers whose lifetime ends within the lead a replacement needs to start (a measured
        growth: a worker's own start leaves out the queue a replacement job waits in)."""
        self._read_lives()
        lead = LIFETIME_LEAD if self.start_latency is None else 2 * self.start_latency + 1.0
        return {w for w, end in self.ends.items() if end - now < lead}

    def log_event(self, topic: str, msg) -> None:
        """A worker registers as starting and reports running a moment later (Dask's
        ``worker-status-change`` event): divide again then, so a fit that shares a worker while its
        own starts moves to it at once."""
        if isinstance(msg, dict) and msg.get("action") == "worker-status-change":
            self._divide()

    def remove_client(self, scheduler, client: str) -> None:
        """A client that left (closed, or its process killed) releases its fits' workers at once."""
        for fit in [f for f, e in self.fits.items() if e.client == client]:
            self.release(fit)

    # ------------------------------------------------------------------ fits
    def allocate(self, fit: str, want: int | None = None, ahead: int | None = None, most: int | None = None,
                 least: int = 1, client: str | None = None, scaled: bool = False,
                 speedups: list[float] | None = None, borrow: int = 0) -> dict:
        """Declare (``want``, ``ahead``; ``most`` and ``least``: its ``max_workers`` and ``min_workers``;
        ``client``: the declaring client's id, connected to this scheduler; ``scaled``: the fit had
        the cluster adapt; ``speedups``: its predicted speedup on 1, 2, ... workers; ``borrow``: how
        many workers no fit wants it would use) or renew (None) ``fit``'s wants; its grant
        (:class:`GrantReply`, as a plain dict)."""
        if not isinstance(fit, str) or not 0 < len(fit) <= _MAX_ID:
            raise ValueError(f"adadamp_allocate: fit={fit!r:.60} is not a fit id (text of 1 to {_MAX_ID} characters)")
        entry = None if want is None else self._entry(fit, want, ahead, most, least, client, scaled, speedups, borrow)
        now = time.monotonic()
        self._expire(now)
        if entry is not None:
            self.sized = self.sized or entry.scaled
            old = self.fits.get(fit)
            if old is not None:
                entry.grant, entry.lent = old.grant, old.lent
            self.fits[fit] = entry
        elif fit not in self.fits:
            return to_message(GrantReply(None, start_latency=self.start_seconds(), adapted_ago=self._adapted_ago(now)))
        entry = self.fits[fit]
        entry.renewed = now
        self._divide()
        share = shares(self._division_wants(), self._capacity(), self._speedups()).get(fit, 0)
        return to_message(GrantReply([*entry.grant, *entry.lent], list(entry.lent), share, len(self.fits) - 1,
                                     self.start_seconds(), self._adapted_ago(now)))

    def _adapted_ago(self, now: float) -> float | None:
        return None if self.adapted is None else now - self.adapted

    def _entry(self, fit, want, ahead, most, least, client, scaled, speedups, borrow) -> FitEntry:
        """A declaration checked whole, before anything changes."""
        h = "adadamp_allocate"
        want = _count(h, "want", want)
        ahead = max(want, _count(h, "ahead", want if ahead is None else ahead))
        most = _count(h, "most", ahead if most is None else most)
        least = _count(h, "least", least)
        if least > most:
            raise ValueError(f"{h}: least={least} is above most={most} (min_workers above max_workers)")
        borrow = _count(h, "borrow", borrow or 0)
        if not isinstance(scaled, bool):
            raise TypeError(f"{h}: scaled={scaled!r:.60} is not True or False")
        if speedups is not None:
            if not isinstance(speedups, list | tuple) or len(speedups) > MAX_COUNT or not all(
                    not isinstance(v, bool) and isinstance(v, int | float) and 0 <= v < math.inf for v in speedups):
                raise ValueError(f"{h}: speedups={speedups!r:.60} is not a list of at most {MAX_COUNT} finite "
                                 "numbers >= 0")
            speedups = [float(v) for v in speedups] or None
        if client is not None:
            if not isinstance(client, str) or client not in self.scheduler.clients:
                raise ValueError(f"{h}: client={client!r:.60} is not a client connected to this scheduler")
            if fit not in self.fits and sum(e.client == client for e in self.fits.values()) >= MAX_FITS_PER_CLIENT:
                raise ValueError(f"{h}: the client {client} holds {MAX_FITS_PER_CLIENT} fits already (the most one "
                                 "client may have at once); end some first")
        elif fit not in self.fits and sum(e.client is None for e in self.fits.values()) >= MAX_FITS_PER_CLIENT:
            raise ValueError(f"{h}: {MAX_FITS_PER_CLIENT} fits declared with no client already; pass client=")
        return FitEntry(client=client, want=want, ahead=ahead, most=most, least=least, scaled=scaled,
                        speedups=speedups, borrow=borrow, renewed=time.monotonic())

    def _speedups(self) -> dict[str, list[float]]:
        return {f: e.speedups for f, e in self.fits.items() if e.speedups}

    def _division_wants(self) -> dict[str, int]:
        """What each fit's share is cut from: what it wants ahead, or, for a fit that predicts its
        speedup, every worker it may use (its curve says what more would give it)."""
        return {f: (e.most if e.speedups else e.ahead) for f, e in self.fits.items()}

    def release(self, fit: str) -> None:
        entry = self.fits.pop(fit, None) if isinstance(fit, str) else None
        if entry is None:
            return
        now = time.monotonic()
        for w in [*entry.grant, *entry.lent]:
            self.free_since[w] = now
        self._divide()

    def _expire(self, now: float) -> None:
        for fit in [f for f, e in self.fits.items() if now - e.renewed > LEASE]:
            logger.info("the fit %s renewed its workers for %.0f s: releasing them", fit, LEASE)
            self.release(fit)

    def _divide(self) -> None:
        if self.scheduler is None:
            return
        wants = {f: e.ahead for f, e in self.fits.items()}  # ahead: the workers a fit sets up beforehand too
        before = self._held()
        speedups = self._speedups()
        potential = {f: self.fits[f].most for f in speedups}
        ending = self._ending(time.monotonic())
        live = sorted(self._live(), key=lambda w: w in ending)  # a worker about to retire is handed out last
        grants = divide(live, wants, _handed_over(self.grants, live, ending), self._capacity(),
                        {f: e.least for f, e in self.fits.items()}, speedups, potential)
        lent = lend(live, grants, {f: e.borrow for f, e in self.fits.items()},
                    {f: e.lent for f, e in self.fits.items()})
        for f, entry in self.fits.items():
            entry.grant, entry.lent = grants[f], lent.get(f, [])
        now = time.monotonic()
        held = self._held()
        for w in held | before:
            self.free_since[w] = now  # held now, or just given back

    def _held(self) -> set[str]:
        """The workers some fit trains on: granted, or lent."""
        return {w for e in self.fits.values() for w in (*e.grant, *e.lent)}

    def _capacity(self) -> float:
        """The workers to divide: a cluster that grows for the wants divides its bound (the
        adaptive's maximum where one was given, else the largest ``max_workers`` of the fits); a
        fixed one, the workers it has."""
        most = max((e.most for e in self.fits.values()), default=0)
        bound = (self.capacity if math.isfinite(self.capacity) else most) if self.sized else 0
        return max(bound, len(self._live()))

    # ------------------------------------------------------------------ sizing
    def target(self, maximum: float | None = None, minimum: int = 0, idle: float | None = None,
               planned: int | None = None) -> int:
        """Workers the cluster should have: what the fits that scale the cluster want ahead (a fit
        with ``scale_cluster=False`` counts the workers it holds: it never grows the cluster), and
        the workers no fit holds that are still within their ``idle`` seconds (kept warm), within
        ``[minimum, maximum]``.  Workers held or kept warm keep the target from falling, never make
        it grow past the ``planned`` workers (the cluster's plan): the user's ``cluster.scale(0)``
        after a fit is not undone by its workers still closing."""
        maximum = _number("adadamp_target", "maximum", maximum)
        minimum = _count("adadamp_target", "minimum", minimum)
        idle = _number("adadamp_target", "idle", idle)
        planned = None if planned is None else _count("adadamp_target", "planned", planned)
        self.sized = True
        self.adapted = time.monotonic()
        self.idle = math.inf if idle is None else idle
        self.capacity = math.inf if maximum is None else maximum
        now = time.monotonic()
        self._expire(now)
        held = self._held()  # a lent worker is kept while it trains, never asked for
        # a held worker about to retire at its lifetime is replaced ahead (the adaptive's maximum bounds it)
        replacing = len(held & self._ending(now))
        wanted = sum(e.ahead if e.scaled else len(e.grant) for e in self.fits.values())
        live = self._live()
        warm = [w for w in live if w not in held and now - self.free_since.get(w, now) < self.idle]
        # The bound limits growth; workers held or still warm stay until their idle time is over.
        kept = len(held) + len(warm) if planned is None else min(len(held) + len(warm), planned)
        n = int(max(min(wanted, self._capacity()) + replacing, kept, minimum))
        if n > len(live) and self.asked is None:
            self.asked = (now, n)
        self._divide()
        return n

    def workers_to_close(self, target: int) -> list[str]:
        """Names of workers to retire down to ``target``: only workers no fit holds, idle longest first."""
        target = _count("adadamp_workers_to_close", "target", target)
        held = self._held()
        live = self._live()
        idle = [w for w in reversed(live) if w not in held]  # idle longest first
        excess = max(0, len(live) - target)
        return [self.scheduler.workers[w].name for w in idle[:excess]]


def _handed_over(held: dict[str, list[str]], live: list[str], ending: set[str]) -> dict[str, list[str]]:
    """``held`` without the workers about to retire that a running worker no fit holds can replace
    (one each, in ``live``'s order): the division then grants the replacement in their place."""
    taken = {w for grant in held.values() for w in grant}
    fresh = [w for w in live if w not in taken and w not in ending]
    out = {}
    for fit, grant in held.items():
        out[fit] = []
        for w in grant:
            if w in ending and fresh:
                fresh.pop(0)
            else:
                out[fit].append(w)
    return out


def _finite(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
