"""Schedules of the original adadamp that grow the batch with the number of updates, whatever the
training does: PadaDamp, its learning-rate form CntsDampLR, and full-batch GradientDescent
(Sievert & Charles 2019)."""

from __future__ import annotations

from ._validation import _check_int
from .base import BaseDamper, TrainState
from .damping import _DampingSchedule
from .momentum import _check_momentum


class PadaDamp(_DampingSchedule):
    r"""Grow the batch size linearly with the number of model updates.

    "Passive" AdaDamp (Sievert & Charles 2019; DD master ``PadaDamp``):

    .. math::

        D_k = \mathrm{initial} + \mathrm{rate}\cdot k,\qquad
        B_k = \lceil D_k \rceil

    after ``k`` model updates, which approximates :class:`AdaDamp` for
    convex (not strongly convex) losses without evaluating the loss.

    Parameters
    ----------
    initial : int, default=32
        Batch size of the first update.
    rate : float, default=1.0
        Examples added per model update (>= 0).
    max_batch_size, momentum
        As for :class:`GeoDamp`.

    Notes
    -----
    One of the original versions documented ``B_0 * ceil(rate * k)`` but
    computed ``B_0 + ceil(rate * k)``; the code's (additive) meaning is kept.

    Examples
    --------
    >>> d = PadaDamp(initial=8, rate=0.5).reset(n_data=1000)
    >>> [d.next_batch_size(TrainState(k, 0, 0.0, 1000, 1)) for k in range(4)]
    [8, 9, 9, 10]
    """

    def __init__(self, initial: int = 32, rate: float = 1.0, max_batch_size: int | None = None, momentum=None):
        self._keep(locals())

    def _validate(self) -> None:
        self._check("rate", lambda rate: rate >= 0, "a number >= 0 (examples added per model update)")

    def _damping(self, state: TrainState) -> float:
        return self.initial + self.rate * state.n_updates


class CntsDampLR(PadaDamp):
    r"""Decay the learning rate like ``1/k`` at a fixed batch size.

    The continuous damping of :class:`PadaDamp` expressed as a learning-rate
    decay (DD master ``CntsDampLR``, "decay the learning rate by 1/k after k
    model updates"): the batch stays at ``initial`` and

    .. math::

        \mathrm{lr\_factor}_k = \frac{\mathrm{initial}}{\mathrm{initial} +
        \mathrm{rate}\cdot k}.

    Parameters
    ----------
    initial : int, default=32
        The (constant) batch size.
    rate : float, default=0.02
        Growth of the damping per model update (>= 0).
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Notes
    -----
    The original computed ``round(initial + 1 + rate * (k + 1))``, so the
    learning rate was already decayed at the first update; here
    ``lr_factor_0 = 1``.

    Examples
    --------
    >>> d = CntsDampLR(initial=10, rate=1).reset(n_data=1000)
    >>> s = TrainState(10, 0, 0.0, 1000, 1)
    >>> d.next_batch_size(s), d.plan_update(s, 10, None).lr_factor
    (10, 0.5)
    """

    def __init__(self, initial: int = 32, rate: float = 0.02, momentum=None):
        self._keep(locals())

    def _max_batch_size(self):
        return self.initial

    def forecast_batch_size(self, epoch: float) -> int | None:
        return int(self.initial)


class GradientDescent(BaseDamper):
    """Full-batch gradient descent: every update uses the whole data set.

    (DD master ``GradientDescent``.)

    Parameters
    ----------
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Examples
    --------
    >>> d = GradientDescent().reset(n_data=500)
    >>> d.next_batch_size(TrainState(0, 0, 0.0, 500, 1))
    500
    """

    def __init__(self, momentum=None):
        self._keep(locals())

    def reset(self, n_data: int) -> GradientDescent:
        _check_int(n_data, "n_data", low=1)
        _check_momentum(self.momentum, type(self).__name__)
        self.n_data_ = int(n_data)
        return self

    def next_batch_size(self, state: TrainState) -> int:
        return int(state.n_data)

    def forecast_batch_size(self, epoch: float) -> int | None:
        return getattr(self, "n_data_", None)
