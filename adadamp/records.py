"""What the engine passes around, defined once: a worker's gradient reply, one update's record
and one epoch's row of ``history_``.

Plain dataclasses with no Dask and no engine imports, so the workers (``adadamp._worker``,
``adadamp.channel``) use them without importing the client side.  ``history_`` keeps plain dicts
(callbacks add keys such as ``valid_loss`` or ``event_cp``); :meth:`UpdateRecord.row` and
:func:`epoch_row` are where those dicts are made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass
class GradientReply:
    """What a worker returns for one gradient request (arrays already on the client)."""

    n: int
    loss_sum: float
    chunk_sq_norm_sum: float
    n_chunks: int
    compute_time: float
    grad: np.ndarray | None  # None: the worker wrote it into shared memory
    buffers: np.ndarray | None
    weight: float = 0.0  # what the loss sum is normalized by: the examples, or their class weights


@dataclass
class UpdateRecord:
    """One model update: its batch, learning rate, workers, loss and where the time went (seconds).

    ``compute_time`` is the slowest worker's gradient, ``comm_time`` the round trip minus that,
    ``send_time`` the client writing the requests, ``aggregate_time`` averaging, the finite check
    and the damper's plan, ``step_time`` the optimizer step, ``update_time`` the whole update.
    """

    batch_size: int
    lr: float
    n_workers: int
    loss: float
    compute_time: float
    comm_time: float
    send_time: float
    aggregate_time: float
    step_time: float
    update_time: float

    def row(self) -> dict:
        """The record as a row of ``history_[i]["updates"]``."""
        return dataclasses.asdict(self)


def epoch_row(epoch: int, updates: list[dict], n_updates: int, n_samples_seen: int, dur: float) -> dict:
    """One epoch's row of ``history_`` from its update rows.

    ``train_loss`` is the batch losses' mean weighted by the batch sizes; ``batch_size`` the
    epoch's largest batch; ``lr`` and ``n_workers`` those of its last update.

    Examples
    --------
    >>> rows = [{"batch_size": 2, "loss": 1.0, "lr": 0.1, "n_workers": 1},
    ...         {"batch_size": 6, "loss": 0.5, "lr": 0.1, "n_workers": 2}]
    >>> row = epoch_row(1, rows, n_updates=2, n_samples_seen=8, dur=0.1)
    >>> row["train_loss"], row["batch_size"], row["n_workers"]
    (0.625, 6, 2)
    """
    n = sum(u["batch_size"] for u in updates)
    return {
        "epoch": epoch,
        "train_loss": sum(u["loss"] * u["batch_size"] for u in updates) / n,
        "batch_size": max(u["batch_size"] for u in updates),
        "lr": updates[-1]["lr"],
        "n_workers": updates[-1]["n_workers"],
        "n_updates": n_updates,
        "n_samples_seen": n_samples_seen,
        "dur": dur,
        "updates": updates,
    }
