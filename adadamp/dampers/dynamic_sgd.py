"""Dynamic SGD (Lin et al. 2019)."""

from __future__ import annotations

from ._validation import _check_int, _is_real
from .base import BaseDamper, GradStats, TrainState, UpdatePlan, _base_batch_size, _make_schedule, _schedule_forecast
from .momentum import _check_momentum, _resolve_momentum


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
    learning rate continuous (an extension of LIN §3.2): from the current
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
        well", LIN §3.2, read as 8k iterations), a number is a
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
    >>> trace = simulate_schedule(d, n_data=1000, max_epochs=1.1)
    >>> [(r["epoch"], r["batch_size"], r["lr_factor"]) for r in trace if r["n_updates"] in (0, 100, 101)]
    [(0.0, 10, 1.0), (1.0, 40, 1.09375), (1.04, 40, 1.1875)]
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
        self._keep(locals())

    @property
    def needs_grad_stats(self) -> str | None:
        """What the wrapped schedule needs: a wrapper forwards every capability of what it wraps."""
        inner = getattr(self, "schedule_", None) or self.batch_size
        return inner.stats_level() if isinstance(inner, BaseDamper) else None

    @property
    def follows_workers(self) -> bool:
        """Elastic mode: B = per_worker_batch x workers, so the workers must not follow B."""
        return self.per_worker_batch is not None

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
        return _schedule_forecast(self, epoch)


