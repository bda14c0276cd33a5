"""Rounds that lose a worker: recomputing what it owed on the survivors, on both backends.

A round sends one update's requests to the workers; a worker that dies or hangs loses only its
part of that round.  It is left out of the fit, and the next round recomputes its part on the
others, at the same weights (:doc:`/guide/elasticity`).  Workers that keep dying end the update
after ``1 + MAX_RECOMPUTES`` rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...exceptions import CollectiveError, NoWorkersError
from ..membership import Membership
from ..transport import LOST

T = TypeVar("T")

#: Rounds in a row in which some share of one update is lost before the update is given up: each
#: round drops the lost workers, so this many means the workers keep dying as fast as they come.
MAX_RECOMPUTES = 10


def in_rounds(members: Membership, run: Callable[[int], tuple[T | None, list[str]]], failure: str) -> T:
    """Run rounds until one loses no worker.

    ``run(k)`` runs round ``k`` and returns its result, or None and the workers it lost, which are
    left out of ``members`` before the next round (whose requests recompute what they owed).

    Raises
    ------
    NoWorkersError
        With ``failure``, after ``1 + MAX_RECOMPUTES`` rounds in a row that lost workers.
    """
    for k in range(1 + MAX_RECOMPUTES):
        if not members.workers:
            members.refresh(force=True)
        result, lost = run(k)
        if result is not None:
            return result
        members.lost_in_rounds.extend(lost)
        members.refresh(force=True, lost=tuple(lost))
    raise NoWorkersError(failure)


def triage(members: Membership, workers: list[str], replies: list, collectives: bool = False) -> tuple[list[int], list[int]]:
    """The positions of a round's ``replies`` (from ``workers``) that lost their worker (dead, or
    hung: then struck out of the fit) and, with ``collectives``, of those whose collective failed
    (the all-reduce backend's peers of a lost worker); any other error raises."""
    lost, broken = [], []
    for k, (w, r) in enumerate(zip(workers, replies)):
        if collectives and isinstance(r, CollectiveError):
            broken.append(k)
        elif isinstance(r, LOST):
            lost.append(k)
            if isinstance(r, TimeoutError):  # alive but hung (or far too slow)
                members.strike(w, r, out=True)
        elif isinstance(r, BaseException):
            raise r
    return lost, broken
