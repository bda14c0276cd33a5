"""Damping schedules (Holt & Sievert 2021; Sievert & Charles 2019): GeoDamp and the original adadamp family."""

from __future__ import annotations

import dataclasses
import math

from ._validation import _ceil, _check_int, _is_real
from .base import BaseDamper, GradStats, TrainState, UpdatePlan
from .momentum import _check_momentum


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
        """The damping ``D(epoch)`` (pure; no state is read or written).

        Parameters
        ----------
        epoch : float
            A point on the epoch clock.

        Returns
        -------
        float
            ``initial * factor ** floor(epoch / delay)``, before any cap.

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
        self.initial = initial
        self.delay = delay
        self.factor = factor
        self.momentum = momentum

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

    >>> d = Seesaw(initial=32, delay=10, factor=4).reset(n_data=10_000)
    >>> for epoch in (0, 10, 20):
    ...     s = TrainState(0, 0, epoch, n_data=10_000, n_workers=1)
    ...     b = d.next_batch_size(s)
    ...     print(b, d.plan_update(s, b, None).lr_factor)
    32 1.0
    128 0.5
    512 0.25

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
    r"""Grow the batch size as the loss and the gradient norm fall.

    Two forms, both from the original adadamp; ``L`` is the batch loss and
    ``G`` the squared norm of the batch gradient ``||g_bar||^2``.

    ``form="ratio"`` (default) is the form of the original's final code (its
    PR #24, "implement RadaDamp properly", which replaced the fudge form
    because the fudge weight ``c`` had to be tuned to the loss's scale):

    .. math::

        D_k = \max\left(B_0, \frac{B_0}{\tfrac12 (L_k / L_0 + G_k / G_0)}\right)

    where the updates are grouped into windows of ``wait`` updates, each
    window contributes the *minimum* of its batch losses and of its squared
    gradient norms, ``L_0, G_0`` are the first window's minima, and ``L_k,
    G_k`` are moving averages of the windows' minima,
    ``L <- rho L + (1 - rho) min``, with ``rho = 0.2`` (the batch stays at
    ``B_0`` during the first window and changes once per window).  Minima
    are robust to the noise of single small batches; the average of the two
    ratios needs no weight.

    ``form="fudge"`` is the earlier form (the original's code before PR #24):
    exponential moving averages ``L_k, G_k`` updated every update (``rho =
    0.999``) and

    .. math::

        D_k = B_0 \max\left(1, \frac{c\,L_0 + G_0}{c\,L_k + G_k}\right)

    where ``c`` is ``fudge`` and ``L_0, G_0`` are the plain means over the
    first ``wait`` updates.

    Parameters
    ----------
    initial : int, default=32
        ``B_0``.
    form : {"ratio", "fudge"}, default="ratio"
        Which of the two forms above.
    rho : float or None, default=None
        Memory of the moving averages, in [0, 1); None is 0.2 for
        ``"ratio"`` (per window) and 0.999 for ``"fudge"`` (per update).
    fudge : float, default=0.01
        ``"fudge"`` form only: weight ``c`` of the loss (>= 0).
    wait : int, default=50
        Updates per window (``"ratio"``), or updates averaged for ``L_0,
        G_0`` (``"fudge"``); >= 1.
    max_batch_size : int or None, default=None
        Largest batch; beyond it the learning rate decays by
        ``max_batch_size / D`` instead.  None is the data set size.
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).

    Notes
    -----
    Reads ``GradStats.grad_sq_norm`` in :meth:`BaseDamper.plan_update` (hence
    ``needs_grad_stats``) and ``TrainState.loss`` (the ``"fudge"`` form
    does without it when ``fudge == 0``).  The original computed a
    full-data-set gradient and loss at the first update; here every
    quantity comes from the batches the engine trains on anyway, and the
    batch is rounded up, not truncated.

    Examples
    --------
    Windows of two updates: minima (2, 8), then (1, 2); with rho 0.2 the
    averages are L = 1.2, G = 3.2, so D = 10 / (0.5 (1.2/2 + 3.2/8)) = 20.

    >>> d = RadaDamp(initial=10, wait=2).reset(1000)
    >>> observed = [(None, 8.0), (2.0, 16.0), (4.0, 4.0), (1.0, 2.0), (3.0, 9.0)]  # (loss before, G)
    >>> for k, (loss, g2) in enumerate(observed):
    ...     s = TrainState(k, 0, 0.0, 1000, 1, loss=loss)
    ...     b = d.next_batch_size(s)
    ...     _ = d.plan_update(s, b, GradStats(b, g2, 0.0, 0))
    >>> d.next_batch_size(TrainState(5, 0, 0.0, 1000, 1, loss=5.0))
    20

    The fudge form, from the gradient norm alone (``fudge=0``):

    >>> d = RadaDamp(initial=4, form="fudge", wait=1, fudge=0.0, rho=0.0).reset(1000)
    >>> for k, g2 in enumerate([4.0, 2.0, 1.0]):
    ...     s = TrainState(k, 0, 0.0, 1000, 1)
    ...     b = d.next_batch_size(s)
    ...     _ = d.plan_update(s, b, GradStats(b, g2, 0.0, 0))
    >>> d.next_batch_size(TrainState(3, 0, 0.0, 1000, 1))
    16
    """

    #: Only the squared norm of the batch gradient is read from ``GradStats`` (no chunks).
    needs_grad_stats = "norm"

    def __init__(
        self,
        initial: int = 32,
        form: str = "ratio",
        rho: float | None = None,
        fudge: float = 0.01,
        wait: int = 50,
        max_batch_size: int | None = None,
        momentum=None,
    ):
        self.initial = initial
        self.form = form
        self.rho = rho
        self.fudge = fudge
        self.wait = wait
        self.max_batch_size = max_batch_size
        self.momentum = momentum

    def _validate(self) -> None:
        name = type(self).__name__
        if self.form not in ("ratio", "fudge"):
            raise ValueError(f"{name}: form must be 'ratio' or 'fudge'; got {self.form!r}.")
        if self.rho is not None and (not _is_real(self.rho) or not 0 <= self.rho < 1):
            raise ValueError(
                f"{name}: rho must be in [0, 1) (memory of the moving "
                f"averages) or None; got {self.rho!r}."
            )
        if not _is_real(self.fudge) or not self.fudge >= 0:
            raise ValueError(
                f"{name}: fudge must be a number >= 0 (weight of the loss); "
                f"got {self.fudge!r}."
            )
        _check_int(self.wait, "wait", low=1, owner=name)

    def _reset_state(self) -> None:
        self.rho_ = float(self.rho if self.rho is not None else (0.2 if self.form == "ratio" else 0.999))
        self.n_observed_ = 0
        self.loss_avg_ = 0.0
        self.grad_avg_ = 0.0
        self.initial_factor_ = None
        self.last_grad_sq_norm_ = None
        self.initial_loss_ = self.initial_grad_ = None  # L_0, G_0 of the ratio form
        self.window_ = []  # (loss, G) of the ratio form's current window

    def _damping(self, state: TrainState) -> float:
        g2, self.last_grad_sq_norm_ = self.last_grad_sq_norm_, None
        loss = state.loss
        if loss is None:
            if state.n_updates > 0 and (self.form == "ratio" or self.fudge != 0):
                raise RuntimeError(
                    "RadaDamp needs TrainState.loss (the previous update's mean "
                    "batch loss) after the first update (the fudge form not if fudge == 0)."
                )
            loss = 0.0
        observed = g2 is not None and math.isfinite(loss)
        if self.form == "ratio":
            return self._ratio_damping(loss, g2) if observed else self._ratio_damping(None, None)
        if observed:
            if self.n_observed_ < self.wait:
                n = self.n_observed_
                self.loss_avg_ = (n * self.loss_avg_ + loss) / (n + 1)
                self.grad_avg_ = (n * self.grad_avg_ + g2) / (n + 1)
                self.n_observed_ += 1
                if self.n_observed_ == self.wait:
                    self.initial_factor_ = self._noise()
            else:
                r = self.rho_
                self.loss_avg_ = r * self.loss_avg_ + (1 - r) * loss
                self.grad_avg_ = r * self.grad_avg_ + (1 - r) * g2
        if self.initial_factor_ is None:
            return float(self.initial)
        div = self._noise()
        if not div > 0:
            return self.damping_
        return self.initial * max(1.0, self.initial_factor_ / div)

    def _ratio_damping(self, loss: float | None, g2: float | None) -> float:
        """The final form: a window's minima feed the averages when the window is full."""
        if loss is not None:
            self.window_.append((loss, g2))
        if len(self.window_) == self.wait:
            low_loss = min(w[0] for w in self.window_)
            low_grad = min(w[1] for w in self.window_)
            self.window_ = []
            if self.initial_loss_ is None:
                self.initial_loss_, self.initial_grad_ = low_loss, low_grad
                self.loss_avg_, self.grad_avg_ = low_loss, low_grad
            else:
                r = self.rho_
                self.loss_avg_ = r * self.loss_avg_ + (1 - r) * low_loss
                self.grad_avg_ = r * self.grad_avg_ + (1 - r) * low_grad
        if self.initial_loss_ is None or not (self.initial_loss_ > 0 and self.initial_grad_ > 0):
            return self.damping_ if self.initial_loss_ is not None else float(self.initial)
        ratio = 0.5 * (self.loss_avg_ / self.initial_loss_ + self.grad_avg_ / self.initial_grad_)
        if not ratio > 0:
            return self.damping_
        return max(float(self.initial), self.initial / ratio)

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

    def forecast_batch_size(self, epoch: float) -> int | None:
        return getattr(self, "n_data_", None)


