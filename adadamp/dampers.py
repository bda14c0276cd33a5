"""Dampers: per-update batch size, learning-rate factor and momentum.

A damper is a small scikit-learn style object (``get_params``/``set_params``,
clonable, picklable) with no Dask and no I/O.  The engine talks to every damper
through the same calls per model update::

    damper_ = clone(user_damper).reset(n_data)          # fresh fit
    B = damper_.next_batch_size(state)                  # before the update
    plan = damper_.plan_update(state, b, stats)         # after the gradient
    damper_.forecast_batch_size(epoch)                  # cluster planning

1. ``next_batch_size(state)`` before the update: how many examples to use.
2. ``plan_update(state, batch_size, stats)`` after the workers returned their
   gradients: the learning-rate factor, the momentum and how far the update
   advances the epoch clock.

State that evolves during training lives in attributes ending in ``_`` and is
created by ``reset``; ``clone`` therefore gives a fresh damper, and ``pickle``
keeps the state (checkpoints).  Parameters are validated in ``reset`` (not in
``__init__``, scikit-learn rules) with a ``ValueError`` naming the parameter.

Catalogue
---------
Batch-size schedules (the "noise level" is expressed as a batch size, the
*damping* ``D``; a batch above ``max_batch_size`` is capped and the learning
rate scaled by ``max_batch_size / D`` instead, Holt & Sievert 2021):

* :class:`Constant` -- fixed batch size.
* :class:`GeoDamp` / :class:`GeoDampLR` -- geometric growth every ``delay``
  epochs (Smith et al. 2017; Holt & Sievert 2021), or the same schedule as a
  learning-rate decay.
* :class:`AdaDamp`, :class:`PadaDamp`, :class:`RadaDamp`, :class:`CntsDampLR`,
  :class:`GradientDescent` -- the original adadamp family (Sievert & Charles
  2019, "Improving the convergence of SGD through adaptive batch sizes").

Learning-rate rules for a changing batch size (they wrap a batch schedule):

* :class:`AdaScale` -- gain-ratio scaling (Johnson et al. 2020, Alg. 2).
* :class:`DynamicSGD` -- momentum compensation (Lin et al. 2019, §3.2 eq. 6)
  or the velocity form of Lin et al. 2019, App. B.4.

Every damper accepts ``momentum`` (None, a float, a callable
``momentum(n_workers, batch_size)`` or ``"tang"``, see :func:`tang_momentum`).
Callables given as parameters must be module-level functions if the damper is
to be pickled (checkpoints); lambdas clone but do not pickle.

:func:`simulate_schedule` and :func:`count_updates` run a damper through the
engine's epoch loop without any model (schedules, update counts).

The formulas and numeric oracles are in ``notes/algorithms.md`` (the spec).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from sklearn.base import BaseEstimator, clone

__all__ = [
    "AdaDamp",
    "AdaScale",
    "BaseDamper",
    "CntsDampLR",
    "Constant",
    "DynamicSGD",
    "GeoDamp",
    "GeoDampLR",
    "GradStats",
    "GradientDescent",
    "PadaDamp",
    "RadaDamp",
    "TrainState",
    "UpdatePlan",
    "count_updates",
    "simulate_schedule",
    "tang_momentum",
]


# --------------------------------------------------------------------------
# Protocol
# --------------------------------------------------------------------------


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
    """Base class of every damper (see module docstring for the protocol).

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


# --------------------------------------------------------------------------
# Momentum rules (Tang et al.; algorithms.md §4)
# --------------------------------------------------------------------------


def tang_momentum(n_workers: int, batch_size: int | None = None) -> float:
    """Momentum that rises with the number of workers (the ``"tang"`` preset).

    A step function of the worker count ``P`` interpolating the data points
    of Tang et al. ("Increasing momentum-like factors", §4.3-4.4, Tables 1-4;
    ``algorithms.md`` §4): 0.9 for ``P <= 4``, 0.95 for ``5 <= P <= 16``,
    0.975 for ``17 <= P <= 31`` and 0.99 for ``P >= 32``.  The paper gives
    data points, not a formula; this preset is a heuristic and opt-in.

    Parameters
    ----------
    n_workers : int
        Live workers at this update.
    batch_size : int, optional
        Unused; present so the function has the signature of a momentum rule.

    Returns
    -------
    float

    Examples
    --------
    >>> tang_momentum(1), tang_momentum(8), tang_momentum(20), tang_momentum(64)
    (0.9, 0.95, 0.975, 0.99)
    """
    p = int(n_workers)
    if p <= 4:
        return 0.9
    if p <= 16:
        return 0.95
    if p <= 31:
        return 0.975
    return 0.99


_MOMENTUM_PRESETS = {"tang": tang_momentum}


def _check_momentum(momentum, owner: str) -> None:
    if momentum is None:
        return
    if isinstance(momentum, str):
        if momentum not in _MOMENTUM_PRESETS:
            raise ValueError(
                f"{owner}: momentum={momentum!r} is not a known preset; use one "
                f"of {sorted(_MOMENTUM_PRESETS)}, a float in [0, 1), a callable "
                "momentum(n_workers, batch_size) or None."
            )
        return
    if callable(momentum):
        return
    if not _is_real(momentum) or not 0 <= momentum < 1:
        raise ValueError(
            f"{owner}: momentum must be None, a float in [0, 1), a callable "
            f"momentum(n_workers, batch_size) or 'tang'; got {momentum!r}."
        )


def _resolve_momentum(momentum, n_workers: int, batch_size: int) -> float | None:
    """The momentum of this update from a momentum rule (or None)."""
    if momentum is None:
        return None
    if isinstance(momentum, str):
        value = _MOMENTUM_PRESETS[momentum](n_workers, batch_size)
    elif callable(momentum):
        value = momentum(n_workers, batch_size)
    else:
        return float(momentum)
    if not _is_real(value) or not 0 <= value < 1:
        raise ValueError(
            f"momentum rule {momentum!r} returned {value!r} for "
            f"n_workers={n_workers}, batch_size={batch_size}; it must return "
            "a float in [0, 1)."
        )
    return float(value)


