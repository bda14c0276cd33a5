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

from ..wire.identity import scheduler_info

#: Dask's worker memory fractions, the first one set being where a worker stops holding data in
#: memory: above ``target`` it spills to disk, above ``pause`` it runs nothing.
FRACTIONS = ("target", "spill", "pause")

#: What a worker's process holds is rounded up to this where it sizes streamed blocks
#: (:func:`look` with ``first=True``): fresh workers of one build measure within a fraction of a
#: MiB of each other, so they cut the same blocks.
HELD_GRANULE = 32 * 2**20

#: On a worker: what its process held when a streamed fit first sized blocks there (rounded up).
_FIRST: dict[str, int] = {}


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


def _resident() -> int:
    """This worker's resident memory once what training imports is imported (torch: ~400 MB)."""
    import psutil

    from ..worker import plugin  # noqa: F401  (torch and the trainer, as a fit's set-up imports them)

    return int(psutil.Process().memory_info().rss)


def _resident_first() -> int:
    """What this worker's process held when a streamed fit first sized blocks here, rounded up to
    :data:`HELD_GRANULE`, for the process's life: the first fit's training adds 30-70 MB (torch's
    pages, touched once), which measured anew would cut later fits' blocks, and so their order,
    otherwise than the first's."""
    if "held" not in _FIRST:
        _FIRST["held"] = -(-_resident() // HELD_GRANULE) * HELD_GRANULE
    return _FIRST["held"]


def look(client, first: bool = False) -> dict:
    """The scheduler's workers (``scheduler_info()["workers"]``) with what each process holds
    measured now, after importing what a fit imports there: a fresh worker's last heartbeat
    tells what it held before torch (data judged to fit then would not).  ``first``: what each
    held when a streamed fit first sized blocks there (:func:`_resident_first`)."""
    workers = scheduler_info(client)["workers"]
    held = client.run(_resident_first if first else _resident, workers=list(workers))
    return {w: {**info, "metrics": {**info.get("metrics", {}), "memory": held[w]}}
            for w, info in workers.items() if w in held}


def _limits(workers: dict) -> list[tuple[int, int]] | None:
    """Each worker's ``memory_limit`` and what its process holds now; None when any has no limit."""
    limits = [(info.get("memory_limit") or 0, info.get("metrics", {}).get("memory", 0)) for info in workers.values()]
    if not limits or any(limit == 0 for limit, _ in limits):
        return None
    return limits


def rooms(workers: dict) -> list[int] | None:
    """What each of ``workers`` (the scheduler's ``scheduler_info()["workers"]``) can still hold
    below :func:`memory_fraction` of its ``memory_limit``; None when a worker has no limit."""
    limits = _limits(workers)
    fraction = memory_fraction()
    return None if limits is None else [max(0, int(fraction * limit) - held) for limit, held in limits]


def fits(collections: list, workers: dict) -> bool:
    """Whether persisting ``collections`` (dask arrays) fits in what ``workers`` can still hold."""
    room = rooms(workers)
    return room is None or sum(new_bytes(c) for c in collections) <= sum(room)


def row_bytes(collections: list) -> int:
    """Bytes of one example across ``collections`` (dask arrays chunked along axis 0 alike)."""
    return sum(int(math.prod(c.shape[1:])) * c.dtype.itemsize for c in collections)


def check_fits(collections: list, workers: dict) -> None:
    """Refuse to persist ``collections`` (dask arrays of known shape) on ``workers`` (the
    scheduler's ``scheduler_info()["workers"]``) when their bytes exceed what the workers can
    still hold below :func:`memory_fraction` of their ``memory_limit``.  Workers without a limit
    hold anything."""
    limits = _limits(workers)
    if limits is None:
        return
    fraction = memory_fraction()
    room = sum(rooms(workers))
    needed = sum(new_bytes(c) for c in collections)
    if needed > room:
        total = sum(limit for limit, _ in limits)
        held = sum(h for _, h in limits)
        raise ValueError(
            f"The dask data needs {format_bytes(needed)} on the cluster, and its {len(limits)} worker(s) can hold "
            f"{format_bytes(room)} more: {fraction:.0%} of their memory_limit ({format_bytes(total)} in all; "
            f"dask config distributed.worker.memory.target) less the {format_bytes(held)} their processes "
            "hold now. dask_data='persist' holds the data on the workers for the whole fit; nothing was computed. "
            "Leave dask_data='auto' (streamed when it does not fit), start more workers or workers with a "
            "larger memory_limit."
        )


def stream_rows(collections: list, workers: dict, window: int, windows: int) -> int | None:
    """The most rows of a streamed block: a worker holds up to ``windows`` windows of ``window``
    blocks (one worker left), in what the worker with the least room can hold (None: no limit).

    ``ValueError`` when not even one row per block fits, before anything was computed."""
    room = rooms(workers)
    if room is None:
        return None
    per_row = max(1, row_bytes(collections))
    rows = min(room) // (windows * window * per_row)
    if rows < 1:
        raise ValueError(
            f"The dask data cannot be streamed: a worker can hold {format_bytes(min(room))} more "
            f"({memory_fraction():.0%} of its memory_limit less what its process holds), and streaming needs "
            f"{windows} windows of {window} blocks there (dask config adadamp.stream.window), each of at least one "
            f"example of {format_bytes(per_row)}. Start workers with a larger memory_limit, or lower the window; "
            "nothing was computed."
        )
    return int(rows)


def reaches_pause(collections: list, workers: dict, rows: int, window: int, windows: int) -> bool:
    """Whether a worker of ``workers`` holding ``windows`` windows of ``window`` blocks of ``rows``
    rows would reach Dask's pause fraction of its ``memory_limit`` (``distributed.worker.memory.pause``)
    beside what its process holds now (other data came since its blocks were first sized)."""
    limits = _limits(workers)
    pause = dask.config.get("distributed.worker.memory.pause", False) or 1.0
    need = windows * window * rows * max(1, row_bytes(collections))
    return limits is not None and any(need > float(pause) * limit - held for limit, held in limits)


def split(chunks: tuple[int, ...], rows: int) -> tuple[int, ...]:
    """Chunk lengths along axis 0 of at most ``rows``, each chunk of ``chunks`` cut into equal
    pieces (a piece never straddles two chunks: computing it computes one).

    >>> split((10, 3), 4)
    (4, 3, 3, 3)
    """
    out = []
    for n in chunks:
        k = -(-int(n) // rows)
        base, extra = divmod(int(n), k)
        out += [base + (i < extra) for i in range(k)]
    return tuple(out)
