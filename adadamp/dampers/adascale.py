"""AdaScale (Johnson et al. 2020)."""

from __future__ import annotations

import math

import numpy as np
from sklearn.base import clone

from ._validation import _check_int
from .base import BaseDamper, GradStats, TrainState, UpdatePlan, _base_batch_size, _make_schedule, _schedule_forecast
from .momentum import _check_momentum, _resolve_momentum


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
    scale-1 run (Johnson et al. 2020, Alg. 2).

    Estimation (Johnson et al. 2020's estimator of the gain ratio, extended here
    to chunks of unequal size, still unbiased): from
    ``GradStats`` with ``N`` examples in ``k >= 2`` chunks,
    ``Q = sum_j ||G_j||^2 / n_j`` and ``g = ||g_bar||^2``,

    .. math::

        \hat\sigma^2 = \frac{Q - N g}{k - 1}, \qquad
        \hat\mu^2 = g - \hat\sigma^2 / N .

    Both are smoothed by a debiased exponential moving average with weight
    ``theta_t = smoothing ** S_t`` (a memory of about ``1/(1 - smoothing)``
    base batches, as adaptdl), updated *before* the gain is computed, and
    clamped only at use: ``sqr = max(mu2_avg, 0)``,
    ``var = max(sigma2_avg / b0, 1e-6 (var + sqr))`` (a floor relative to the
    gradient's scale; adaptdl's is an absolute 1e-6), so ``1 <= r <= S`` for ``S >= 1``.  ``r = 1``
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
    one sample, fairscale ``test_loss_accum_cpu``).  A batch cut into several
    shards (several workers) gives one chunk per shard, as fairscale and
    adaptdl take one sample per replica; a batch of one shard gives two, its
    halves (one extra backward pass; one chunk for a single example).  Both
    come from the share's one forward pass, so the statistics never change the
    trained gradient.  AdaScale is defined for
    SGD with or without momentum; for Adam and its variants use :class:`AdamScale`.

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

    needs_grad_stats = "chunks"
    _gain_power = 1.0  # the learning rate scales as r ** _gain_power (AdamScale: 0.5)

    def __init__(
        self,
        batch_size=32,
        base_batch_size: int | None = None,
        lr_schedule=None,
        smoothing: float = 0.999,
        momentum=None,
    ):
        self._keep(locals())

    # -- pure helpers ------------------------------------------------------

    @staticmethod
    def estimate(stats: GradStats | None):
        """Unbiased ``(sigma2, mu2)`` of one update (§2.3 eq. 2.2-2.3).

        Returns None when there are fewer than two chunks or the result is
        not finite.  ``sigma2`` is the per-example variance; ``mu2`` may be
        negative (it is clamped only at use).

        Parameters
        ----------
        stats : GradStats or None

        Returns
        -------
        tuple of float or None
            ``(sigma2, mu2)``.

        Examples
        --------
        Two antiparallel one-example chunks: all noise, no signal.

        >>> AdaScale.estimate(GradStats(n_samples=2, grad_sq_norm=0.0, chunk_sq_norm_sum=4.0, n_chunks=2))
        (4.0, -2.0)
        >>> AdaScale.estimate(GradStats(2, 0.0, 0.0, n_chunks=1)) is None
        True
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
        """Gain ``(v + m) / (v / S + m)`` with ``m >= 0`` and ``v >= 1e-6 (v + m)``.

        ``grad_var`` is the variance of a *base-batch* gradient
        (``sigma2 / b0``), ``grad_sqr`` the squared gradient norm, ``scale``
        ``S = B / b0``.  Works element-wise on arrays.  The variance floor is
        relative (adaptdl's is an absolute ``1e-6``, which made the gain
        depend on the loss's scale: ``mu^2 = 1e-8`` gave ``r = 7.5`` at
        ``S = 8`` where the same problem scaled to ``mu^2 = 1e-4`` gave
        1.01), so the gain is the same for any scaling of the loss.  With
        neither signal nor noise (``v = m = 0``) the gain is ``S``, the
        limit adaptdl's floor gives.

        Parameters
        ----------
        grad_var, grad_sqr, scale : float or array

        Returns
        -------
        float or ndarray
            Between 1 and ``scale`` for ``scale >= 1``.

        Examples
        --------
        >>> float(AdaScale.gain_ratio(grad_var=6.0, grad_sqr=1.0, scale=4))
        2.8
        >>> AdaScale.gain_ratio(grad_var=[1.0, 0.0], grad_sqr=[0.0, 1.0], scale=8).round(4).tolist()
        [8.0, 1.0]
        """
        m = np.maximum(grad_sqr, 0.0)
        v = np.maximum(np.maximum(grad_var, 0.0), 1e-6 * (np.maximum(grad_var, 0.0) + m))
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (v + m) / (v / scale + m)
        return np.where(v + m > 0, r, np.asarray(scale, dtype=float))

    def grad_variance(self) -> float | None:
        """Smoothed per-example gradient variance (None before an estimate).

        Examples
        --------
        >>> d = AdaScale(batch_size=4, base_batch_size=1).reset(n_data=100)
        >>> d.grad_variance() is None
        True
        >>> plan = d.plan_update(TrainState(0, 0, 0.0, 100, 2), 4, GradStats(4, 2.5, 16.0, 2))
        >>> round(d.grad_variance(), 12), round(float(plan.lr_factor), 12)
        (6.0, 2.8)
        """
        if not getattr(self, "ema_weight_", 0.0):
            return None
        return self.sigma2_sum_ / self.ema_weight_

    def grad_sqr(self) -> float | None:
        """Smoothed ``||grad F||^2`` (None before an estimate; may be < 0).

        Examples
        --------
        >>> d = AdaScale(batch_size=4, base_batch_size=1).reset(n_data=100)
        >>> _ = d.plan_update(TrainState(0, 0, 0.0, 100, 2), 4, GradStats(4, 2.5, 16.0, 2))
        >>> round(d.grad_sqr(), 12)
        1.0
        """
        if not getattr(self, "ema_weight_", 0.0):
            return None
        return self.mu2_sum_ / self.ema_weight_

    # -- protocol ----------------------------------------------------------

    def reset(self, n_data: int) -> AdaScale:
        name = type(self).__name__
        _check_int(n_data, "n_data", low=1)
        self._check("smoothing", lambda s: 0 < s < 1, "in (0, 1) (per-base-batch weight of the moving averages, e.g. 0.999)")
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

    def continue_from(self, progress: float) -> AdaScale:
        """Continue the scale-invariant clock: each update advanced ``progress`` by ``r b0``, so
        ``tau = progress / b0`` and the lr schedule goes on where it was (not from ``lr(0)``)."""
        self.tau_ = float(progress) / self.base_batch_size_
        return self

    def scheduler_steps(self, n_updates: int) -> int:
        """Scale-invariant iterations ``floor(tau)``: where the scale-1 schedule is (Alg. 2)."""
        return math.floor(getattr(self, "tau_", 0.0) + 1e-9)

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
        lr_factor = r**self._gain_power * self._lr_at(math.floor(self.tau_), state)
        self.tau_ += r
        m = _resolve_momentum(self.momentum, state.n_workers, batch_size)
        if m is None:
            m = inner.momentum
        return UpdatePlan(lr_factor=lr_factor, momentum=m, progress=r * b0)

    def forecast_batch_size(self, epoch: float) -> int | None:
        return _schedule_forecast(self, epoch)




class AdamScale(AdaScale):
    r"""AdaScale for Adam: the learning rate scales with the square root of the gain.

    The same gain ratio ``r_t``, estimates, smoothing and scale-invariant
    clock as :class:`AdaScale` (``tau_{t+1} = tau_t + r_t``; each update
    advances the epoch clock by ``r_t * b0`` examples), but the learning rate
    is

    .. math::

        \eta_t = \sqrt{r_t} \cdot \mathrm{lr}(\lfloor\tau_t\rfloor)

    as adaptdl's ``AdamScale`` does (petuum/adaptdl PR #95: AdaScale's gain
    raised to the power 0.5 for Adam, AdamW and RMSprop).  The square root is
    Adam's scaling rule: Adam's update is normalized by the running gradient
    magnitude, so a batch ``S`` times larger calls for a learning rate
    ``sqrt(S)`` times larger, not ``S`` (Malladi et al. 2022, "On the SDEs
    and scaling rules for adaptive gradient algorithms", Def. 4.2, the square
    root scaling rule); in the noise-dominated regime ``r = S`` and the rule
    is exactly that, and with a gradient-dominated batch ``r = 1`` leaves the
    learning rate alone.  The momentum terms ``beta1, beta2`` are not
    rescaled (Malladi et al. also move them towards 0 by ``S``; adaptdl does
    not): set ``momentum`` for a beta1 rule.

    Parameters
    ----------
    batch_size, base_batch_size, lr_schedule, smoothing, momentum
        As for :class:`AdaScale`.

    Examples
    --------
    Pure noise at ``S = 4``: the gain is 4, the learning rate doubles, the
    clock advances 4 base iterations.

    >>> d = AdamScale(batch_size=4, base_batch_size=1).reset(n_data=100)
    >>> plan = d.plan_update(TrainState(0, 0, 0.0, 100, 2), 4, GradStats(4, 0.0, 8.0, 2))
    >>> float(d.gain_), float(plan.lr_factor), float(plan.progress)
    (4.0, 2.0, 4.0)
    """

    _gain_power = 0.5
