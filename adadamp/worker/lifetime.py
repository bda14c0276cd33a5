"""A worker's life, told to the allocator: how long its process took to start, and when it retires
at its lifetime (Dask's ``--lifetime``: dask-jobqueue's answer to walltimes).

The start is a prior for how long the cluster takes to bring a worker, before a growth was measured
(a fit asks for workers that long ahead, and its time left counts the wait).  Told its end, the
allocator has the cluster start the replacement before that and moves the fits to it, so the
retirement costs a fit no update and no wait for a job to start
(:meth:`adadamp.cluster.allocator.Allocator._read_lives`).
"""

from __future__ import annotations

import logging
import time

import psutil

logger = logging.getLogger("adadamp.worker")


def seconds_left(worker) -> float | None:
    """Seconds until ``worker`` retires at its lifetime (None: it has none).

    Dask counts the lifetime (already staggered) from the worker's start, which is its process's
    start to within the interpreter's start-up: a replacement asked for this early is not late."""
    lifetime = getattr(worker, "lifetime", None)
    if not lifetime:
        return None
    age = time.time() - psutil.Process().create_time()
    return max(0.0, float(lifetime) - age)


async def tell_allocator(worker) -> None:
    """Tell the allocator when this worker's process started and when it retires, in the scheduler's
    metadata (:data:`adadamp.cluster.allocator.LIFE_KEY`): there whether the allocator exists yet or not."""
    created = psutil.Process().create_time()
    left = seconds_left(worker)
    life = {"created": created, "ends": None if left is None else time.time() + left}
    try:
        await worker.scheduler.set_metadata(keys=["adadamp", "worker-life", worker.address], value=life)
    except Exception as err:  # noqa: BLE001 -- an estimate and a replacement ahead are lost, nothing else
        logger.debug("could not tell the scheduler this worker's life: %r", err)