# --------------------------------------------------------------------------
# Constant
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Damping schedules (Holt & Sievert 2021; Sievert & Charles 2019)
# --------------------------------------------------------------------------


class _DampingSchedule(BaseDamper):
    """Shared rule of the damping schedules.

    A subclass defines the damping ``D_t`` (a float, "noise level as a batch
    size") in ``_damping(state)``; this class turns it into a batch size and
    a learning-rate factor (DD master ``BaseDamper.step``; ``algorithms.md``
    §5.1)::

        B_t = min(ceil(D_t), cap),   lr_factor_t = cap / D_t if D_t > cap else 1

    so that ``B_t / lr_t == D_t / lr_0`` whenever the cap is active.  ``cap``
    is ``min(max_batch_size, n_data)`` (``n_data`` when ``max_batch_size`` is
    None: a batch cannot hold more examples than the data set, so beyond it
    the damping continues as a learning-rate decay), but never below
    ``initial`` (no decay at the start on a tiny data set).

    Fitted attributes: ``damping_`` (the last ``D_t``), ``cap_``, ``n_data_``.

    Adaptive subclasses (``_adaptive = True``) update their averages in
    ``_damping``; a repeated ``next_batch_size`` call for the same
    ``state.n_updates`` (the engine may ask once more to size the cluster)
    then returns the same batch without observing the state twice.
    """

    _adaptive = False

    def _max_batch_size(self):
        return self.max_batch_size

    def _validate(self) -> None:
        """Subclass hook: validate the subclass's own parameters."""

    def _reset_state(self) -> None:
        """Subclass hook: create the subclass's own fitted attributes."""

    def _damping(self, state: TrainState) -> float:
        raise NotImplementedError

    def reset(self, n_data: int):
        name = type(self).__name__
        _check_int(self.initial, "initial", low=1, owner=name)
        mbs = self._max_batch_size()
        if mbs is not None:
            _check_int(mbs, "max_batch_size", low=1, owner=name)
            if mbs < self.initial:
                raise ValueError(
                    f"{name}: max_batch_size={mbs} is smaller than "
                    f"initial={self.initial}; use max_batch_size >= initial "
                    "or None (no cap other than the data set size)."
                )
        _check_int(n_data, "n_data", low=1)
        _check_momentum(self.momentum, name)
        self._validate()
        self.n_data_ = int(n_data)
        cap = int(n_data) if mbs is None else min(int(mbs), int(n_data))
        self.cap_ = max(int(self.initial), cap)
        self.damping_ = float(self.initial)
        self.last_update_ = None
        self._reset_state()
        return self

    def _batch_for(self, damping: float, cap) -> int:
        if cap is not None and damping > cap:
            return int(cap)
        return max(1, _ceil(damping))

    def next_batch_size(self, state: TrainState) -> int:
        if not (self._adaptive and state.n_updates == self.last_update_):
            damping = float(self._damping(state))
            if math.isfinite(damping) and damping > 0:
                self.damping_ = damping
            self.last_update_ = state.n_updates
        return self._batch_for(self.damping_, self.cap_)

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        lr_factor = 1.0
        if self.damping_ > self.cap_:
            lr_factor = self.cap_ / self.damping_
        m = _resolve_momentum(self.momentum, state.n_workers, batch_size)
        return UpdatePlan(lr_factor=lr_factor, momentum=m)


class GeoDamp(_DampingSchedule):
    r"""Grow the batch size geometrically with the epochs.

    The damping (noise level expressed as a batch size) at epoch ``e`` is

    .. math::

        D(e) = \mathrm{initial}\cdot\mathrm{factor}^{\lfloor e/\mathrm{delay}
        \rfloor}

    ("increase the batch size by a factor of 5 every 60 epochs", Holt &
    Sievert 2021, "Batch size increase"; Smith et al. 2017, "Don't decay the
    learning rate, increase the batch size").  While ``D`` is at most
    ``max_batch_size`` the batch is ``D`` and the learning rate is unchanged;
    above it the batch stays at ``max_batch_size`` and the learning rate is
    multiplied by ``max_batch_size / D`` instead (so the ratio batch / lr,
    the noise level, still follows ``D``; DD master ``BaseDamper.step``).
    With the engine's accounting (``ceil(n_data / B)`` updates per epoch,
    batch changes at epoch boundaries) this reproduces Holt & Sievert's
    Table 1 update counts exactly (``algorithms.md`` §5.2).

    Parameters
    ----------
    initial : int, default=32
        Batch size at epoch 0.
    delay : float, default=5
        Epochs between two increases (> 0).  Counted on the engine's epoch
        clock: data epochs, or scale-invariant epochs under :class:`AdaScale`.
    factor : float, default=2
        Growth factor (>= 1); 1 means a constant batch.
    max_batch_size : int or None, default=None
        Largest batch; beyond it the learning rate decays instead.  None is
        the data set size (the cap is never above it, nor below ``initial``).
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Attributes
    ----------
    damping_ : float
        Damping ``D`` of the last update.

    Notes
    -----
    The original adadamp had three incompatible parameter sets
    (``dampingdelay``/``dampingfactor``, ``dwell``/``factor`` where ``factor``
    was silently replaced by ``dwell``, and ``delay``/``factor`` that never
    reached the damper); only ``initial``/``delay``/``factor`` exist here.
    The damping is evaluated at every update (no ``wait``/``dwell`` lag).
    A tolerance of 1e-9 epochs absorbs rounding of the epoch clock at a
    boundary.

    Examples
    --------
    >>> d = GeoDamp(initial=128, delay=60, factor=5, max_batch_size=640)
    >>> [d.forecast_batch_size(e) for e in (0, 60, 120, 180)]
    [128, 640, 640, 640]
    >>> _ = d.reset(n_data=50_000)
    >>> state = TrainState(0, 0, epoch=130.0, n_data=50_000, n_workers=5)
    >>> d.next_batch_size(state), d.plan_update(state, 640, None).lr_factor
    (640, 0.2)
    >>> count_updates(d, n_data=50_000, max_epochs=200)
    34520
    """

    def __init__(
        self,
        initial: int = 32,
        delay: float = 5,
        factor: float = 2,
        max_batch_size: int | None = None,
        momentum=None,
    ):
        self.initial = initial
        self.delay = delay
        self.factor = factor
        self.max_batch_size = max_batch_size
        self.momentum = momentum

    def _validate(self) -> None:
        name = type(self).__name__
        if not _is_real(self.delay) or not self.delay > 0:
            raise ValueError(
                f"{name}: delay must be a number of epochs > 0; got "
                f"{self.delay!r}."
            )
        if not _is_real(self.factor) or not self.factor >= 1:
            raise ValueError(
                f"{name}: factor must be >= 1 (the damping grows by `factor` "
                f"every `delay` epochs); got {self.factor!r}.  To decay the "
                "learning rate at a fixed batch size use GeoDampLR."
            )

    def damping(self, epoch: float) -> float:
        """The damping ``D(epoch)`` (pure; no state is read or written)."""
        n_steps = math.floor(float(epoch) / self.delay + 1e-9)
        return float(self.initial) * float(self.factor) ** max(n_steps, 0)

    def _damping(self, state: TrainState) -> float:
        return self.damping(state.epoch)

    def forecast_batch_size(self, epoch: float) -> int | None:
        cap = getattr(self, "cap_", self._max_batch_size())
        return self._batch_for(self.damping(epoch), cap)


