"""A worker's lifetime (Dask's ``--lifetime``: dask-jobqueue's answer to walltimes), told to the allocator.

A worker with a lifetime retires itself when it is reached.  Told in advance, the allocator has the
cluster start the replacement before that and moves the fits to it, so the retirement costs a
fit no update and no wait for a job to start (:meth:`adadamp.cluster.allocator.Allocator.worker_ends`).
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
    """Tell the scheduler's allocator when this worker retires; nothing where it has no lifetime.
    A scheduler without the allocator (no fit ever declared there) is told nothing, quietly."""
    left = seconds_left(worker)
    if left is None:
        return
    try:
        await worker.scheduler.adadamp_worker_ends(worker=worker.address, seconds=left)
    except Exception as err:  # noqa: BLE001 -- the replacement is then asked for when it leaves, as before
        logger.debug("could not tell the allocator this worker's lifetime: %r", err)
