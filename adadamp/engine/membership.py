"""The workers of one fit: who is live, who is set up, who is left out, and asking the cluster
for more or fewer.

Each look at the scheduler's worker list (at most every ``MEMBERSHIP_INTERVAL``, or at once when
a worker is lost) drops the workers that left, sets up the ones that joined (in the background
while training runs elsewhere) and hands the new worker list to ``place`` (the engine moves the
data blocks).  Workers whose set-up keeps failing, or that hang, are left out of the fit.

On any cluster a fit trains on the workers its batch wants (:meth:`Membership.follow`:
``clip(ceil(B / grads_per_worker), min_workers, max_workers)`` or the damper's choice), among the
workers the cluster's allocator grants it (:mod:`adadamp.cluster.allocator`: disjoint from other fits'),
and leaves the others free.  Workers a coming batch will want (the schedule read ahead) are
declared to the allocator, set up in the background beforehand and wait on *standby*, so that a
growing batch takes them at once; with ``scale_cluster`` the allocator sizes the cluster for
every fit's wants.

Within its grant a fit takes first the worker its own code runs on (a fit inside a Dask task),
then the workers fewest of this process's other fits train on (:class:`Occupancy`: granted
workers are shared only by a fit below its ``min_workers``), then the others in name order.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from distributed import Client, get_worker

from ..cluster import policy as cl
from ..cluster import waiting
from ..cluster.grant import Grant
from ..exceptions import NoWorkersError, SchedulerLostError
from ..records import ReleaseRequest, SetupReply, SetupRequest
from ..wire.rpc import rpc_call
from .transport import LOST, Transport

logger = logging.getLogger(__name__)

MEMBERSHIP_INTERVAL = 0.5  # seconds between looks at the scheduler's worker list
HEAL_INTERVAL = 5.0  # seconds a shortfall of workers lasts before they are asked for again
SETUP_TRIES = 3  # failed set-ups after which a worker is left out of the fit


class Occupancy:
    """How many of this process's fits train on each worker (by address), so that concurrent fits
    on a shared cluster take different workers rather than all the first ones by name."""

    def __init__(self):
        self._lock = threading.Lock()
        self._fits: collections.Counter[str] = collections.Counter()

    def move(self, old: Iterable[str], new: Iterable[str]) -> None:
        """A fit that trained on ``old`` trains on ``new`` now."""
        with self._lock:
            self._fits.subtract(old)
            self._fits.update(new)
            self._fits = +self._fits  # drop the zeros

    def order(self, workers: Iterable[str]) -> list[str]:
        """``workers`` in the order a fit should take them: the worker this code runs in (a fit
        inside a Dask task trains where its task runs), then the least used, then by name."""
        try:
            local = get_worker().address
        except ValueError:  # not inside a Dask worker
            local = None
        with self._lock:
            return sorted(workers, key=lambda w: (w != local, self._fits[w], w))


#: This process's fits' workers.
OCCUPANCY = Occupancy()


@dataclasses.dataclass
class _Seen:
    """What one look at the worker list saw, handed from one step of :meth:`Membership._look` to the next."""

    live: dict  # the live workers granted to the fit (address -> info)
    lost: tuple[str, ...]  # workers the caller found lost (not to be taken even if listed)
    survivors: list[str]  # the training workers still live
    standby: list[str]  # the standby workers still live
    joined: list[str] = dataclasses.field(default_factory=list)  # joiners: to set up, then those set up now
    ready: list[str] = dataclasses.field(default_factory=list)  # joiners whose background set-up succeeded
    failed: list[str] = dataclasses.field(default_factory=list)  # joiners whose set-up failed

    def alive(self, worker: str) -> bool:
        return worker in self.live and worker not in self.lost


class Membership:
    """The worker list of one fit, in rank order (the order of joining).

    ``setup(worker)`` gives a worker's set-up (its RPC's arguments); ``place(workers)``
    moves the data to a new worker list and returns ``{worker: error}`` for those that could
    not take their blocks; ``n_updates()`` is for messages; ``on_setup(worker, reply)`` sees each
    set-up that succeeded.
    """

    def __init__(
        self,
        client: Client,
        policy: cl.ClusterPolicy,
        transport: Transport,
        *,
        setup: Callable[[str], SetupRequest],
        place: Callable[[list[str]], dict],
        n_updates: Callable[[], int],
        prefer: Callable[[int], int | None] = lambda batch_size: None,
        on_setup: Callable[[str, SetupReply], None] = lambda worker, reply: None,
    ):
        self.client = client
        self.policy = policy
        self.transport = transport
        self._setup = setup
        self._place = place
        self._n_updates = n_updates
        self._prefer = prefer
        self._on_setup = on_setup
        self.workers: list[str] = []
        self.lost_in_rounds: list[str] = []  # workers an update's rounds lost (dead or not answering); the engine clears it
        self.set_up: set[str] = set()  # workers that may hold this fit's state (released at the end)
        self.requested: int | None = None
        self.limit: int | None = None  # the most workers this fit trains on (None: all it finds)
        self.ahead = 0  # the workers the coming batches want, set up beforehand (those beyond ``limit`` on standby)
        self.standby: list[str] = []  # set up and connected, not training (a coming batch wants them)
        self._occupied: list[str] = []  # the workers this fit is counted on in OCCUPANCY
        self.start_latency: float | None = None  # seconds the cluster takes to bring workers asked for (the allocator measures)
        self._look_now = False  # the workers wanted rose: look at the next refresh, whatever the interval
        self._last_refresh = -math.inf
        self._known: set[str] | None = None  # live workers at the last full look
        self._latest: dict | BaseException | None = None  # the watcher's latest report
        self._pending: tuple[list[str], object] | None = None  # joiners being set up in the background
        self._strikes: dict[str, int] = {}  # failed set-ups per worker; SETUP_TRIES: left out (quarantined)
        self._errors: dict[str, BaseException] = {}  # each worker's last failure, for the error message
        self._waited_for = 0
        self._live_names: set[str] = set()
        self._gone_names: set[str] = set()
        self._short_since = math.inf  # when fewer workers than requested were first seen
        self._last_heal = -math.inf
        self.grant: Grant | None = None  # the workers the cluster's allocator grants this fit (allocate())

    def allocate(self, want: int, scaled: bool) -> None:
        """Train only on the workers the cluster's allocator grants this fit, starting with ``want``
        (``scaled``: the cluster adapts to the fits' wants)."""
        bounds = (self.policy.min_workers, self.policy.max_workers)
        self.grant = Grant(self.client, self.transport.fit_id, bounds, scaled=scaled)
        self.grant.declare(want, want)

    def _granted(self, live: dict) -> dict:
        """The live workers this fit may train on: those granted to it."""
        if self.grant is None or self.grant.workers is None:  # not yet asked for
            return live
        return {a: w for a, w in live.items() if a in self.grant.workers}

    def watch(self):
        """Start watching the scheduler's worker list; returns the watcher (cancel it to stop)."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(
            cl.watch_workers(self.client, MEMBERSHIP_INTERVAL, self._report, before=self.grant.renew), self.client.loop.asyncio_loop
        )

    def _report(self, latest: dict | BaseException) -> None:
        """The watcher's callback (client event loop)."""
        self._latest = self._granted(latest) if isinstance(latest, dict) else latest

    @property
    def latest(self) -> dict | None:
        """The running workers (address -> info) at the watcher's latest look; None before it or after an error."""
        latest = self._latest
        return latest if isinstance(latest, dict) else None

    # ------------------------------------------------------------------ looking
    def refresh(self, force: bool = False, lost: tuple[str, ...] = ()) -> None:
        """Drop lost workers, set up new ones, and place the data on the new list.

        Terminates: each pass returns, waits for a first worker (bounded by
        ``worker_timeout``, then :class:`NoWorkersError`) or strikes the workers that
        could not take their data (``SETUP_TRIES`` strikes leave a worker out).
        """
        while True:
            new = self._look(force, lost)
            if new is None:
                return
            if not new:
                self.workers = []
                self._occupy([])
                self._wait_for_workers()
                force, lost = True, ()
                continue
            if new == self.workers:
                return
            lost = self._change_to(new)
            if not lost:
                return
            force = True

    def _look(self, force: bool, lost: tuple[str, ...]) -> list[str] | None:
        """The worker list after this look (None: nothing to look at yet)."""
        if not self._due(force, lost):
            return None
        seen = self._read_live(lost)
        seen.joined = self._choose_joiners(seen)
        self._occupy([*seen.survivors, *seen.joined])  # claimed before their set-up: a concurrent fit's look takes others
        # While training runs on other workers, joiners are set up in the background and take part
        # from the first look after their set-up is done (a slow set-up never stalls an update).
        background = not force and not lost and bool(seen.survivors)
        self._finish_pending(seen, background)
        self._set_up_joiners(seen, background)
        joined = self._train_or_stand_by(seen)
        self._remember(seen)
        new = seen.survivors + joined
        if not new:
            self._refuse_if_all_quarantined(seen)
        return new

    def _due(self, force: bool, lost: tuple[str, ...]) -> bool:
        """Whether to look now: when told to, when workers were lost or joiners are set up, or
        when the interval passed and the watcher saw the worker list change."""
        now = time.monotonic()
        set_up = self._pending is not None and self._pending[1].done()  # joiners ready: take them now
        if not force and not lost and not set_up and not self._look_now:
            if now - self._last_refresh < MEMBERSHIP_INTERVAL:
                return False
            latest = self._latest
            if isinstance(latest, dict) and set(latest) == self._known:
                self._last_refresh = now
                return False  # nothing changed; lost workers show up on their channel or RPC at once
        self._last_refresh, self._look_now = now, False
        return True

    def _read_live(self, lost: tuple[str, ...]) -> _Seen:
        """Read the live workers granted to this fit, and forget the training and standby workers
        that are gone (or ``lost``)."""
        try:
            live = self._granted(cl.live_workers(self.client))
        except LOST as err:
            raise SchedulerLostError(
                f"The Dask scheduler is unreachable ({err!r}) after {self._n_updates()} model updates. "
                "A scheduler cannot be replaced during a fit: the estimator keeps the last good weights; "
                "start a new cluster and resume with checkpoint=... (or warm_start=True)."
            ) from err
        survivors = [w for w in self.workers if w in live and w not in lost]
        for w in set(self.workers) - set(survivors):
            self.transport.forget(w)
        standby = [w for w in self.standby if w in live and w not in lost]
        for w in set(self.standby) - set(standby):
            self.transport.forget(w)
        return _Seen(live=live, lost=lost, survivors=survivors, standby=standby)

    def _choose_joiners(self, seen: _Seen) -> list[str]:
        """The live workers to set up: neither training, on standby, being set up nor left out, as
        many as the coming batches want (in use, on standby or being set up), in taking order."""
        pending = self._pending[0] if self._pending else []
        joined = OCCUPANCY.order(
            w for w in seen.live
            if w not in self.workers and w not in seen.standby and w not in seen.lost and w not in pending and not self.quarantined(w)
        )
        if self.limit is not None:
            joined = joined[: max(0, max(self.limit, self.ahead) - len(seen.survivors) - len(seen.standby) - len(pending))]
        return joined

    def _finish_pending(self, seen: _Seen, background: bool) -> None:
        """Take the background set-ups when they are done (or when this look cannot wait for them
        in the background): ``seen.ready`` and ``seen.failed``."""
        if self._pending and (self._pending[1].done() or not background):
            started, future = self._pending
            self._pending = None
            seen.ready, seen.failed = self._finish_setup(started, future.result())

    def _set_up_joiners(self, seen: _Seen, background: bool) -> None:
        """Set up ``seen.joined``: in the background (they leave ``seen.joined`` until done), or now
        (``seen.joined`` keeps those that succeeded); then forget the ready ones gone meanwhile."""
        if seen.joined:
            calls = self._setup_calls(seen.joined)
            if background:
                self._pending = (seen.joined, self.transport.call_all_later(calls))
                seen.joined = []
            else:
                ok, bad = self._finish_setup(seen.joined, self.transport.call_all(calls))
                seen.joined, seen.failed = ok, seen.failed + bad
        for w in [w for w in seen.ready if not seen.alive(w)]:  # set up, but gone meanwhile
            self.transport.forget(w)

    def _train_or_stand_by(self, seen: _Seen) -> list[str]:
        """Of the workers set up (now or earlier), those that join the training: as many as the
        batch wants; the others wait on standby (``self.standby``)."""
        cold = set(seen.joined)  # set up while this update waited
        standby = [*seen.standby, *OCCUPANCY.order({*seen.joined, *(w for w in seen.ready if seen.alive(w))})]
        room = len(standby) if self.limit is None else max(0, self.limit - len(seen.survivors))
        joined, self.standby = standby[:room], standby[room:]
        if joined and seen.survivors:
            self._joining(joined, cold)
        return joined

    def _remember(self, seen: _Seen) -> None:
        """Remember what this look saw: look again at the next interval if anyone was left out
        (else only when the membership changes), and the worker names gone since (for ``heal``)."""
        self._known = None if seen.lost or seen.failed or self._pending else set(seen.live)
        names = {str(info.get("name")) for a, info in seen.live.items() if a not in seen.lost}
        self._gone_names = (self._gone_names | self._live_names) - names
        self._live_names = names

    def _refuse_if_all_quarantined(self, seen: _Seen) -> None:
        """Raise :class:`NoWorkersError` when every live worker is left out of the fit."""
        candidates = [w for w in seen.live if w not in seen.lost]
        if candidates and all(self.quarantined(w) for w in candidates):
            errors = "; ".join(f"{w}: {self._errors.get(w)!r}" for w in candidates)
            raise NoWorkersError(
                f"No worker could take part in the fit: each failed {SETUP_TRIES} set-ups or hung "
                f"past update_timeout={self.policy.update_timeout} s ({errors}). The estimator keeps "
                "its last good state; fix the workers (see their logs) and fit again."
            )

    def replace(self) -> None:
        """Place the data on the same workers again (the engine cut it into other shards)."""
        lost = self._change_to(self.workers)
        if lost:
            self.refresh(force=True, lost=lost)

    def running(self) -> int:
        """The workers the scheduler listed as running at the watcher's last look (this fit's, idle
        ones, other fits' on a shared cluster), and at least this fit's."""
        return max(len(self.latest or ()), len(self.workers))

    def planned(self) -> int:
        """The workers the client's cluster means to have (a ``SpecCluster``'s ``plan``: running,
        starting or being restarted by their nanny); 0 when the client has no such cluster."""
        n = 0
        with contextlib.suppress(RuntimeError):  # its specs changed while we read them: no news
            plan = getattr(getattr(self.client, "cluster", None), "plan", None)
            n = len(plan) if isinstance(plan, set | frozenset | dict | list) else 0
        return n if self.limit is None else min(n, self.limit)

    def _joining(self, workers: list[str], cold: set[str] = frozenset()) -> None:
        """Log workers joining the training (``cold``: those set up while the update waited; none when
        they were on standby)."""
        logger.info("update %d: %d worker(s) join, %d set up while the update waited",
                    self._n_updates(), len(workers), len(cold.intersection(workers)))

    def _occupy(self, workers: list[str]) -> None:
        """Count this fit on ``workers`` (and off those it counted on before) in :data:`OCCUPANCY`."""
        OCCUPANCY.move(self._occupied, workers)
        self._occupied = list(workers)

    def _change_to(self, new: list[str]) -> tuple[str, ...]:
        """Place the data on ``new``; returns the workers that could not take their blocks."""
        failed = self._place(new)
        for w, err in failed.items():
            self.strike(w, err)
        self._occupy(new)
        self.workers = new
        return tuple(failed)

    # ------------------------------------------------------------------ set-up
    def _setup_calls(self, workers: list[str]) -> list[tuple[str, str, dict]]:
        self.set_up.update(workers)
        return [rpc_call(w, "adadamp_setup", self._setup(w)) for w in workers]

    def _finish_setup(self, workers: list[str], replies: list) -> tuple[list[str], list[str]]:
        """Connect the workers whose set-up succeeded; returns (ready, failed)."""
        shared = self.transport.shared
        replies = [r if isinstance(r, BaseException) else SetupReply(**r) for r in replies]
        for w, r in zip(workers, replies):
            if shared is not None and (isinstance(r, BaseException) or not r.shared):
                shared.drop(w)  # another host: weights and gradients go over TCP
            elif shared is not None and r.shared_data:
                shared.maps_data.add(w)  # its blocks are placed by number: it maps the data
            if isinstance(r, BaseException):
                if not isinstance(r, LOST):
                    raise r
                self.strike(w, r)
                logger.warning("worker %s could not be set up (%r); ignoring it for now", w, r)
            else:
                self._on_setup(w, r)
                if r.channel is not None:
                    self.transport.connect(w, r.channel)
        failed = [w for w, r in zip(workers, replies) if isinstance(r, BaseException)]
        return [w for w in workers if w not in failed], failed

    def strike(self, worker: str, error: BaseException, *, out: bool = False) -> None:
        """Count a failed set-up (``out``: a hang; leave the worker out of this fit at once)."""
        self._strikes[worker] = SETUP_TRIES if out else self._strikes.get(worker, 0) + 1
        self._errors[worker] = error
        if self.quarantined(worker):
            logger.warning("leaving worker %s out of this fit (%r)", worker, error)

    def quarantined(self, worker: str) -> bool:
        return self._strikes.get(worker, 0) >= SETUP_TRIES

    def release(self) -> None:
        """Close the channels and drop the fit's state on every worker that has it."""
        if self._pending is not None:  # let background set-ups finish, so that what they built is released
            with contextlib.suppress(Exception):
                self._pending[1].result(timeout=self.policy.update_timeout)
            self._pending = None
        self.transport.close()
        self._occupy([])
        if self.grant is not None:  # None: the fit failed before it asked for workers
            self.grant.release()
        reachable = [w for w in self.set_up if not self.quarantined(w)]  # a hung one drops it when it wakes
        with contextlib.suppress(Exception):  # no scheduler: every one is asked
            listed = cl.scheduler_info(self.client)["workers"]
            # a worker the scheduler dropped holds nothing, and Dask retries connecting to its
            # address until the call's timeout: a fit that lost a worker ended 5 s late
            reachable = [w for w in reachable if w in listed]
        with contextlib.suppress(Exception):
            self.transport.call_all(
                [rpc_call(w, "adadamp_release", ReleaseRequest(self.transport.fit_id)) for w in reachable], timeout=5.0
            )
        self.set_up.clear()

    # ------------------------------------------------------------------ cluster size
    def _why(self) -> str:
        """Why the fit lacks workers, as far as this process can tell (:func:`~adadamp.cluster.waiting.why`)."""
        adapted_ago = self.grant.adapted_ago if self.grant is not None else None
        try:
            return waiting.why(self.client, self.policy.scale, adapted_ago, self._live_names)
        except Exception as err:  # noqa: BLE001 -- a reason never fails the fit
            logger.debug("could not tell why the fit waits (%r)", err)
            return ""

    def _wait_for_workers(self) -> None:
        timeout = self.policy.worker_timeout
        logger.warning("no live worker; waiting up to %.0f s for one", timeout)
        start = time.monotonic()
        deadline, told = start + timeout, False
        while True:
            if self.policy.scale:
                self.heal(force=True)
            left = deadline - time.monotonic()
            try:
                self._wait_for(1, timeout=max(0.1, min(HEAL_INTERVAL, left)))
                return
            except TimeoutError as err:
                if left <= HEAL_INTERVAL:
                    gone = "All Dask workers are gone and none" if self._n_updates() else "No Dask worker"
                    raise NoWorkersError(
                        f"{gone} joined within worker_timeout={timeout} s "
                        f"(after {self._n_updates()} model updates). {self._why()} The estimator keeps the "
                        "last good weights; add workers to the cluster and call fit again with warm_start=True."
                    ) from err
            if not told and time.monotonic() - start > waiting.ADAPTED_WITHIN:  # an adaptive has asked by now
                told, why = True, self._why()
                if why:
                    logger.warning("still no worker after %.0f s: %s", time.monotonic() - start, why)

    def _wait_for(self, n: int, timeout: float, unless: Callable[[], bool] = lambda: False) -> None:
        """Wait until ``n`` workers this fit may train on are running (``TimeoutError`` after ``timeout``)
        or ``unless()`` says to stop waiting."""
        deadline = time.monotonic() + timeout
        while len(self._granted(cl.live_workers(self.client))) < n and not unless():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} granted workers did not come in {timeout:.0f} s")
            time.sleep(0.1)

    def heal(self, force: bool = False) -> None:
        """Ask again for workers the cluster lost (preempted jobs, worker lifetimes)."""
        now = time.monotonic()
        if not force and (now - self._short_since < HEAL_INTERVAL or now - self._last_heal < HEAL_INTERVAL):
            return
        self._last_heal = now
        logger.info("%d of %d workers alive; asking the cluster again", len(self.workers), self.requested or 1)
        cl.heal(self.client, gone=self._gone_names)

    def wanted(self, batch_size: int) -> int:
        """Workers wanted for ``batch_size``: the damper's choice (``prefer``) or the policy's."""
        return self.policy.wanted(batch_size, self._prefer(batch_size))

    def follow(self, batch_size: int, ahead: int) -> None:
        """Train on the workers ``batch_size`` wants and set up beforehand those ``ahead`` (the
        largest batch the schedule names within about one worker start) wants.

        With ``scale_cluster`` the cluster is sized for ``ahead`` too; when the batch outgrew the
        workers there are anyway, wait (bounded, once per size) for those asked for, and ask again
        for workers that stay missing.  On a cluster that is not scaled the fit takes the idle
        workers it wants at once (set up now if they were not on standby).
        """
        n, n_ahead = self.wanted(batch_size), self.wanted(max(batch_size, ahead))
        if n >= (self.limit or 0):  # while the batch does not shrink, what was asked for stays asked for
            n_ahead = max(n_ahead, self.ahead)
        # The allocator sizes the cluster for every fit's wants, and measures how long a worker takes
        # to start there (for this fit's first growth too, when an earlier fit grew the cluster).
        self.grant.declare(n, n_ahead)
        self.requested = n_ahead
        self.start_latency = self.grant.start_latency
        if n_ahead != self.ahead:
            self.ahead = n_ahead
            self._known, self._look_now = None, True  # idle workers to set up: look at the next refresh
        self.use(n + len(self.grant.lent))  # workers no fit wants, lent to this one, train too
        self._wait_for_growth(n)
        if not self.policy.scale:
            return
        if len(self.workers) < n:
            self._short_since = min(self._short_since, time.monotonic())
            self.heal()
        else:
            self._short_since = math.inf

    def scale_to(self, n: int) -> None:
        """Ask for ``n`` workers ahead (the allocator sizes the cluster for every fit's wants)."""
        self.grant.declare(self.limit or 1, n)
        self.requested = n

    def use(self, n: int) -> None:
        """Train on ``n`` workers: the last ones go on standby (they stay set up, and in the
        cluster), or those on standby join now (idle workers at the next look)."""
        if n == self.limit:
            return
        self.limit = n
        self._known = None  # look again at the next refresh
        if n < len(self.workers):
            left = self.workers[n:]
            lost = self._change_to(self.workers[:n])
            self.standby = [*left, *self.standby]
        elif self.standby and self.workers and n > len(self.workers):  # live at the last look; a dead one fails its placement
            took, self.standby = self.standby[: n - len(self.workers)], self.standby[n - len(self.workers):]
            self._joining(took)
            lost = self._change_to(self.workers + took)
        else:
            return
        if lost:
            self.refresh(force=True, lost=lost)

    def _wait_for_growth(self, wanted: int) -> None:
        """When the batch outgrows the workers training, take the workers on standby now, and,
        once per size, set up idle ones (waiting, bounded, for those a scaled cluster was asked for).

        A fit alone waits: its result is the same on fewer workers, but its schedule was sized for
        these.  Among other fits it does not: while the cluster grows for all of them (measured:
        4 fits starting together waited 23-30 s for their second workers, with one each idle), it
        takes the workers there are now and those that start later at the looks after.

        A fit never waits at a size it has trained at: fewer workers then are losses (a worker's
        lifetime, a preemption, a killed job), and the fit goes on with those left while the
        replacements start (set up in the background at the next looks; waiting had stalled a fit
        for up to ``scale_wait`` per loss)."""
        if len(self.workers) >= wanted:
            self._waited_for = max(self._waited_for, wanted)
            return
        if self._waited_for < wanted:
            self._waited_for = wanted
            latest = self.latest or {}
            # On a shared cluster the fit waits only for the workers its fair share allows.
            coming = min(wanted, max(1, self.grant.share))
            if (self.policy.scale and not self.grant.others and len(latest) < coming
                    and len(live := self._granted(cl.live_workers(self.client))) < coming):
                logger.info("update %d: the batch wants %d workers, the fit has %d; waiting up to %.0f s. %s",
                            self._n_updates(), wanted, len(live), self.policy.scale_wait, self._why())
                with contextlib.suppress(TimeoutError):
                    self._wait_for(coming, timeout=self.policy.scale_wait, unless=lambda: self.grant.others > 0)
            self.refresh(force=True)
        elif self.standby:
            self.refresh(force=True)