class GeoDampLR(GeoDamp):
    r"""Decay the learning rate geometrically at a fixed batch size.

    The same schedule as :class:`GeoDamp` with the batch held at
    ``initial``: the learning rate is multiplied by
    ``1 / factor**floor(e / delay)`` (DD master ``GeoDampLR``: GeoDamp with
    ``max_batch_size = initial``).  This is the classic step decay, the
    baseline of Holt & Sievert 2021, Table 1 (row "128").

    Parameters
    ----------
    initial : int, default=32
        The (constant) batch size.
    delay : float, default=5
        Epochs between two decays (> 0).
    factor : float, default=2
        Decay factor (>= 1).
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Examples
    --------
    >>> d = GeoDampLR(initial=128, delay=60, factor=5).reset(n_data=50_000)
    >>> state = TrainState(0, 0, epoch=125.0, n_data=50_000, n_workers=1)
    >>> d.next_batch_size(state), d.plan_update(state, 128, None).lr_factor
    (128, 0.04)
    """

    def __init__(
        self, initial: int = 32, delay: float = 5, factor: float = 2, momentum=None
    ):
        self.initial = initial
        self.delay = delay
        self.factor = factor
        self.momentum = momentum

    def _max_batch_size(self):
        return self.initial


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
    max_batch_size : int or None, default=None
        Largest batch; beyond it the learning rate decays by
        ``max_batch_size / D`` instead.  None is the data set size.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

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

    def __init__(
        self,
        initial: int = 32,
        rate: float = 1.0,
        max_batch_size: int | None = None,
        momentum=None,
    ):
        self.initial = initial
        self.rate = rate
        self.max_batch_size = max_batch_size
        self.momentum = momentum

    def _validate(self) -> None:
        if not _is_real(self.rate) or not self.rate >= 0:
            raise ValueError(
                f"{type(self).__name__}: rate must be a number >= 0 (examples "
                f"added per model update); got {self.rate!r}."
            )

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
        self.initial = initial
        self.rate = rate
        self.momentum = momentum

    def _max_batch_size(self):
        return self.initial

    def forecast_batch_size(self, epoch: float) -> int | None:
        return int(self.initial)


class AdaDamp(_DampingSchedule):
    r"""Grow the batch size as the training loss falls.

    AdaDamp (Sievert & Charles 2019, "Improving the convergence of SGD
    through adaptive batch sizes"; DD master ``AdaDamp.damping``):

    .. math::

        B_k = \left\lceil B_0 \frac{F(w_0) - F^\star}{F(w_k) - F^\star}
        \right\rceil

    The original evaluated the full training loss ``F`` (a pass over the
    data set) every 20 updates.  Here ``F(w_k)`` is estimated from the mean
    batch losses the engine already computes (``TrainState.loss``), smoothed
    with a debiased exponential moving average of memory ``rho`` (the
    original ``approx_loss`` mode averaged the last 10 batch losses);
    ``F(w_0)`` is the first such estimate.

    Parameters
    ----------
    initial : int, default=32
        ``B_0``, the first batch size.
    best_train_loss : float, default=0.0
        ``F*``, a lower bound of the training loss (0 for most losses).
    rho : float, default=0.9
        Memory of the loss average, in [0, 1); 0 uses the last batch loss.
    max_batch_size : int or None, default=None
        Largest batch; beyond it the learning rate decays by
        ``max_batch_size / D`` instead.  None is the data set size.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Notes
    -----
    Requires ``TrainState.loss`` (the previous update's mean batch loss);
    raises ``RuntimeError`` when it is missing after the first update.  The
    original's ``best_train_loss`` argument was never used (it read a key
    that was never set) and a NaN loss set the batch size to 1; here
    ``best_train_loss`` is used and a non-finite loss, or a loss at or below
    ``F*``, keeps the previous batch size.

    Examples
    --------
    >>> d = AdaDamp(initial=10, rho=0.0).reset(n_data=1000)
    >>> d.next_batch_size(TrainState(0, 0, 0.0, 1000, 1))
    10
    >>> d.next_batch_size(TrainState(1, 10, 0.01, 1000, 1, loss=2.0))
    10
    >>> d.next_batch_size(TrainState(2, 20, 0.02, 1000, 1, loss=0.5))
    40
    """

    _adaptive = True

    def __init__(
        self,
        initial: int = 32,
        best_train_loss: float = 0.0,
        rho: float = 0.9,
        max_batch_size: int | None = None,
        momentum=None,
    ):
        self.initial = initial
        self.best_train_loss = best_train_loss
        self.rho = rho
        self.max_batch_size = max_batch_size
        self.momentum = momentum

    def _validate(self) -> None:
        name = type(self).__name__
        if not _is_real(self.best_train_loss) or not math.isfinite(
            self.best_train_loss
        ):
            raise ValueError(
                f"{name}: best_train_loss must be a finite number (a lower "
                f"bound of the loss, usually 0); got {self.best_train_loss!r}."
            )
        if not _is_real(self.rho) or not 0 <= self.rho < 1:
            raise ValueError(
                f"{name}: rho must be in [0, 1) (memory of the loss average); "
                f"got {self.rho!r}."
            )

    def _reset_state(self) -> None:
        self.loss_sum_ = 0.0
        self.loss_weight_ = 0.0
        self.initial_loss_ = None
        self.loss_avg_ = None

    def _damping(self, state: TrainState) -> float:
        loss = state.loss
        if loss is None:
            if state.n_updates > 0:
                raise RuntimeError(
                    "AdaDamp needs TrainState.loss (the previous update's mean "
                    "batch loss) after the first update; the engine gave None."
                )
            return float(self.initial)
        loss = float(loss)
        if not math.isfinite(loss):
            return self.damping_
        self.loss_sum_ = self.rho * self.loss_sum_ + (1 - self.rho) * loss
        self.loss_weight_ = self.rho * self.loss_weight_ + (1 - self.rho)
        self.loss_avg_ = self.loss_sum_ / self.loss_weight_
        if self.initial_loss_ is None:
            self.initial_loss_ = self.loss_avg_
        num = self.initial_loss_ - self.best_train_loss
        den = self.loss_avg_ - self.best_train_loss
        if num <= 0 or den <= 0:
            return self.damping_
        return self.initial * num / den


