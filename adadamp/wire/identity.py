"""The scheduler's list of workers, asked the same way on every supported version of distributed."""

from __future__ import annotations

import inspect

from distributed import Scheduler

#: Keyword arguments that make the scheduler list every worker.  distributed 2025.4.0 added
#: ``n_workers`` to ``Scheduler.identity`` and ``Client.scheduler_info`` (the client's default lists
#: 5 workers); the releases before it list every worker and a scheduler of theirs answers the
#: argument with a logged ``TypeError`` (``Exception while handling op identity``).
ALL_WORKERS: dict = {"n_workers": -1} if "n_workers" in inspect.signature(Scheduler.identity).parameters else {}


def scheduler_info(client) -> dict:
    """``client.scheduler_info()`` listing every worker, on every supported version of distributed."""
    return client.scheduler_info(**ALL_WORKERS)
