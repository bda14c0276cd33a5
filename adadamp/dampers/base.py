"""The damper protocol (TrainState, GradStats, UpdatePlan, BaseDamper) and Constant."""

from __future__ import annotations

from dataclasses import dataclass

from sklearn.base import BaseEstimator, clone

from ._validation import _check_int
from .momentum import _check_momentum, _resolve_momentum


@dataclass(frozen=True)
class TrainState:
    """What the engine knows before an update.

    Attributes
    ----------
    n_updates : int
        Model updates completed so far (this update is number ``n_updates``).
    n_samples_seen : int
        Training examples consumed so far (the data clock).
    epoch : float
        The one epoch clock: progress / n_data.  Data epochs unless a damper
        reports another progress (AdaScale: scale-invariant epochs).
    n_data : int
        Examples in the training set.
    n_workers : int
        Live workers at this update.
    loss : float or None, default=None
        Mean training loss of the *previous* update's batch (the loss at the
        weights before that update), or None before the first update.  Only
        :class:`AdaDamp` and :class:`RadaDamp` read it; they raise if it is
        missing after the first update.
    """

    n_updates: int
    n_samples_seen: int
    epoch: float
    n_data: int
    n_workers: int
    loss: float | None = None


@dataclass(frozen=True)
class GradStats:
    """Gradient statistics of the current update (``algorithms.md`` §2.3).

    Attributes
    ----------
    n_samples : int
        N, examples in the batch.
    grad_sq_norm : float
        ``||g_bar||^2`` with ``g_bar = sum_i G_i / N`` (float64).
    chunk_sq_norm_sum : float
        ``Q = sum_j ||G_j||^2 / n_j`` over the disjoint chunks of the batch.
    n_chunks : int
        k, number of non-empty chunks (0 when no chunk statistics were asked).
    """

    n_samples: int
    grad_sq_norm: float
    chunk_sq_norm_sum: float
    n_chunks: int


@dataclass(frozen=True)
class UpdatePlan:
    """What the damper tells the engine after the gradient is known.

    Attributes
    ----------
    lr_factor : float
        Multiplies each parameter group's base learning rate for this step.
    momentum : float or None
        Momentum (SGD) or beta1 (Adam) for this step; None leaves it alone.
    progress : float or None
        Examples by which this update advances the epoch clock; None means
        the number of examples in the batch (data epochs).
    momentum_buffer_scale : float
        Multiplies every momentum buffer before the step (LIN App. B.4).
    """

    lr_factor: float = 1.0
    momentum: float | None = None
    progress: float | None = None
    momentum_buffer_scale: float = 1.0


class BaseDamper(BaseEstimator):
    """Base class of every damper (the protocol is described in :mod:`adadamp.dampers`).

    Subclasses store their constructor arguments unchanged in ``__init__``,
    validate them in :meth:`reset` and keep every evolving quantity in
    attributes ending in ``_`` created by :meth:`reset`.
    """

    #: Ask the workers for per-chunk gradient statistics (AdaScale).
    needs_grad_stats: bool = False

    def reset(self, n_data: int) -> BaseDamper:
        """Validate parameters and clear training state before a fresh fit.

        Parameters
        ----------
        n_data : int
            Examples in the training set.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            A parameter is invalid; the message names it and the fix.
        """
        return self

    def next_batch_size(self, state: TrainState) -> int:
        """Batch size of the coming update."""
        raise NotImplementedError

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        """Learning-rate factor, momentum and clock progress of this update.

        Parameters
        ----------
        state : TrainState
            The same state that was given to :meth:`next_batch_size`.
        batch_size : int
            Examples actually used (the last batch of a data epoch may be
            smaller than requested).
        stats : GradStats or None
            Gradient statistics of this update.
        """
        return UpdatePlan()

    def forecast_batch_size(self, epoch: float) -> int | None:
        """Batch size expected at a future ``epoch`` (None if unknown).

        Lets the engine ask for workers before the batch grows.
        """
        return None



class Constant(BaseDamper):
    """A constant batch size (what ``batch_size=<int>`` means).

    Parameters
    ----------
    batch_size : int, default=32
        Examples per model update.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`); None leaves the
        optimizer's momentum alone.

    Examples
    --------
    >>> d = Constant(batch_size=64).reset(n_data=1000)
    >>> d.next_batch_size(TrainState(0, 0, 0.0, 1000, 1))
    64
    """

    def __init__(self, batch_size: int = 32, momentum=None):
        self.batch_size = batch_size
        self.momentum = momentum

    def reset(self, n_data: int) -> Constant:
        _check_int(self.batch_size, "batch_size", low=1, owner="Constant")
        _check_momentum(self.momentum, type(self).__name__)
        return self

    def next_batch_size(self, state: TrainState) -> int:
        return int(self.batch_size)

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        m = _resolve_momentum(self.momentum, state.n_workers, batch_size)
        return UpdatePlan(momentum=m)

    def forecast_batch_size(self, epoch: float) -> int | None:
        return int(self.batch_size)


def _make_schedule(value, param: str, owner: str, n_data: int) -> BaseDamper:
    """A fresh, reset batch schedule from an int or a damper instance."""
    if isinstance(value, type):
        raise TypeError(
            f"{owner}: {param} must be an int or a damper instance such as "
            f"{value.__name__}(...), not the class."
        )
    if isinstance(value, BaseDamper):
        return clone(value).reset(n_data)
    _check_int(value, param, low=1, owner=owner)
    return Constant(batch_size=int(value)).reset(n_data)


def _base_batch_size(base, schedule, owner: str) -> int:
    if base is not None:
        _check_int(base, "base_batch_size", low=1, owner=owner)
        return int(base)
    if isinstance(schedule, BaseDamper):
        params = schedule.get_params(deep=False)
        for key in ("initial", "batch_size"):
            if key in params and not isinstance(params[key], BaseDamper):
                _check_int(params[key], key, low=1, owner=owner)
                return int(params[key])
        raise ValueError(
            f"{owner}: base_batch_size is required when batch_size is a "
            f"{type(schedule).__name__} (it has no `initial`)."
        )
    return int(schedule)