class RadaDamp(_DampingSchedule):
    r"""Grow the batch size as loss and gradient norm fall (moving averages).

    RadaDamp (DD master ``RadaDamp``): with exponential moving averages
    ``L_k`` of the batch loss and ``G_k`` of the squared norm of the batch
    gradient ``||g_bar||^2``,

    .. math::

        D_k = B_0 \max\left(1, \frac{c\,L_0 + G_0}{c\,L_k + G_k}\right)

    where ``c`` is ``fudge`` and ``L_0, G_0`` are the plain means over the
    first ``wait`` updates (during which the batch stays at ``B_0``).

    Parameters
    ----------
    initial : int, default=32
        ``B_0``.
    rho : float, default=0.999
        Memory of the moving averages, in [0, 1).
    fudge : float, default=0.01
        Weight ``c`` of the loss relative to the gradient norm (>= 0).
    wait : int, default=50
        Updates used to measure ``L_0`` and ``G_0`` (>= 1).
    max_batch_size : int or None, default=None
        Largest batch; beyond it the learning rate decays by
        ``max_batch_size / D`` instead.  None is the data set size.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Notes
    -----
    Reads ``GradStats.grad_sq_norm`` in :meth:`plan_update` (hence
    ``needs_grad_stats``) and ``TrainState.loss`` (required unless
    ``fudge == 0``).  The original
    computed a full-data-set gradient and loss at the first update and only
    advanced the averages when the damping was re-evaluated (every ``dwell``
    updates); here both averages advance once per update from quantities
    the engine already has, and the batch is rounded up, not truncated.

    Examples
    --------
    >>> d = RadaDamp(initial=4, wait=1, fudge=0.0, rho=0.0).reset(1000)
    >>> for k, g2 in enumerate([4.0, 2.0, 1.0]):
    ...     s = TrainState(k, 0, 0.0, 1000, 1)
    ...     b = d.next_batch_size(s)
    ...     _ = d.plan_update(s, b, GradStats(b, g2, 0.0, 0))
    >>> d.next_batch_size(TrainState(3, 0, 0.0, 1000, 1))
    16
    """

    #: The squared norm of the batch gradient is read from ``GradStats``.
    needs_grad_stats = True
    _adaptive = True

    def __init__(
        self,
        initial: int = 32,
        rho: float = 0.999,
        fudge: float = 0.01,
        wait: int = 50,
        max_batch_size: int | None = None,
        momentum=None,
    ):
        self.initial = initial
        self.rho = rho
        self.fudge = fudge
        self.wait = wait
        self.max_batch_size = max_batch_size
        self.momentum = momentum

    def _validate(self) -> None:
        name = type(self).__name__
        if not _is_real(self.rho) or not 0 <= self.rho < 1:
            raise ValueError(
                f"{name}: rho must be in [0, 1) (memory of the moving "
                f"averages); got {self.rho!r}."
            )
        if not _is_real(self.fudge) or not self.fudge >= 0:
            raise ValueError(
                f"{name}: fudge must be a number >= 0 (weight of the loss); "
                f"got {self.fudge!r}."
            )
        _check_int(self.wait, "wait", low=1, owner=name)

    def _reset_state(self) -> None:
        self.n_observed_ = 0
        self.loss_avg_ = 0.0
        self.grad_avg_ = 0.0
        self.initial_factor_ = None
        self.last_grad_sq_norm_ = None

    def _damping(self, state: TrainState) -> float:
        g2, self.last_grad_sq_norm_ = self.last_grad_sq_norm_, None
        loss = state.loss
        if loss is None:
            if state.n_updates > 0 and self.fudge != 0:
                raise RuntimeError(
                    "RadaDamp needs TrainState.loss (the previous update's mean "
                    "batch loss) after the first update unless fudge == 0."
                )
            loss = 0.0
        if g2 is not None and math.isfinite(loss):
            if self.n_observed_ < self.wait:
                n = self.n_observed_
                self.loss_avg_ = (n * self.loss_avg_ + loss) / (n + 1)
                self.grad_avg_ = (n * self.grad_avg_ + g2) / (n + 1)
                self.n_observed_ += 1
                if self.n_observed_ == self.wait:
                    self.initial_factor_ = self._noise()
            else:
                r = self.rho
                self.loss_avg_ = r * self.loss_avg_ + (1 - r) * loss
                self.grad_avg_ = r * self.grad_avg_ + (1 - r) * g2
        if self.initial_factor_ is None:
            return float(self.initial)
        div = self._noise()
        if not div > 0:
            return self.damping_
        return self.initial * max(1.0, self.initial_factor_ / div)

    def _noise(self) -> float:
        return self.fudge * self.loss_avg_ + self.grad_avg_

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        if stats is not None and math.isfinite(stats.grad_sq_norm):
            self.last_grad_sq_norm_ = float(stats.grad_sq_norm)
        return super().plan_update(state, batch_size, stats)


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
        self.momentum = momentum

    def reset(self, n_data: int) -> GradientDescent:
        _check_int(n_data, "n_data", low=1)
        _check_momentum(self.momentum, type(self).__name__)
        self.n_data_ = int(n_data)
        return self

    def next_batch_size(self, state: TrainState) -> int:
        return int(state.n_data)

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        m = _resolve_momentum(self.momentum, state.n_workers, batch_size)
        return UpdatePlan(momentum=m)

    def forecast_batch_size(self, epoch: float) -> int | None:
        return getattr(self, "n_data_", None)


