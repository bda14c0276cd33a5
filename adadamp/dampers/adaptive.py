"""Schedules of the original adadamp that grow the batch as training progresses: AdaDamp (the
loss) and RadaDamp (the loss and the gradient norm) (Sievert & Charles 2019)."""

from __future__ import annotations

import math

from ._validation import _check_int
from .base import GradStats, TrainState, UpdatePlan
from .damping import _DampingSchedule


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
    max_batch_size, momentum
        As for :class:`GeoDamp`.

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

    def __init__(self, initial: int = 32, best_train_loss: float = 0.0, rho: float = 0.9,
                 max_batch_size: int | None = None, momentum=None):
        self._keep(locals())

    def _validate(self) -> None:
        self._check("best_train_loss", math.isfinite, "a finite number (a lower bound of the loss, usually 0)")
        self._check("rho", lambda rho: 0 <= rho < 1, "in [0, 1) (memory of the loss average)")

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
    max_batch_size, momentum
        As for :class:`GeoDamp`.

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

    def __init__(self, initial: int = 32, form: str = "ratio", rho: float | None = None, fudge: float = 0.01,
                 wait: int = 50, max_batch_size: int | None = None, momentum=None):
        self._keep(locals())

    def _validate(self) -> None:
        name = type(self).__name__
        if self.form not in ("ratio", "fudge"):
            raise ValueError(f"{name}: form must be 'ratio' or 'fudge'; got {self.form!r}.")
        if self.rho is not None:
            self._check("rho", lambda rho: 0 <= rho < 1, "in [0, 1) (memory of the moving averages) or None")
        self._check("fudge", lambda fudge: fudge >= 0, "a number >= 0 (weight of the loss)")
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
