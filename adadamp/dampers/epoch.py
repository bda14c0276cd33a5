"""The loop over one epoch's updates, written once: the engine's backends train with it and
:func:`~adadamp.dampers.simulate_schedule` runs a damper with it, so both end an epoch alike.

An epoch runs updates while the epoch clock (:class:`~adadamp.dampers.clock.LoopState`) is below
its end; each update moves the clock (:meth:`~adadamp.dampers.clock.LoopState.advance`).  Pure; no
Dask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .clock import LoopState

R = TypeVar("R")


def run_epoch(
    loop: LoopState,
    update: Callable[[], R | None],
    records: list[R],
    on_update: Callable[[list[R]], None] | None = None,
    end: float | None = None,
) -> float:
    """Run ``update()`` until the epoch clock reaches ``end``, appending each update's record.

    Parameters
    ----------
    loop : LoopState
        The clock ``update`` advances.
    update : callable
        Takes one update and returns its record, or None when it was undone (the clock went back:
        the update is run again, and ``on_update`` is not called).
    records : list
        Where the records go (it may hold the epoch's earlier updates when resuming mid-epoch).
    on_update : callable, optional
        Called with ``records`` after every update.
    end : float, optional
        Where the epoch ends on the clock, in examples; default: the end of the current epoch.

    Returns
    -------
    float
        ``end``.

    Examples
    --------
    >>> loop, records = LoopState(seed=0, n_data=10), []
    >>> def update():
    ...     loop.advance(4)
    ...     return loop.n_updates
    >>> run_epoch(loop, update, records), records
    (10, [1, 2, 3])
    """
    end = loop.epoch_end() if end is None else end
    while loop.in_epoch(end):
        record = update()
        if record is None:
            continue
        records.append(record)
        if on_update is not None:
            on_update(records)
    return end