# --------------------------------------------------------------------------
# AdaScale (Johnson et al. 2020)
# --------------------------------------------------------------------------


class AdaScale(BaseDamper):
    r"""Scale the learning rate by the gain ratio (AdaScale SGD).

    Johnson et al. 2020, "AdaScale SGD: A user-friendly algorithm for
    distributed training", Alg. 2.  With base batch size ``b0`` (the batch
    size the learning-rate schedule ``lr(.)`` was tuned for) and scale
    ``S_t = B_t / b0``, each update uses

    .. math::

        r_t = \frac{\sigma^2/b_0 + \mu^2}{\sigma^2/B_t + \mu^2}, \qquad
        \eta_t = r_t \cdot \mathrm{lr}(\lfloor\tau_t\rfloor), \qquad
        \tau_{t+1} = \tau_t + r_t

    where ``sigma^2`` is the per-example gradient variance (trace of the
    covariance) and ``mu^2 = ||grad F||^2``.  ``r_t`` interpolates between
    identity scaling (``r = 1``, gradient dominated) and linear scaling
    (``r = S``, noise dominated).  ``tau`` counts scale-invariant (base-batch)
    iterations; each update advances the engine's epoch clock by
    ``progress = r_t * b0`` examples, so epochs are scale-invariant epochs
    ``tau * b0 / n_data`` and training stops after as many of them as the
    scale-1 run (``algorithms.md`` §2.7).

    Estimation (``algorithms.md`` §2.3, unbiased for unequal chunks): from
    ``GradStats`` with ``N`` examples in ``k >= 2`` chunks,
    ``Q = sum_j ||G_j||^2 / n_j`` and ``g = ||g_bar||^2``,

    .. math::

        \hat\sigma^2 = \frac{Q - N g}{k - 1}, \qquad
        \hat\mu^2 = g - \hat\sigma^2 / N .

    Both are smoothed by a debiased exponential moving average with weight
    ``theta_t = smoothing ** S_t`` (a memory of about ``1/(1 - smoothing)``
    base batches, as adaptdl), updated *before* the gain is computed, and
    clamped only at use: ``var = max(sigma2_avg / b0, 1e-6)``,
    ``sqr = max(mu2_avg, 0)``, so ``1 <= r <= S`` for ``S >= 1``.  ``r = 1``
    exactly when ``S == 1`` (bit-identical to plain SGD) and before the first
    estimate; updates with ``k < 2`` or non-finite statistics leave the
    averages unchanged.  A change of the batch size does not touch the
    averages (they are per example; fairscale's rescale is not copied).

    Parameters
    ----------
    batch_size : int or damper, default=32
        The batch schedule at scale: a constant batch size, or a damper
        whose batch sizes are used (e.g. ``GeoDamp(initial=128, ...)``).  The
        wrapped damper's own learning-rate factor (its ``max_batch_size``
        rule) is ignored: AdaScale owns the learning rate (§2.7).  Its
        momentum is used when ``momentum`` is None.
    base_batch_size : int or None, default=None
        ``b0``.  None takes the wrapped damper's ``initial`` (or
        ``batch_size`` of a :class:`Constant`), or ``batch_size`` itself when
        it is an int (then ``S = 1``: plain SGD).
    lr_schedule : None, callable or damper, default=None
        The scale-1 learning-rate schedule as a factor of the base learning
        rate, indexed by scale-invariant iterations ``t = floor(tau)``:
        a callable ``lr_schedule(t) -> float``, or a damper run at scale 1
        (e.g. ``GeoDampLR(initial=b0, delay=60, factor=5)``: its
        learning-rate factor at iteration ``t``, epoch ``t * b0 / n_data``).
        None is a constant schedule (factor 1).
    smoothing : float, default=0.999
        Per-base-batch weight of the moving averages, in (0, 1).
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).  Johnson et al. keep
        momentum fixed (0.9); it scales with the learning rate as in
        fairscale.

    Attributes
    ----------
    gain_ : float
        Gain ratio ``r`` of the last update.
    tau_ : float
        Scale-invariant iterations so far.
    base_batch_size_ : int
        ``b0``.

    Notes
    -----
    Workers must return per-chunk statistics (``needs_grad_stats``); with a
    single chunk no estimate is possible (one backward over many examples is
    one sample, fairscale ``test_loss_accum_cpu``).  AdaScale is defined for
    SGD with or without momentum, not for Adam.

    Examples
    --------
    >>> d = AdaScale(batch_size=2, base_batch_size=1).reset(n_data=1000)
    >>> s = TrainState(0, 0, 0.0, 1000, 2)
    >>> d.next_batch_size(s)
    2
    >>> # two orthogonal one-example chunks: pure noise, so r = S (linear)
    >>> plan = d.plan_update(s, 2, GradStats(2, 0.5, 2.0, 2))
    >>> float(plan.lr_factor), float(plan.progress)
    (2.0, 2.0)

    Growing the batch with GeoDamp while following a scale-1 step decay:

    >>> d = AdaScale(batch_size=GeoDamp(initial=128, delay=60, factor=5),
    ...              lr_schedule=GeoDampLR(initial=128, delay=60, factor=5))
    >>> d.reset(n_data=50_000).base_batch_size_
    128
    """

    needs_grad_stats = True

    def __init__(
        self,
        batch_size=32,
        base_batch_size: int | None = None,
        lr_schedule=None,
        smoothing: float = 0.999,
        momentum=None,
    ):
        self.batch_size = batch_size
        self.base_batch_size = base_batch_size
        self.lr_schedule = lr_schedule
        self.smoothing = smoothing
        self.momentum = momentum

    # -- pure helpers ------------------------------------------------------

    @staticmethod
    def estimate(stats: GradStats | None):
        """Unbiased ``(sigma2, mu2)`` of one update (§2.3 eq. 2.2-2.3).

        Returns None when there are fewer than two chunks or the result is
        not finite.  ``sigma2`` is the per-example variance; ``mu2`` may be
        negative (it is clamped only at use).
        """
        if stats is None or stats.n_chunks < 2 or stats.n_samples < 2:
            return None
        n = float(stats.n_samples)
        g2 = float(stats.grad_sq_norm)
        sigma2 = (float(stats.chunk_sq_norm_sum) - n * g2) / (stats.n_chunks - 1)
        mu2 = g2 - sigma2 / n
        if not (math.isfinite(sigma2) and math.isfinite(mu2)):
            return None
        return sigma2, mu2

    @staticmethod
    def gain_ratio(grad_var, grad_sqr, scale):
        """Gain ``(v + m) / (v / S + m)`` with ``v >= 1e-6`` and ``m >= 0``.

        ``grad_var`` is the variance of a *base-batch* gradient
        (``sigma2 / b0``), ``grad_sqr`` the squared gradient norm, ``scale``
        ``S = B / b0``.  Works element-wise on arrays.
        """
        v = np.maximum(grad_var, 1e-6)
        m = np.maximum(grad_sqr, 0.0)
        return (v + m) / (v / scale + m)

    def grad_variance(self) -> float | None:
        """Smoothed per-example gradient variance (None before an estimate)."""
        if not getattr(self, "ema_weight_", 0.0):
            return None
        return self.sigma2_sum_ / self.ema_weight_

    def grad_sqr(self) -> float | None:
        """Smoothed ``||grad F||^2`` (None before an estimate; may be < 0)."""
        if not getattr(self, "ema_weight_", 0.0):
            return None
        return self.mu2_sum_ / self.ema_weight_

    # -- protocol ----------------------------------------------------------

    def reset(self, n_data: int) -> AdaScale:
        name = type(self).__name__
        _check_int(n_data, "n_data", low=1)
        if not _is_real(self.smoothing) or not 0 < self.smoothing < 1:
            raise ValueError(
                f"{name}: smoothing must be in (0, 1) (per-base-batch weight of "
                f"the moving averages, e.g. 0.999); got {self.smoothing!r}."
            )
        _check_momentum(self.momentum, name)
        self.schedule_ = _make_schedule(self.batch_size, "batch_size", name, n_data)
        self.base_batch_size_ = _base_batch_size(
            self.base_batch_size, self.batch_size, name
        )
        ls = self.lr_schedule
        if isinstance(ls, type):
            raise TypeError(
                f"{name}: lr_schedule must be an instance such as "
                f"{ls.__name__}(...), not the class."
            )
        if isinstance(ls, BaseDamper):
            self.lr_schedule_ = clone(ls).reset(n_data)
        elif ls is None or callable(ls):
            self.lr_schedule_ = ls
        else:
            raise ValueError(
                f"{name}: lr_schedule must be None, a callable "
                f"lr_schedule(iteration) -> float or a damper; got {ls!r}."
            )
        self.n_data_ = int(n_data)
        self.tau_ = 0.0
        self.gain_ = 1.0
        self.sigma2_sum_ = 0.0
        self.mu2_sum_ = 0.0
        self.ema_weight_ = 0.0
        self.n_estimates_ = 0
        self.lr_cache_ = (None, 1.0)
        return self

    def next_batch_size(self, state: TrainState) -> int:
        return self.schedule_.next_batch_size(state)

    def _lr_at(self, t: int, state: TrainState) -> float:
        if self.lr_cache_[0] == t:
            return self.lr_cache_[1]
        ls = self.lr_schedule_
        if ls is None:
            value = 1.0
        elif isinstance(ls, BaseDamper):
            b0 = self.base_batch_size_
            s1 = TrainState(
                n_updates=t,
                n_samples_seen=t * b0,
                epoch=t * b0 / self.n_data_,
                n_data=self.n_data_,
                n_workers=state.n_workers,
            )
            ls.next_batch_size(s1)
            value = float(ls.plan_update(s1, b0, None).lr_factor)
        else:
            value = float(ls(t))
        self.lr_cache_ = (t, value)
        return value

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        inner = self.schedule_.plan_update(state, batch_size, stats)
        b0 = self.base_batch_size_
        scale = batch_size / b0
        est = self.estimate(stats)
        if est is not None:
            # EMA first, then the gain ("fresh estimates", adaptdl PR #54).
            theta = self.smoothing**scale
            self.sigma2_sum_ = theta * self.sigma2_sum_ + (1 - theta) * est[0]
            self.mu2_sum_ = theta * self.mu2_sum_ + (1 - theta) * est[1]
            self.ema_weight_ = theta * self.ema_weight_ + (1 - theta)
            self.n_estimates_ += 1
        if scale == 1 or self.n_estimates_ == 0:
            r = 1.0
        else:
            r = float(self.gain_ratio(self.grad_variance() / b0, self.grad_sqr(), scale))
        self.gain_ = r
        lr_factor = r * self._lr_at(math.floor(self.tau_), state)
        self.tau_ += r
        m = _resolve_momentum(self.momentum, state.n_workers, batch_size)
        if m is None:
            m = inner.momentum
        return UpdatePlan(lr_factor=lr_factor, momentum=m, progress=r * b0)

    def forecast_batch_size(self, epoch: float) -> int | None:
        sched = getattr(self, "schedule_", None)
        if sched is None:
            if isinstance(self.batch_size, BaseDamper):
                return self.batch_size.forecast_batch_size(epoch)
            return int(self.batch_size)
        return sched.forecast_batch_size(epoch)


