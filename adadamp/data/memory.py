"""Whether a dask collection fits in the workers' memory before it is persisted there.

Persisting more than the workers can hold does not fail: the workers spill, reach Dask's pause
fraction, stop running tasks, and the fit stalls for minutes before Dask cancels its futures.
The check reads only the collection's metadata and the scheduler's latest look at the workers
(their ``memory_limit`` and what their processes hold now), so a collection that cannot fit is
refused at once, with the numbers, before any task runs.
"""

from __future__ import annotations

import math

import dask
from dask.utils import format_bytes
from distributed import futures_of

#: Dask's worker memory fractions, the first one set being where a worker stops holding data in
#: memory: above ``target`` it spills to disk, above ``pause`` it runs nothing.
FRACTIONS = ("target", "spill", "pause")


def memory_fraction() -> float:
    """The fraction of ``memory_limit`` a worker holds data in before it spills or pauses
    (dask config ``distributed.worker.memory.*``; 1.0 when all are disabled)."""
    for name in FRACTIONS:
        value = dask.config.get(f"distributed.worker.memory.{name}", False)
        if value:
            return float(value)
    return 1.0


def new_bytes(collection) -> int:
    """Bytes that persisting ``collection`` adds to the cluster: none when every one of its
    partitions is already held there (the user persisted it as it is), else all of them."""
    held = {f.key for f in futures_of(collection)}
    keys = set(dask.core.flatten(collection.__dask_keys__()))
    if keys and keys <= held:
        return 0
    if any(math.isnan(n) for n in collection.shape):  # unknown lengths: nothing to go by
        return 0
    return int(math.prod(collection.shape)) * collection.dtype.itemsize


def check_fits(collections: list, workers: dict) -> None:
    """Refuse to persist ``collections`` (dask arrays of known shape) on ``workers`` (the
    scheduler's ``scheduler_info()["workers"]``) when their bytes exceed what the workers can
    still hold below :func:`memory_fraction` of their ``memory_limit``.  Workers without a limit
    hold anything."""
    limits = [(info.get("memory_limit") or 0, info.get("metrics", {}).get("memory", 0)) for info in workers.values()]
    if not limits or any(limit == 0 for limit, _ in limits):
        return
    fraction = memory_fraction()
    room = sum(max(0, int(fraction * limit) - held) for limit, held in limits)
    needed = sum(new_bytes(c) for c in collections)
    if needed > room:
        total = sum(limit for limit, _ in limits)
        held = sum(h for _, h in limits)
        raise ValueError(
            f"The dask data needs {format_bytes(needed)} on the cluster, and its {len(limits)} worker(s) can hold "
            f"{format_bytes(room)} more: {fraction:.0%} of their memory_limit ({format_bytes(total)} in all; "
            f"dask config distributed.worker.memory.target) less the {format_bytes(held)} their processes "
            "hold now. adadamp persists dask data on the workers for the whole fit; nothing was computed. "
            "Start more workers or workers with a larger memory_limit, or pass a torch Dataset that reads "
            "the examples from storage as X (read example by example on the workers, never held whole)."
        )
