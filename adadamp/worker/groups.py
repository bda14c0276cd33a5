"""An all-reduce group kept on a worker between fits (runs on the workers).

Forming a group costs a rendezvous through the scheduler and gloo's connections between every
pair of members (7.5 ms median on two local workers of an idle 2-core machine, 28 ms and up to
130 ms on a loaded one); a grid search or a loop of ``fit`` calls on
the same workers would pay it every fit.  So when a fit ends cleanly (its last request was a
commit that asked to keep the group, no update since), each member keeps its group here, with
the members in rank order, for ``seconds``; the next fit's set-up reply offers it
(:meth:`KeptGroup.offer`), and a client whose members all offer the same group, in the same rank
order, reuses it instead of forming one (:meth:`~adadamp.worker.generation.GroupMember.join`).

One group at most per worker process: a member that forms another group (the membership
changed, a member died or was replaced) drops the kept one, as does the worker's event loop when
no fit took it in time (its client went away).  A group is only ever used by the fit that took
it: a member that no longer has it refuses, and a handshake over the group makes every member
check that its peers took it for the same fit and generation before any state moves.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import threading
import time

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class KeptGroup:
    """A healthy group left by a finished fit: its ``torch.distributed`` group and the store it was
    formed with (its C++ side refers to it), this member's rank, and every member's address in rank
    order.  ``key`` names it to the client (its fit and generation: the same on every member);
    ``timeout`` is the collective timeout it was formed with."""

    key: str
    group: object
    store: object
    members: tuple[str, ...]
    rank: int
    timeout: float
    expires: float = math.inf  # time.monotonic() past which no fit may take it

    def offer(self) -> dict:
        """What a set-up reply tells the client about it."""
        return {"key": self.key, "members": list(self.members), "timeout": self.timeout}


_LOCK = threading.Lock()
_KEPT: KeptGroup | None = None
_RELEASING: set[threading.Thread] = set()  # the threads destroying a group now

#: Seconds :func:`close` waits for the groups being destroyed (a healthy group takes under 0.1 s).
CLOSE_SECONDS = 10.0


def release(held: list) -> None:
    """Clear ``held`` (the only references to a group and its store) on a thread of its own.

    Destroying a gloo group closes its connections to every peer (measured on 2 cores: 20-76 ms
    for a group of 8, 8 ms for 2), which a group forming on this worker, and its peers waiting in
    the rendezvous, would otherwise wait for: a warm fit's every generation formed in 60-80 ms
    instead of 2-23 ms.  :func:`close` waits for these threads before the process exits.
    """
    if any(h is not None for h in held):
        thread = threading.Thread(target=_clear, args=(held,), name="adadamp-release-group", daemon=True)
        with _LOCK:
            _RELEASING.add(thread)
        thread.start()


def _clear(held: list) -> None:
    try:
        held.clear()
    finally:
        with _LOCK:
            _RELEASING.discard(threading.current_thread())


def close(timeout: float = CLOSE_SECONDS) -> bool:
    """Drop the kept group and wait until every group being released is destroyed (the worker
    closes, or the process exits: :mod:`atexit`).  Returns whether all were within ``timeout``.

    torch destroys a group with the GIL released and takes it back when done: a daemon thread
    that does so while the interpreter finalizes is ended there (``pthread_exit``), its unwinding
    stops at the C++ destructor, and the process aborted with ``terminate called without an
    active exception`` (often an all-reduce fit's workers, as their cluster closed).
    """
    drop()
    deadline = time.monotonic() + timeout
    while True:
        with _LOCK:
            pending = [t for t in _RELEASING if t.is_alive()]
        if not pending:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            logger.warning("%d all-reduce group(s) still being destroyed after %.0f s", len(pending), timeout)
            return False
        pending[0].join(left)


def _release(kept: KeptGroup | None) -> None:
    if kept is not None:
        held = [kept.group, kept.store]
        kept.group = kept.store = None
        release(held)


def keep(kept: KeptGroup, seconds: float, loop=None) -> None:
    """Keep ``kept`` for ``seconds``, dropping any group kept before.  ``loop``: the worker's event
    loop (Tornado's ``IOLoop``), which drops it then; without one (tests), it is dropped when a
    later call here finds it expired."""
    global _KEPT
    kept.expires = time.monotonic() + seconds
    with _LOCK:
        before, _KEPT = _KEPT, kept
    _release(before if before is not kept else None)
    if loop is not None:  # add_callback is the loop's thread-safe entry (this runs on a compute thread)
        loop.add_callback(lambda: loop.call_later(seconds, _expire, kept.key))


def offer() -> dict | None:
    """The kept group's offer (:meth:`KeptGroup.offer`), or None."""
    with _LOCK:
        _drop_expired()
        return None if _KEPT is None else _KEPT.offer()


def take(key: str, members: tuple[str, ...], timeout: float) -> KeptGroup | None:
    """The kept group named ``key``, if it is still kept and was formed by ``members`` in this
    rank order with this collective ``timeout``; it is then the caller's (no longer kept)."""
    global _KEPT
    with _LOCK:
        _drop_expired()
        kept = _KEPT
        if kept is None or kept.key != key or kept.members != tuple(members) or kept.timeout != timeout:
            return None
        _KEPT = None
        return kept


def drop() -> None:
    """Drop the kept group (this worker joins another group, or tests)."""
    global _KEPT
    with _LOCK:
        kept, _KEPT = _KEPT, None
    _release(kept)


def _drop_expired() -> None:
    global _KEPT
    if _KEPT is not None and time.monotonic() >= _KEPT.expires:
        _release(_KEPT)
        _KEPT = None


def _expire(key: str) -> None:
    global _KEPT
    with _LOCK:
        if _KEPT is None or _KEPT.key != key:
            return
        kept, _KEPT = _KEPT, None
    _release(kept)
    logger.info("dropped the all-reduce group kept since the last fit (no fit took it)")


atexit.register(close)  # before the interpreter finalizes (and ends daemon threads); after a worker's teardown: no-op
