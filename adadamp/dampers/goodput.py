"""Goodput: the batch size and the workers that maximize throughput x statistical efficiency
(Pollux, Qiao et al. OSDI'21), changed mid-fit without a restart."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..records import UpdateRecord
from ._validation import _check_int
from .adascale import AdaScale
from .base import BaseDamper, GradStats, TrainState, UpdatePlan
from .least_squares import grouped_fit
from .momentum import _check_momentum, _resolve_momentum

#: Timing samples the throughput model is fitted to (the most recent updates).
WINDOW = 256
#: Timing samples at the current batch size and workers before they are re-evaluated.
MIN_SAMPLES = 3
#: Noise estimates (updates with chunk statistics) before the noise scale is trusted.
MIN_ESTIMATES = 10
#: Seconds of training a change waits for the workers it asked for (where the fit cannot see them
#: arrive: a cluster shared with other fits, such as the embedded one), then it is made anyway.
WORKER_WAIT = 10.0
#: The least ratio of the largest share (examples per worker) seen to the smallest for the compute
#: per example to be fitted: update times vary by ~10% at one setting, so closer shares cannot tell
#: it from the fixed cost (a fitted slope of 0 made 4x the share look free).
SHARE_SPREAD = 1.5
#: Batch sizes tried per ``max_factor`` each way: a geometric grid around the current one.
GRID_STEPS = 4
LR_RULES = ("auto", "sgd", "adam")
#: Relative goodput difference taken as a tie (a fitted term of 1e-21 s is rounding, not a gain).
TIE = 1e-9


def noise_scale(sigma2: float, mu2: float) -> float:
    r"""The gradient noise scale ``B_noise = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, eq. 2.8).

    ``sigma2`` is the per-example gradient variance (the trace of its covariance), ``mu2`` the
    squared norm of the full-batch gradient, as :meth:`AdaScale.estimate` gives them.  The batch
    size at which the gradient's noise equals its signal: smaller batches are noise-dominated
    (each example counts fully), larger ones gradient-dominated (extra examples add little).
    ``inf`` when no signal is left (``mu2 <= 0``: the estimate is all noise), 0 when there is no
    noise.

    Examples
    --------
    >>> noise_scale(6.0, 1.0), noise_scale(4.0, -2.0), noise_scale(0.0, 1.0)
    (6.0, inf, 0.0)
    """
    sigma2 = max(float(sigma2), 0.0)
    if mu2 <= 0:
        return math.inf
    return sigma2 / float(mu2)


def anneal_factor(noise: float, least: float, base: int) -> float:
    r"""The learning rate's decay as the noise scale grows: ``(B_0 + B_least) / (B_0 + B_noise)``.

    McCandlish et al. 2018 (Sec. 2.2, eq. 2.6-2.7; App. A): the step size of most progress at
    batch ``B`` is ``eps_opt(B) = eps_max / (1 + B_noise / B)``, ``eps_max`` the step of the
    noiseless gradient (set by the curvature along it).  AdaScale's gain is the ratio of two such
    steps at the same moment, ``eps_opt(B) / eps_opt(B_0)``, and keeps ``eps_opt(B_0)`` at the
    learning rate the user gave, ``lr_0``, all along.  Taking ``eps_max`` as fixed instead, and
    ``lr_0`` as the best step at ``B_0`` where the noise scale was least (``B_least``: early, when
    the gradient is large), the best step at ``B_0`` later is ``lr_0`` times this factor: the
    learning rate decays as the noise scale grows, as a batch grown at a fixed learning rate
    anneals.  At most 1 (never above AdaScale's rule); 1 while either is unknown or infinite.

    Examples
    --------
    >>> anneal_factor(noise=600.0, least=100.0, base=32)  # (32 + 100) / (32 + 600)
    0.2088607594936709
    >>> anneal_factor(noise=math.inf, least=100.0, base=32), anneal_factor(50.0, 100.0, 32)
    (1.0, 1.0)
    """
    if not (math.isfinite(noise) and math.isfinite(least)):
        return 1.0
    return min(1.0, (base + max(least, 0.0)) / (base + max(noise, 0.0)))


def cooldown_factor(epoch: float, first: float, end: float, fraction: float) -> float:
    r"""The learning rate's cool-down at ``epoch`` of a training from ``first`` to ``end``: 1, then
    falling to 0 at ``end`` over its last ``fraction`` as :math:`1 - \sqrt{t}`, ``t`` going
    from 0 to 1 over the cool-down.

    A training whose length is known ends best with its learning rate decayed: a constant rate
    followed by a short cool-down matches a schedule decayed all along, and the
    :math:`1 - \sqrt{t}` shape does better than a linear one (Hägele et al. 2024, "Scaling Laws
    and Compute-Optimal Training Beyond Fixed Training Durations", Sec. 3).

    Examples
    --------
    >>> [round(cooldown_factor(e, 0.0, 5.0, fraction=0.2), 4) for e in (0.0, 4.0, 4.75, 5.0)]
    [1.0, 1.0, 0.134, 0.0]
    >>> cooldown_factor(3.0, 2.0, 4.0, fraction=0.0)
    1.0
    """
    window = fraction * (end - first)
    if window <= 0:
        return 1.0
    left = min(1.0, max(0.0, (end - epoch) / window))  # of the cool-down: 1 -> 0
    return float(1.0 - math.sqrt(1.0 - left))


def efficiency(batch_size, noise: float, base: int):
    r"""Statistical efficiency of a batch of ``batch_size`` against the base batch ``base``.

    .. math::

        E(B) = \frac{B_\mathrm{noise} + B_0}{B_\mathrm{noise} + B}

    the progress one example makes at batch ``B`` relative to one at ``B_0`` (Pollux, Qiao et
    al. OSDI'21, Sec. 3.1; it is AdaScale's gain over the scale, ``r / S``).  1 at ``B = B_0``;
    for ``B > B_0`` it falls towards ``B_0 / B`` when the gradient dominates (``B_noise`` small)
    and stays near 1 while the noise dominates.  Works element-wise on arrays.

    Examples
    --------
    >>> round(efficiency(64, noise=6.0, base=32), 6)  # (6 + 32) / (6 + 64)
    0.542857
    >>> efficiency(np.array([32, 128]), noise=math.inf, base=32).tolist()
    [1.0, 1.0]
    """
    b = np.asarray(batch_size, dtype=float)
    e = np.ones_like(b) if math.isinf(noise) else (noise + base) / (noise + b)
    return e if e.ndim else float(e)


@dataclass(frozen=True)
class ThroughputModel:
    r"""Seconds of one update of ``B`` examples on ``W`` workers, fitted to measured updates.

    .. math::

        T(B, W) = \underbrace{a + b \lceil B / W \rceil}_{\text{compute (slowest worker)}}
                + \underbrace{c + d (W - 1)}_{\text{the rest: communication, aggregation, step}}

    ``compute_time`` of an update record is the first part (each worker's forward and backward
    over its share), ``update_time - compute_time`` the second (the parameter server sends the
    weights to and gathers a gradient from each worker; an all-reduce grows with the workers
    too).  Pollux's model (Qiao et al. OSDI'21, Sec. 3.2) has the same two terms per worker with
    an overlap exponent; here compute and communication do not overlap.

    Attributes
    ----------
    compute_fixed, compute_per_example, other_fixed, other_per_worker : float
        ``a, b, c, d`` (seconds), all >= 0.

    Examples
    --------
    >>> m = ThroughputModel(0.002, 0.001, 0.003, 0.001)
    >>> round(float(m.update_time(64, 2)), 9), round(float(m.throughput(64, 2)), 3)  # 2 + 32 + 3 + 1 ms
    (0.038, 1684.211)
    """

    compute_fixed: float
    compute_per_example: float
    other_fixed: float
    other_per_worker: float

    def update_time(self, batch_size, n_workers):
        """Predicted seconds per update (element-wise on arrays)."""
        workers = np.asarray(n_workers, dtype=float)
        share = np.ceil(np.asarray(batch_size, dtype=float) / workers)
        return (self.compute_fixed + self.compute_per_example * share
                + self.other_fixed + self.other_per_worker * (workers - 1))

    def throughput(self, batch_size, n_workers):
        """Predicted examples per second: ``B / T(B, W)``."""
        return np.asarray(batch_size, dtype=float) / np.maximum(self.update_time(batch_size, n_workers), 1e-12)

    @classmethod
    def fit(cls, batch_sizes, n_workers, compute_times, other_times) -> ThroughputModel:
        """Fit ``a, b`` to the compute times and ``c, d`` to the rest, by nonnegative least
        squares on the median of each setting (robust to stragglers and to an update that
        re-placed the data).

        Terms the updates cannot tell apart are fixed optimistically, as adaptdl's
        ``fit_perf_params`` does: with share sizes ``ceil(B / W)`` all within a factor
        :data:`SHARE_SPREAD` of each other (one share size, or a batch grown with its workers),
        half the median compute time is fixed and half per example of the median share (so more
        workers look worth trying, and a larger share is not taken as free); with a single worker
        count seen, workers cost nothing extra (``d = 0``) until more are tried.

        Examples
        --------
        One setting only (32 examples on 1 worker, 4 ms compute, 1 ms the rest):

        >>> m = ThroughputModel.fit([32, 32], [1, 1], [0.004, 0.004], [0.001, 0.001])
        >>> [round(v, 7) for v in (m.compute_fixed, m.compute_per_example, m.other_fixed, m.other_per_worker)]
        [0.002, 6.25e-05, 0.001, 0.0]
        """
        b = np.asarray(batch_sizes, dtype=float)
        w = np.asarray(n_workers, dtype=float)
        share = np.ceil(b / w)
        compute, other = np.asarray(compute_times, dtype=float), np.asarray(other_times, dtype=float)
        if share.max() >= SHARE_SPREAD * share.min():
            a, per = grouped_fit(compute, np.column_stack([np.ones_like(share), share]), "median")
        else:
            a = float(np.median(compute)) / 2
            per = a / float(np.median(share))
        if np.unique(w).size >= 2:
            c, d = grouped_fit(other, np.column_stack([np.ones_like(w), w - 1]), "median")
        else:
            c, d = float(np.median(other)), 0.0
        return cls(float(a), float(per), float(c), float(d))


class Goodput(BaseDamper):
    r"""Pick the batch size and the workers that maximize goodput, as training goes.

    Every ``interval`` updates the damper picks, among batch sizes and worker counts within a
    factor ``max_factor`` of the current ones, the pair that maximizes

    .. math::

        \mathrm{goodput}(B, W) = \underbrace{\frac{B}{T(B, W)}}_{\text{throughput}} \times
            \underbrace{\frac{B_\mathrm{noise} + B_0}{B_\mathrm{noise} + B}}_{\text{efficiency}}

    the training progress per second in examples of the initial batch ``B_0`` (Pollux, Qiao et
    al. OSDI'21, Sec. 3).  ``T(B, W)`` is a :class:`ThroughputModel` fitted to the fit's own
    update records (compute per example per worker, a fixed cost per update, communication
    growing with the workers); the noise scale ``B_noise = tr(Sigma) / |G|^2`` (McCandlish et
    al. 2018, :func:`noise_scale`) comes from the workers' chunk statistics, smoothed as
    :class:`AdaScale` smooths them.  The noise scale grows as the loss falls, so the batch grows,
    and the workers with it where they pay for themselves; ``max_workers`` of the estimator is
    the budget.  It changes only when the predicted goodput is at least ``1 + threshold`` times
    the current one, at most every ``interval`` updates and by at most ``max_factor``, so the
    cluster does not thrash.  While a change grows as far as ``max_factor`` allows (the model
    wants more than one step gives: at the start, and as long as each step confirms it), the next
    look comes as soon as the new choice is measured (``MIN_SAMPLES`` updates), not ``interval``
    updates on: a trust region that widens while the steps taken bear the model out, so the
    growth from ``initial`` on one worker takes a few updates per doubling.  Pollux bounds a
    job's growth the same way (at most twice the most GPUs it has had, Qiao et al. OSDI'21,
    Sec. 4.2), against a throughput model extrapolated too far.  Where more workers are needed, they are asked for first
    (:meth:`forecast_batch_size` names the coming batch) and the change is made once they are
    there (``TrainState.available_workers``: on a warm cluster at once; or after ``WORKER_WAIT``
    = 10 s of training if they do not come).  Nothing restarts: the workers join the running fit.

    The learning rate follows AdaScale's gain ``r = S E(B)`` with ``S = B / B_0`` (Johnson et al.
    2020): ``lr = r * lr_0`` for SGD, ``sqrt(r) * lr_0`` for Adam and the other adaptive
    optimizers (:class:`AdamScale`): the learning rate keeps the base batch's gradient noise
    (Pollux's rule).  Over the last ``cooldown`` of a ``fit``'s epochs it then falls towards 0
    (:func:`cooldown_factor`): a cool-down at the end of a known budget, which anneals the noise
    as a schedule decayed all along does (Hägele et al. 2024, Sec. 3); ``partial_fit``, whose end
    is not known, never cools down.  With ``anneal`` the learning rate is also multiplied by
    :func:`anneal_factor` all along: ``lr_0`` taken as the best step at ``B_0`` where the noise
    scale was least, the best step falls as the noise scale grows (McCandlish et al. 2018, Sec.
    2.2).  Measured on three tasks (``benchmarks/goodput/goodput.md``), that decay cost 1-6 accuracy
    points at equal epochs where the cool-down alone came close to the best tuned schedule, so
    it is off by default.  The cool-down takes half the epochs by default: run back to back on
    those tasks (5 epochs, two runs each), it ended 0.2-0.7 points above a cool-down over 0.3 of
    them in every pair, and reached the targets as soon (they come in the first 1-2 epochs).  The
    epoch clock counts data epochs, as for the other batch schedules, so ``max_epochs`` means
    passes over the data.  During the cool-down the choice stands: the learning rate no longer
    follows the gain that the efficiency assumes, and a change of workers made near the end would
    not pay for its growth step.  Measured on the same tasks (three runs each, back to back with
    the batch growing on into the cool-down), it ended at or above in 7 of 9 pairs (-0.2 to +0.6
    points; means +0.1, +0.45 and +0.05 per task), with smaller batches late and the same times to
    the targets.

    Parameters
    ----------
    initial : int, default=32
        The first batch size, ``B_0``: the batch the learning rate was tuned for, and the
        smallest the damper picks.
    max_batch_size : int or None, default=None
        The largest batch (None: the data set).
    interval : int, default=20
        Model updates between two evaluations (and so between two changes).
    max_factor : float, default=2
        The most the batch size and the workers change by at once (> 1).
    threshold : float, default=0.05
        Predicted goodput gain a change must bring (>= 0): the hysteresis.
    smoothing : float, default=0.97
        Per-base-batch weight of the noise estimates' moving averages, in (0, 1): a memory of
        about ``1 / (1 - smoothing)`` = 33 base batches, so that the noise scale follows its rise
        early in a fit (AdaScale's and adaptdl's 0.999 remembers 1000 and lags there; measured
        against 0.99 in ``benchmarks/README.md``).
    lr_rule : {"auto", "sgd", "adam"}, default="auto"
        The learning rate's gain: ``"sgd"`` the gain, ``"adam"`` its square root; ``"auto"``
        picks from the fit's optimizer (``torch.optim.SGD``: the gain; any other: the square
        root).
    momentum : None, float, callable or "tang", default=None
        Momentum rule (see :func:`tang_momentum`).
    anneal : bool, default=False
        Also decay the learning rate as the noise scale grows (:func:`anneal_factor`).
    cooldown : float, default=0.5
        The last fraction of a ``fit`` call's epochs over which the learning rate falls towards 0
        (:func:`cooldown_factor`), in [0, 1); 0: none.

    Attributes
    ----------
    batch_size_, workers_ : int
        The current choice (``workers_`` None until the first: the cluster policy's).
    noise_scale_ : float
        ``B_noise`` of the last update (NaN before enough estimates).
    least_noise_ : float
        The least ``B_noise`` so far (inf before enough estimates): where ``lr_0`` is the best step.
    decay_ : float
        The learning rate's :func:`anneal_factor` (1 without ``anneal``).
    cooldown_ : float
        The learning rate's :func:`cooldown_factor` at the last update (1 before the cool-down).
    exploring_ : bool
        Whether the last change grew as far as ``max_factor`` allows (the next look comes as soon
        as it is measured).
    model_ : tuple of float or None
        The last fitted :class:`ThroughputModel`'s terms.
    n_changes_ : int
        Changes made so far.

    Notes
    -----
    Every update row of ``history_`` gets ``noise_scale``, ``efficiency`` (of its batch),
    ``gain``, ``decay`` (:func:`anneal_factor` times :func:`cooldown_factor`) and ``predicted_throughput`` (examples per second the model predicts for its batch
    and workers; NaN before the first fit): why the damper chose as it did.  Unlike Pollux it
    neither checkpoints nor restarts the job when the workers change, and it picks only its own
    fit's workers (Pollux's scheduler also shares the cluster between jobs).

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(batch_size=Goodput, max_workers=8)

    The choice, from a throughput model and a noise scale (pure):

    >>> d = Goodput(initial=32).reset(n_data=10_000)
    >>> model = ThroughputModel(0.002, 0.0001, 0.001, 0.0005)
    >>> d.best(model, noise=200.0, batch_size=32, n_workers=1, budget=8)
    (64, 2)
    """

    needs_grad_stats = "chunks"

    def __init__(
        self,
        initial: int = 32,
        max_batch_size: int | None = None,
        interval: int = 20,
        max_factor: float = 2.0,
        threshold: float = 0.05,
        smoothing: float = 0.97,
        lr_rule: str = "auto",
        momentum=None,
        anneal: bool = False,
        cooldown: float = 0.5,
    ):
        self._keep(locals())

    # -- protocol ----------------------------------------------------------

    def reset(self, n_data: int) -> Goodput:
        name = type(self).__name__
        _check_int(self.initial, "initial", low=1, owner=name)
        if self.max_batch_size is not None:
            _check_int(self.max_batch_size, "max_batch_size", low=1, owner=name)
            if self.max_batch_size < self.initial:
                raise ValueError(
                    f"{name}: max_batch_size={self.max_batch_size} is smaller than initial={self.initial}; "
                    "use max_batch_size >= initial or None (the data set size)."
                )
        _check_int(self.interval, "interval", low=1, owner=name)
        self._check("max_factor", lambda f: 1 < f < math.inf,
                    "a number > 1 (the most the batch size and the workers change by at once, e.g. 2)")
        self._check("threshold", lambda t: 0 <= t < math.inf,
                    "a number >= 0 (the predicted goodput gain a change must bring, e.g. 0.05 for 5%)")
        self._check("smoothing", lambda s: 0 < s < 1,
                    "in (0, 1) (per-base-batch weight of the noise estimates' moving averages, e.g. 0.97)")
        if self.lr_rule not in LR_RULES:
            raise ValueError(
                f"{name}: lr_rule must be one of {LR_RULES} ('sgd': the learning rate scales with "
                f"AdaScale's gain, 'adam': with its square root); got {self.lr_rule!r}."
            )
        _check_momentum(self.momentum, name)
        if not isinstance(self.anneal, (bool, np.bool_)):
            raise ValueError(f"{name}: anneal must be True or False; got {self.anneal!r}.")  # noqa: TRY004 (as every bad parameter at reset)
        self._check("cooldown", lambda c: 0 <= c < 1, "a number in [0, 1) (the last fraction of a "
                    "fit's epochs over which the learning rate falls towards 0, e.g. 0.5; 0 for none)")
        _check_int(n_data, "n_data", low=1)
        cap = int(n_data) if self.max_batch_size is None else min(int(self.max_batch_size), int(n_data))
        self.cap_ = max(int(self.initial), cap)
        self.scaler_ = AdaScale(batch_size=int(self.initial), smoothing=self.smoothing).reset(n_data)
        self.batch_size_ = int(self.initial)
        self.workers_ = None
        self.planned_ = None  # (batch size, workers) asked for, switched to once the workers are there
        self.waited_ = 0.0  # seconds of updates since they were asked for
        self.evaluated_at_ = 0
        self.n_changes_ = 0
        self.timings_ = []  # [batch size, workers, compute s, other s] of recent updates
        self.last_workers_ = 0
        self.model_ = None
        self.noise_scale_ = math.nan
        self.least_noise_ = math.inf
        self.decay_ = 1.0
        self.cooldown_ = 1.0
        self.span_ = None  # (first, end) epoch of the fit call being cooled down
        self.exploring_ = True  # the start: grow as fast as the measurements confirm it
        self.optimizer_family_ = None
        return self

    def bind_optimizer(self, family: str) -> None:
        self.optimizer_family_ = family

    def next_batch_size(self, state: TrainState) -> int:
        planned = self.planned_
        if planned is not None and (_available(state) >= planned[1] or self.waited_ >= WORKER_WAIT):
            self._switch(*planned)  # the workers asked for are there (or are not coming soon)
            self.planned_, self.evaluated_at_ = None, state.n_updates
        elif self._cooldown(state) == 1.0 and (  # cooling down, the choice stands (see the docstring)
                (self.exploring_ and planned is None) or state.n_updates - self.evaluated_at_ >= self.interval):
            self._evaluate(state)
        return self.batch_size_

    def workers_for(self, batch_size: int) -> int | None:
        if self.planned_ is not None and batch_size == self.planned_[0]:
            return self.planned_[1]
        return self.workers_ if batch_size == getattr(self, "batch_size_", None) else None

    def forecast_batch_size(self, epoch: float) -> int | None:
        """The coming batch: the one whose workers are being asked for, else the current one."""
        planned = getattr(self, "planned_", None)
        return int(planned[0] if planned is not None else getattr(self, "batch_size_", self.initial))

    def plan_update(self, state: TrainState, batch_size: int, stats: GradStats | None) -> UpdatePlan:
        self.scaler_.plan_update(state, batch_size, stats)  # the noise averages first, then the gain
        if self.scaler_.n_estimates_ >= MIN_ESTIMATES:
            self.noise_scale_ = noise_scale(self.scaler_.grad_variance(), self.scaler_.grad_sqr())
            if self.anneal and math.isfinite(self.noise_scale_):  # inf (no signal seen): the decay stands
                self.least_noise_ = min(self.least_noise_, self.noise_scale_)
                self.decay_ = anneal_factor(self.noise_scale_, self.least_noise_, int(self.initial))
        self.cooldown_ = self._cooldown(state)
        lr_factor = (self.scaler_.gain_ * self.decay_) ** self._gain_power() * self.cooldown_
        return UpdatePlan(lr_factor=lr_factor, momentum=_resolve_momentum(self.momentum, state.n_workers, batch_size))

    def observe(self, record: UpdateRecord) -> None:
        """Keep the update's timing, unless its workers just changed (that update also moved the data)."""
        self.waited_ += float(record.update_time)
        if record.n_workers == self.last_workers_:
            self.timings_.append([int(record.batch_size), int(record.n_workers), float(record.compute_time),
                                  max(0.0, float(record.update_time) - float(record.compute_time))])
            del self.timings_[:-WINDOW]
        self.last_workers_ = int(record.n_workers)

    def explain(self) -> dict[str, float]:
        b = self.batch_size_
        noise = self.noise_scale_
        eff = math.nan if math.isnan(noise) else float(efficiency(b, noise, int(self.initial)))
        tput = math.nan
        if self.model_ is not None:
            tput = float(ThroughputModel(*self.model_).throughput(b, self._current_workers()))
        return {"noise_scale": float(noise), "efficiency": eff, "gain": float(self.scaler_.gain_),
                "decay": float(self.decay_ * self.cooldown_), "predicted_throughput": tput}

    # -- the choice --------------------------------------------------------

    def best(self, model: ThroughputModel, noise: float, batch_size: int, n_workers: int,
             budget: int, below: int | None = None) -> tuple[int, int]:
        """The batch size and workers of highest goodput within a factor ``max_factor`` of
        ``(batch_size, n_workers)``, at most ``budget`` workers and at least one example each,
        batches below ``below`` if given (pure: reads only the parameters and ``cap_``).

        Examples
        --------
        All noise (efficiency 1 at any batch) and a fixed cost per update: the largest step
        allowed, twice the batch on twice the workers.

        >>> d = Goodput(initial=32, max_factor=2).reset(n_data=1000)
        >>> d.best(ThroughputModel(0.001, 0.0001, 0.0, 0.0), noise=math.inf, batch_size=32, n_workers=1, budget=4)
        (64, 2)
        """
        batches, workers = self._candidates(batch_size, n_workers, budget)
        b, w = np.meshgrid(batches, workers, indexing="ij")
        score = self._goodput(model, noise, b, w)
        score[w > b] = -np.inf
        if below is not None:
            score[b >= below] = -np.inf
        current = self._goodput(model, noise, batch_size, n_workers) if n_workers <= budget else -np.inf
        i, j = np.unravel_index(int(np.argmax(score)), score.shape)
        if not score[i, j] > current * (1 + TIE):  # ties (to rounding) keep the current choice
            return int(batch_size), int(n_workers)
        return int(batches[i]), int(workers[j])

    def speedups(self, most: int) -> list[float] | None:
        """The best predicted goodput over batch sizes on 1, 2, ... ``most`` workers, against one
        worker's: Pollux's speedup, by which its scheduler divides a cluster (Qiao et al. OSDI'21,
        sections 3.2 and 4.2); None until the throughput model and the noise scale are measured."""
        model_ = getattr(self, "model_", None)
        if model_ is None or math.isnan(self.noise_scale_) or most < 1:
            return None
        model = ThroughputModel(*model_)
        batches = np.unique(np.rint(np.geomspace(int(self.initial), self.cap_, 50)).astype(int))
        best = [float(np.max(np.where(batches >= w, self._goodput(model, self.noise_scale_, batches, w), -np.inf)))
                for w in range(1, int(most) + 1)]
        if not best[0] > 0 or not math.isfinite(best[0]):
            return None
        return [g / best[0] if math.isfinite(g) else 0.0 for g in best]

    def _goodput(self, model: ThroughputModel, noise: float, b, w):
        return model.throughput(b, w) * efficiency(b, noise, int(self.initial))

    def _candidates(self, batch_size: int, n_workers: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
        f = float(self.max_factor)
        steps = np.arange(-GRID_STEPS, GRID_STEPS + 1) / GRID_STEPS
        batches = np.rint(batch_size * f**steps).astype(int)
        batches = np.unique(np.clip(np.append(batches, batch_size), int(self.initial), self.cap_))
        budget = max(1, int(budget))
        low = min(max(1, math.ceil(n_workers / f - 1e-9)), budget)
        high = min(max(low, math.floor(n_workers * f + 1e-9)), budget)
        return batches, np.arange(low, high + 1)

    def _evaluate(self, state: TrainState) -> None:
        """Fit the throughput model and move to the best choice if it is worth it."""
        if math.isnan(self.noise_scale_):
            return
        current_w = self._current_workers()
        rows = np.asarray(self.timings_, dtype=float).reshape(-1, 4)
        here = (rows[:, 0] == self.batch_size_) & (rows[:, 1] == current_w)
        if here.sum() < MIN_SAMPLES:
            return
        model = ThroughputModel.fit(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
        self.model_ = (model.compute_fixed, model.compute_per_example, model.other_fixed, model.other_per_worker)
        self.evaluated_at_ = state.n_updates  # the next look is `interval` updates on
        noise, current = self.noise_scale_, (self.batch_size_, current_w)

        def worth(choice: tuple[int, int]) -> bool:
            gain = self._goodput(model, noise, *choice) / self._goodput(model, noise, *current)
            return choice != current and gain >= 1 + self.threshold

        budget = state.max_workers or state.n_workers
        target = self.best(model, noise, *current, budget=budget)
        previous, self.planned_ = self.planned_, None
        self.exploring_ = worth(target) and self._at_edge(target, current, budget)
        if not worth(target):
            if previous is not None and self._goodput(model, noise, *previous) > self._goodput(model, noise, *current):
                self.planned_ = previous  # it stands while it is better: dropping it would retire its workers
            return
        if target[1] > _available(state):
            # Ask for the workers first (the coming batch's, forecast_batch_size), change when they
            # are there, and meanwhile take the best smaller batch on the workers there.  The
            # engine asks for workers by batch size: a batch one example larger names the coming
            # workers when only the workers grow.
            if target[0] == current[0]:
                target = (target[0] + 1 if target[0] < self.cap_ else target[0] - 1, target[1])
            if previous != target:
                self.waited_ = 0.0
            self.planned_ = target
            target = self.best(model, noise, *current, budget=_available(state), below=target[0])
            if not worth(target):
                return
        self._switch(*target)

    def _at_edge(self, target: tuple[int, int], current: tuple[int, int], budget: int) -> bool:
        """Whether ``target`` grows the batch or the workers as far as ``max_factor`` allows from
        ``current``, short of the cap and the budget: the model wants more than one step gives."""
        batches, workers = self._candidates(*current, budget)
        return bool(target[0] == batches.max() < self.cap_ or target[1] == workers.max() < max(1, int(budget)))

    def _cooldown(self, state: TrainState) -> float:
        """The cool-down factor of this update, from the fit call's first epoch and its end."""
        end = state.end_epoch
        if end is None or not self.cooldown:
            return 1.0
        if self.span_ is None or self.span_[1] != end:  # a new call: it starts here
            self.span_ = (float(state.epoch), float(end))
        return cooldown_factor(state.epoch, *self.span_, fraction=float(self.cooldown))

    def _switch(self, batch_size: int, n_workers: int) -> None:
        self.batch_size_, self.workers_ = int(batch_size), int(n_workers)
        self.n_changes_ += 1

    def _current_workers(self) -> int:
        """The workers the last update had (the cluster may have clipped or lost some), else the choice."""
        return int(self.last_workers_ or self.workers_ or 1)

    def _gain_power(self) -> float:
        rule = self.lr_rule
        if rule == "auto":
            rule = "adam" if self.optimizer_family_ == "adaptive" else "sgd"
        return 0.5 if rule == "adam" else 1.0


def _available(state: TrainState) -> int:
    """The workers the fit could train on now (its own when the engine does not say)."""
    return max(state.available_workers or 0, state.n_workers)