# --------------------------------------------------------------------------
# Dynamic SGD (Lin et al. 2019)
# --------------------------------------------------------------------------


class DynamicSGD(BaseDamper):
    r"""Linear learning-rate scaling with momentum compensation.

    Lin et al. 2019, "Dynamic mini-batch SGD for elastic distributed
    training", §3.2 eq. 6.  The learning rate follows the linear scaling rule
    ``lr_t = f(t) * lr_0 * B_t / b0`` (Goyal et al.), but when the batch
    grows by ``k`` at update ``t0`` the factor is ramped instead of jumping,
    so the momentum buffer accumulated at the old batch size is not
    amplified ``k`` times (LIN eq. 5, which raises its noise ``k^2`` times):

    .. math::

        \gamma_t = 1 + \frac{t - t_0}{T}(k - 1)\ \text{ if } t - t_0 < T,
        \qquad \gamma_t = k \text{ otherwise}, \qquad T = 8k

    (``s = t - t0 = 1`` is the first update with the new batch).  Decreases
    take effect at once (LIN footnote 3).  Repeated changes keep the
    learning rate continuous (``algorithms.md`` §3.3): from the current
    multiplier ``m`` to the new target ``M = B / b0``, an increase (also in
    the middle of a ramp) starts a new ramp with ``k = M / m``; ``M <= m``
    jumps to ``M``.

    ``compensation="velocity"`` is LIN App. B.4 (eq. 13) instead: the
    velocity form ``v <- mu v + eta_hat * sum_i grad_i`` with a per-example
    step ``eta_hat``, i.e. ``lr_t = lr_0 * B_t / b0`` at once, and at every
    change of the batch size the momentum buffers are multiplied by
    ``B_old / B_new`` (``UpdatePlan.momentum_buffer_scale``) so that
    ``lr * buffer`` is continuous.  No ramp, no extra hyper-parameter,
    increases and decreases alike (LIN did not evaluate it).

    Parameters
    ----------
    batch_size : int or damper, default=32
        The batch schedule: a constant batch size or a damper whose batch
        sizes are used.  The damper's own learning-rate factor is multiplied
        in as the base schedule ``f(t)`` (LIN §5.1 combines the rule with a
        decay schedule); its momentum is used when ``momentum`` is None.
    base_batch_size : int or None, default=None
        ``b0``, the batch size the base learning rate is tuned for.  None
        takes ``per_worker_batch`` in elastic mode, else the damper's
        ``initial`` (or ``batch_size`` of a :class:`Constant`), or the int
        ``batch_size``.
    per_worker_batch : int or None, default=None
        Elastic mode: when given, the batch is
        ``per_worker_batch * state.n_workers`` and ``batch_size`` is unused
        (LIN §3: the batch follows the number of workers).
    compensation : {"ramp", "velocity"}, default="ramp"
        ``"ramp"``: eq. 6.  ``"velocity"``: App. B.4.
    compensation_iters : None, float or callable, default=None
        Ramp length ``T`` in updates: None is ``8 * k`` ("T = 8k works
        well", read as 8k iterations, ``algorithms.md`` §3.1), a number is a
        fixed ``T``, a callable ``T = compensation_iters(k)``.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Attributes
    ----------
    multiplier_ : float
        Current multiplier ``(B / b0) * c`` of the base learning rate
        (without ``f(t)``).

    Notes
    -----
    The ramp follows the *requested* batch size, so the smaller last batch
    of a data epoch does not start a ramp.  The velocity form follows the
    batch actually used (it is exact per example).  The momentum buffers
    must survive batch changes (they live on the central process).

    Examples
    --------
    The batch grows 10 -> 40 at epoch 1 (``k = 4``, ``T = 32``): the factor
    ramps ``1 + s * 3 / 32`` instead of jumping to 4.

    >>> d = DynamicSGD(batch_size=GeoDamp(initial=10, delay=1, factor=4))
    >>> _ = d.reset(n_data=1000)
    >>> for epoch in (0.0, 1.0, 1.04):
    ...     s = TrainState(0, 0, epoch, n_data=1000, n_workers=1)
    ...     b = d.next_batch_size(s)
    ...     print(b, d.plan_update(s, b, None).lr_factor)
    10 1.0
    40 1.09375
    40 1.1875
    """

    def __init__(
        self,
        batch_size=32,
        base_batch_size: int | None = None,
        per_worker_batch: int | None = None,
        compensation: str = "ramp",
        compensation_iters=None,
        momentum=None,
    ):
        self.batch_size = batch_size
        self.base_batch_size = base_batch_size
        self.per_worker_batch = per_worker_batch
        self.compensation = compensation
        self.compensation_iters = compensation_iters
        self.momentum = momentum

    def reset(self, n_data: int) -> DynamicSGD:
        name = type(self).__name__
        _check_int(n_data, "n_data", low=1)
        if self.compensation not in ("ramp", "velocity"):
            raise ValueError(
                f"{name}: compensation must be 'ramp' (Lin et al. eq. 6) or "
                f"'velocity' (App. B.4); got {self.compensation!r}."
            )
        ci = self.compensation_iters
        if ci is not None and not callable(ci) and (not _is_real(ci) or not ci > 0):
            raise ValueError(
                f"{name}: compensation_iters must be None (8 * k), a number of "
                f"updates > 0 or a callable of k; got {ci!r}."
            )
        _check_momentum(self.momentum, name)
        if self.per_worker_batch is not None:
            _check_int(self.per_worker_batch, "per_worker_batch", 1, name)
            self.schedule_ = None
            if self.base_batch_size is None:
                self.base_batch_size_ = int(self.per_worker_batch)
            else:
                _check_int(self.base_batch_size, "base_batch_size", 1, name)
                self.base_batch_size_ = int(self.base_batch_size)
        else:
            self.schedule_ = _make_schedule(
                self.batch_size, "batch_size", name, n_data
            )
            self.base_batch_size_ = _base_batch_size(
                self.base_batch_size, self.batch_size, name
            )
        self.requested_ = None
        self.multiplier_ = None
        self.target_ = None
        self.ramp_from_ = None
        self.ramp_iters_ = None
        self.ramp_step_ = 0
        self.last_batch_ = None
        return self

    def _ramp_length(self, k: float) -> float:
        ci = self.compensation_iters
        if ci is None:
            return 8.0 * k
        if callable(ci):
            return float(ci(k))
        return float(ci)

    def next_batch_size(self, state: TrainState) -> int:
        if self.schedule_ is None:
            batch = int(self.per_worker_batch) * max(1, int(state.n_workers))
        else:
            batch = self.schedule_.next_batch_size(state)
        self.requested_ = batch
        return batch

    def _ramp_multiplier(self) -> float:
        target = self.requested_ / self.base_batch_size_
        if self.multiplier_ is None:  # first update: no history to protect
            self.multiplier_ = self.target_ = target
            return target
        if target != self.target_:
            self.target_ = target
            if target > self.multiplier_:
                self.ramp_from_ = self.multiplier_
                self.ramp_iters_ = self._ramp_length(target / self.multiplier_)
                self.ramp_step_ = 0
            else:
                self.ramp_from_ = None
                self.multiplier_ = target
        if self.ramp_from_ is not None:
            self.ramp_step_ += 1
            s, t = self.ramp_step_, self.ramp_iters_
            if s < t:
                start = self.ramp_from_
                self.multiplier_ = start + (target - start) * s / t
            else:
                self.ramp_from_ = None
                self.multiplier_ = target
        return self.multiplier_

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        if self.requested_ is None:
            self.requested_ = batch_size
        if self.schedule_ is None:
            inner = UpdatePlan()
        else:
            inner = self.schedule_.plan_update(state, batch_size, stats)
        buffer_scale = 1.0
        if self.compensation == "ramp":
            mult = self._ramp_multiplier()
        else:
            mult = batch_size / self.base_batch_size_
            if self.last_batch_ is not None and self.last_batch_ != batch_size:
                buffer_scale = self.last_batch_ / batch_size
            self.last_batch_ = batch_size
            self.multiplier_ = mult
        self.requested_ = None
        m = _resolve_momentum(self.momentum, state.n_workers, batch_size)
        if m is None:
            m = inner.momentum
        return UpdatePlan(
            lr_factor=inner.lr_factor * mult,
            momentum=m,
            momentum_buffer_scale=buffer_scale,
        )

    def forecast_batch_size(self, epoch: float) -> int | None:
        if self.per_worker_batch is not None:
            return None
        sched = getattr(self, "schedule_", None)
        if sched is None:
            if isinstance(self.batch_size, BaseDamper):
                return self.batch_size.forecast_batch_size(epoch)
            return int(self.batch_size)
        return sched.forecast_batch_size(epoch)


