"""Run a damper through the engine's epoch loop without a model."""

from __future__ import annotations

from sklearn.base import clone

from .base import BaseDamper
from .clock import LoopState, Sampler
from .epoch import run_epoch


def simulate_schedule(
    damper: BaseDamper, n_data: int, max_epochs: float, n_workers: int = 1
) -> list[dict]:
    """Run a damper through the engine's epoch loop without a model.

    A clone of ``damper`` is reset and driven exactly as the engine drives
    it, on the engine's own clock and sampler (:mod:`adadamp.dampers.clock`):
    batches never straddle data epochs (each data epoch runs
    ``ceil(n_data / B)`` updates, the last one smaller), ``plan_update``
    gets ``stats=None``, and the epoch clock advances by
    ``plan.progress`` (or the batch) until it reaches ``max_epochs``.

    Parameters
    ----------
    damper : BaseDamper
        Not modified.
    n_data : int
        Examples in the training set.
    max_epochs : float
        Length of the run on the epoch clock.
    n_workers : int, default=1
        Reported in every ``TrainState``.

    Returns
    -------
    list of dict
        One record per update with keys ``n_updates``, ``epoch``,
        ``batch_size`` (used), ``requested`` (returned by
        ``next_batch_size``), ``lr_factor``, ``momentum``,
        ``momentum_buffer_scale`` and ``damping`` (``damping_`` of damping
        schedules, else None).

    Examples
    --------
    >>> trace = simulate_schedule(GeoDamp(initial=4, delay=1, factor=2), 10, 2)
    >>> [r["batch_size"] for r in trace]
    [4, 4, 2, 8, 2]
    """
    d = clone(damper).reset(n_data)
    loop = LoopState(seed=0, n_data=n_data)
    sampler = Sampler(loop)

    def update() -> dict:
        state = loop.train_state(n_workers)
        requested = int(d.next_batch_size(state))
        batch = len(sampler.advance(requested))
        plan = d.plan_update(state, batch, None)
        loop.advance(batch, plan.progress)
        return {
            "n_updates": state.n_updates,
            "epoch": state.epoch,
            "batch_size": batch,
            "requested": requested,
            "lr_factor": plan.lr_factor,
            "momentum": plan.momentum,
            "momentum_buffer_scale": plan.momentum_buffer_scale,
            "damping": getattr(d, "damping_", None),
        }

    records: list[dict] = []
    while loop.epoch < max_epochs - 1e-12:
        end = min(loop.epoch_end(), max_epochs * n_data)
        if not loop.in_epoch(end):  # within rounding of the end: the engine's epoch is over
            break
        run_epoch(loop, update, records, end=end)  # one epoch, as the engine's backends run it
    return records


def count_updates(damper: BaseDamper, n_data: int, max_epochs: float) -> int:
    """Model updates of a ``max_epochs`` run (see :func:`simulate_schedule`).

    Examples
    --------
    >>> count_updates(Constant(batch_size=128), n_data=50_000, max_epochs=200)
    78200
    """
    return len(simulate_schedule(damper, n_data, max_epochs))


