"""The damping rule (a noise level as a batch size, capped into a learning-rate decay) and the
geometric schedules: GeoDamp, GeoDampLR (Holt & Sievert 2021) and Seesaw (Meterez et al. 2025)."""

from __future__ import annotations

import dataclasses
import math

from ._validation import _ceil, _check_int
from .base import BaseDamper, GradStats, TrainState, UpdatePlan
from .momentum import _check_momentum


class _DampingSchedule(BaseDamper):
    """Shared rule of the damping schedules.

    A subclass defines the damping ``D_t`` (a float, "noise level as a batch
    size") in ``_damping(state)``; this class turns it into a batch size and
    a learning-rate factor (DD master ``BaseDamper.step``; Holt & Sievert
    2021, "Increasing the batch size")::

        B_t = min(ceil(D_t), cap),   lr_factor_t = cap / D_t if D_t > cap else 1

    so that ``B_t / lr_t == D_t / lr_0`` whenever the cap is active.  ``cap``
    is ``min(max_batch_size, n_data)`` (``n_data`` when ``max_batch_size`` is
    None: a batch cannot hold more examples than the data set, so beyond it
    the damping continues as a learning-rate decay), but never below
    ``initial`` (no decay at the start on a tiny data set).

    Fitted attributes: ``damping_`` (the last ``D_t``), ``cap_``, ``n_data_``.
    The engine calls ``next_batch_size`` once per update (the cluster is sized
    from ``forecast_batch_size``), so adaptive subclasses observe each update
    once in ``_damping``.
    """

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
        self._reset_state()
        return self

    def _batch_for(self, damping: float, cap) -> int:
        if cap is not None and damping > cap:
            return int(cap)
        return max(1, _ceil(damping))

    def next_batch_size(self, state: TrainState) -> int:
        damping = float(self._damping(state))
        if math.isfinite(damping) and damping > 0:
            self.damping_ = damping
        return self._batch_for(self.damping_, self.cap_)

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        plan = super().plan_update(state, batch_size, stats)  # the momentum rule
        if self.damping_ > self.cap_:
            plan = dataclasses.replace(plan, lr_factor=self.cap_ / self.damping_)
        return plan


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
    Table 1 update counts exactly (``tests/simulate/test_simulate.py`` checks them).

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
        Largest batch; beyond it the learning rate is multiplied by ``max_batch_size / D``
        instead.  None is the data set size (the cap is never above it, nor below ``initial``).
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

    def __init__(self, initial: int = 32, delay: float = 5, factor: float = 2, max_batch_size: int | None = None,
                 momentum=None):
        self._keep(locals())

    def _validate(self) -> None:
        self._check("delay", lambda delay: delay > 0, "a number of epochs > 0")
        self._check("factor", lambda factor: factor >= 1, ">= 1 (the damping grows by `factor` every `delay` epochs)",
                    hint="  To decay the learning rate at a fixed batch size use GeoDampLR.")

    def damping(self, epoch: float) -> float:
        """The damping ``initial * factor ** floor(epoch / delay)`` at a point ``epoch`` of the epoch
        clock, before any cap (pure; no state is read or written).

        Examples
        --------
        >>> GeoDamp(initial=128, delay=60, factor=5).damping(125)
        3200.0
        """
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
        self._keep(locals())

    def _max_batch_size(self):
        return self.initial



class Seesaw(GeoDamp):
    r"""Grow the batch by ``factor`` and cut the learning rate by ``sqrt(factor)``: GeoDamp for Adam.

    Meterez et al. 2025 ("Seesaw: accelerating training by balancing learning
    rate and batch size scheduling", arXiv:2510.14717, Alg. 1): where a step
    schedule would divide an adaptive optimizer's learning rate by ``factor``,
    divide it by ``sqrt(factor)`` and multiply the batch by ``factor``
    instead.  For SGD, growing the batch by ``factor`` alone is equivalent to
    the decay (:class:`GeoDamp`, Smith et al. 2017); Adam normalizes its step
    by the gradient's magnitude, so a ``factor`` times larger batch only
    reduces the noise of its step as a ``sqrt(factor)`` learning-rate cut
    would, and the other ``sqrt(factor)`` must come from the learning rate
    (the square-root scaling rule for Adam, Malladi et al. 2022).

    With the damping ``D(e) = initial * factor ** floor(e / delay)`` of
    :class:`GeoDamp` and the batch ``B = min(D, cap)``:

    .. math::

        \mathrm{lr\_factor} = \sqrt{\mathrm{initial} / B} \cdot (B / D)

    so while the batch grows each step cuts the learning rate by
    ``sqrt(factor)``, and once the batch is capped at ``max_batch_size`` the
    remaining steps are the full learning-rate decay of the step schedule it
    replaces.

    Parameters
    ----------
    initial : int, default=32
        Batch size at epoch 0.
    delay : float, default=5
        Epochs between two steps (> 0).
    factor : float, default=2
        Factor by which the replaced step schedule divides the learning rate
        (>= 1); the batch grows by it.
    max_batch_size : int or None, default=None
        Largest batch; beyond it the learning rate decays by ``factor`` per
        step.  None is the data set size.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (beta1 for Adam; see :func:`tang_momentum`).

    Examples
    --------
    Adam's lr schedule ``/4`` at epochs 10 and 20 becomes batch 32 -> 128 ->
    512 with the learning rate halved at each step:

    >>> trace = simulate_schedule(Seesaw(initial=32, delay=10, factor=4), n_data=10_000, max_epochs=21)
    >>> [(r["batch_size"], r["lr_factor"]) for r in trace if r["epoch"] in (0, 10, 20)]
    [(32, 1.0), (128, 0.5), (512, 0.25)]

    Capped at 128, the second step is the full decay ``/4``:

    >>> d = Seesaw(initial=32, delay=10, factor=4, max_batch_size=128).reset(n_data=10_000)
    >>> s = TrainState(0, 0, epoch=20.0, n_data=10_000, n_workers=1)
    >>> d.next_batch_size(s), d.plan_update(s, 128, None).lr_factor
    (128, 0.125)
    """

    def plan_update(
        self, state: TrainState, batch_size: int, stats: GradStats | None
    ) -> UpdatePlan:
        plan = BaseDamper.plan_update(self, state, batch_size, stats)  # the momentum rule
        grown = min(self.damping_, float(self.cap_))
        lr_factor = math.sqrt(float(self.initial) / grown) * (grown / self.damping_)
        return dataclasses.replace(plan, lr_factor=lr_factor)