# --------------------------------------------------------------------------
# Schedule simulation (no model)
# --------------------------------------------------------------------------


def simulate_schedule(
    damper: BaseDamper, n_data: int, max_epochs: float, n_workers: int = 1
) -> list[dict]:
    """Run a damper through the engine's epoch loop without a model.

    A clone of ``damper`` is reset and driven exactly as the engine drives
    it: batches never straddle data epochs (each data epoch runs
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
    records: list[dict] = []
    seen = 0
    progress = 0.0
    n_updates = 0
    while progress / n_data < max_epochs - 1e-12:
        state = TrainState(n_updates, seen, progress / n_data, n_data, n_workers)
        requested = int(d.next_batch_size(state))
        batch = min(requested, n_data - seen % n_data)
        plan = d.plan_update(state, batch, None)
        records.append(
            {
                "n_updates": n_updates,
                "epoch": state.epoch,
                "batch_size": batch,
                "requested": requested,
                "lr_factor": plan.lr_factor,
                "momentum": plan.momentum,
                "momentum_buffer_scale": plan.momentum_buffer_scale,
                "damping": getattr(d, "damping_", None),
            }
        )
        seen += batch
        progress += batch if plan.progress is None else plan.progress
        n_updates += 1
    return records


def count_updates(damper: BaseDamper, n_data: int, max_epochs: float) -> int:
    """Model updates of a ``max_epochs`` run (see :func:`simulate_schedule`).

    Examples
    --------
    >>> count_updates(Constant(batch_size=128), n_data=50_000, max_epochs=200)
    78200
    """
    return len(simulate_schedule(damper, n_data, max_epochs))


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _ceil(x: float) -> int:
    """``ceil`` that ignores float noise (``4.000000000001`` -> 4)."""
    return math.ceil(round(float(x), 9))


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


def _check_int(value, name: str, low: int, owner: str = "") -> None:
    prefix = f"{owner}: " if owner else ""
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        hasattr(value, "__index__")
    ):
        raise ValueError(
            f"{prefix}{name} must be an integer >= {low}; got {value!r}."
        )
    if int(value) < low:
        raise ValueError(f"{prefix}{name} must be >= {low}; got {value!r}.")
