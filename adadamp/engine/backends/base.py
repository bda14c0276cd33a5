"""What the fit loop needs from a backend: the one interface every way of training implements.

The parameter server (:class:`~adadamp.engine.ParameterServer`: the client holds the weights and
steps) and the all-reduce backend (:class:`~adadamp.engine.AllReduce`: replicas on the workers
step in lockstep) implement it.  A
backend is built for one ``fit`` call from the training state, the data and the cluster policy,
acquires its workers on ``__enter__`` and releases everything on ``__exit__``, whatever happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, Self

from distributed import Client

from ..dampers.clock import LoopState


class Backend(Protocol):
    """One ``fit`` call's training on the cluster."""

    client: Client  # the Dask client the backend trains on (the fit loop publishes its progress there)

    @property
    def workers(self) -> list[str]:
        """The workers taking part now, in rank order."""

    def __enter__(self) -> Self:
        """Acquire the workers, channels and memory the fit needs (all released if this raises)."""

    def __exit__(self, *exc) -> None:
        """Release everything acquired."""

    def sync(self) -> None:
        """Bring the client's module and optimizer up to date (a checkpoint mid-epoch is next).

        The parameter server's always are; the all-reduce backend's replicas hold the
        weights, and ``run_epoch`` returns with the client's copy up to date."""

    def suspend(self) -> None:
        """End one call but keep the workers, their data and the connections for the next call on
        the same data (``partial_fit``, :class:`~adadamp.engine.session.KeptBackend`)."""

    def resume(self, *, module, optimizer, damper, loop: LoopState) -> None:
        """Train ``module`` (the same architecture as the last call's) with ``optimizer``, ``damper``
        and the clock ``loop`` next, on the workers and data already in place."""

    def run_epoch(self, updates: list[dict] | None = None, on_update: Callable[[list[dict]], None] | None = None) -> dict:
        """Model updates until the epoch clock passes the next whole epoch; returns the epoch's row.

        ``updates`` holds the records of this epoch's earlier updates when resuming mid-epoch;
        ``on_update(updates)`` runs after every update.
        """
