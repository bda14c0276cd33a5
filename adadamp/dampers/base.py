"""The damper protocol (TrainState, GradStats, UpdatePlan, BaseDamper) and Constant."""

from __future__ import annotations

from dataclasses import dataclass

from sklearn.base import BaseEstimator, clone

from ..porting import OldSpellingError, damper_hint
from ._validation import _check_int, _check_real
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
    max_workers : int or None, default=None
        The most workers the fit may train on (the estimator's
        ``max_workers`` when it scales the cluster, else at most the
        cluster's workers); None where unknown (:func:`simulate_schedule`).
        :class:`Goodput` spends this budget.
    available_workers : int or None, default=None
        Workers running in the cluster now: this fit's and those it could
        take at once (idle ones on a shared cluster; not those still
        starting); None where unknown.  :class:`Goodput` changes to more
        workers once they are there.
    end_epoch : float or None, default=None
        Where the running ``fit`` call ends on the epoch clock (its
        ``max_epochs``); None where unknown (``partial_fit``, which may be
        called again, and the simulator).  :class:`Goodput` cools its
        learning rate down before it.

    Examples
    --------
    >>> s = TrainState(n_updates=0, n_samples_seen=0, epoch=10.0, n_data=1000, n_workers=2)
    >>> GeoDamp(initial=64, delay=5, factor=2).reset(n_data=1000).next_batch_size(s)
    256
    """

    n_updates: int
    n_samples_seen: int
    epoch: float
    n_data: int
    n_workers: int
    loss: float | None = None
    max_workers: int | None = None
    available_workers: int | None = None
    end_epoch: float | None = None


@dataclass(frozen=True)
class GradStats:
    """Gradient statistics of the current update (Johnson et al. 2020; the Dampers guide).

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

    Examples
    --------
    Two chunks of 1 and 3 examples with gradient sums ``[2, 0]`` and
    ``[0, 6]``: ``g_bar = [0.5, 1.5]`` and ``Q = 4/1 + 36/3``.

    >>> stats = GradStats(n_samples=4, grad_sq_norm=2.5, chunk_sq_norm_sum=16.0, n_chunks=2)
    >>> AdaScale.estimate(stats)  # (per-example variance, squared gradient norm)
    (6.0, 1.0)
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

    Examples
    --------
    :class:`GeoDampLR` keeps the batch and divides the learning rate by 4
    after two doublings of the damping:

    >>> d = GeoDampLR(initial=32, delay=1, factor=2).reset(n_data=1000)
    >>> s = TrainState(0, 0, epoch=2.0, n_data=1000, n_workers=1)
    >>> d.plan_update(s, d.next_batch_size(s), None)
    UpdatePlan(lr_factor=0.25, momentum=None, progress=None, momentum_buffer_scale=1.0)
    """

    lr_factor: float = 1.0
    momentum: float | None = None
    progress: float | None = None
    momentum_buffer_scale: float = 1.0


class BaseDamper(BaseEstimator):
    """Base class of every damper (the protocol is described in :mod:`adadamp.dampers`).

    A new damper stores its constructor arguments unchanged in ``__init__`` (scikit-learn's
    rule: ``get_params`` and ``clone`` read them back) and implements the one required hook.
    Every optional hook has a default, overridden when the damper needs it; the flags
    (``Attributes``) tell the engine what the damper reads.

    .. rubric:: Required hook

    :meth:`next_batch_size(state) <next_batch_size>`
        Before each update, with the :class:`TrainState`: the examples to use (>= 1; the engine
        takes fewer at the end of a data epoch).

    .. rubric:: Optional hooks

    :meth:`reset(n_data) <reset>`
        Called on a fresh clone before a fresh fit (and by a damper on the schedule it wraps);
        checks the parameters (``ValueError`` naming the one at fault) and creates every
        evolving quantity in attributes ending in ``_``.  Returns ``self``; the default checks
        nothing.
    :meth:`plan_update(state, batch_size, stats) <plan_update>`
        After each update's gradient: the :class:`UpdatePlan` (learning-rate factor, momentum,
        how far the epoch clock advances).  A damper that reads no statistics
        (``needs_grad_stats`` None) may be asked before the gradient is in (an all-reduce fit
        hands the step on with the requests).  The default keeps the learning rate and the
        data epochs, and applies the ``momentum`` rule when the damper has that parameter.
    :meth:`forecast_batch_size(epoch) <forecast_batch_size>`
        When the fit sizes the cluster (its first workers, then ``prescale_epochs`` ahead at
        each update) and estimates the time left: the batch size expected at a future point of
        the epoch clock, or None.  The default, None: the workers follow each batch as it comes.
    :meth:`continue_from(progress) <continue_from>`
        On a damper built afresh for a run that goes on (a warm start after ``batch_size__*``
        changed), with the epoch clock in examples; returns ``self``.  The default does nothing:
        a damper that reads only the :class:`TrainState` needs nothing here.
    :meth:`scheduler_steps(n_updates) <scheduler_steps>`
        By ``LRScheduler(step_every="batch")``: the iterations a per-update learning-rate
        scheduler has reached.  The default counts model updates.
    :meth:`workers_for(batch_size) <workers_for>`
        When the fit picks its workers for a batch: how many, or None, the default, for the
        cluster policy's ``ceil(batch_size / grads_per_worker)``.  Clipped to
        ``[min_workers, max_workers]`` either way.
    :meth:`speedups(most) <speedups>`
        Before each update of a fit that scales the cluster: the predicted speedup on 1, 2, ...
        ``most`` workers, by which a shared cluster divides its workers.  The default, None,
        asks for an equal share.
    :meth:`bind_optimizer(family) <bind_optimizer>`
        Before the first update of each ``fit``/``partial_fit`` call: ``"sgd"`` or
        ``"adaptive"``, the optimizer the fit steps.  The default ignores it.
    :meth:`observe(record) <observe>`
        After each update: its :class:`~adadamp.records.UpdateRecord` (what it cost).  The
        default ignores it.
    :meth:`explain() <explain>`
        After :meth:`observe`: numbers added to the update's row of ``history_``, why the damper
        chose as it did.  The default adds none.

    Attributes
    ----------
    needs_grad_stats : {None, "norm", "chunks"} or bool, default=None
        The gradient statistics :meth:`plan_update` reads (through :meth:`stats_level`): None,
        none (``stats`` is None); ``"norm"``, ``GradStats.grad_sq_norm`` only (the client
        computes it from the summed gradient, at no cost to the workers; RadaDamp);
        ``"chunks"``, also the per-chunk sums (a squared norm per shard, or, for a batch of one
        shard, one extra backward pass over half of it; AdaScale).  True means ``"chunks"``.
    follows_workers : bool, default=False
        The batch size follows the workers the cluster has (elastic DynamicSGD): the cluster is
        then never sized from the batch size, which would feed back on itself.

    Examples
    --------
    A damper that doubles the batch size every epoch:

    >>> class Doubling(BaseDamper):
    ...     def __init__(self, initial=16):
    ...         self.initial = initial
    ...     def next_batch_size(self, state):
    ...         return self.initial * 2 ** int(state.epoch)
    ...     def forecast_batch_size(self, epoch):
    ...         return self.initial * 2 ** int(epoch)
    >>> [r["batch_size"] for r in simulate_schedule(Doubling(16), n_data=64, max_epochs=3)]
    [16, 16, 16, 16, 32, 32, 64]

    Pass it as ``DaskClassifier(batch_size=Doubling(16))``, or as
    ``batch_size=Doubling, batch_size__initial=16``.
    """

    def __new__(cls, *args, **kwargs):
        hint = damper_hint(cls, args, kwargs)  # the original adadamp's names get their new spelling
        if hint is not None:
            raise OldSpellingError(f"{cls.__name__}: {hint}.")
        return super().__new__(cls)

    def _keep(self, arguments: dict) -> None:
        """Store ``__init__``'s arguments (its ``locals()``) as given, each under its own name:
        scikit-learn's contract (``get_params`` and ``clone`` read them back; nothing is checked
        or derived before :meth:`reset`)."""
        for name, value in arguments.items():
            if name != "self":
                setattr(self, name, value)

    def _check(self, param: str, ok, must: str, hint: str = "") -> None:
        """Raise ``ValueError`` naming this damper and ``param`` unless the parameter is a real number
        for which ``ok`` holds: every damper's checks of its numbers read alike."""
        _check_real(getattr(self, param), param, ok, must, type(self).__name__, hint)

    # The flags (the class docstring's Attributes).
    needs_grad_stats: str | bool | None = None
    follows_workers: bool = False

    def workers_for(self, batch_size: int) -> int | None:
        """The workers this damper wants for an update of ``batch_size`` examples, or None to leave
        it to the cluster policy (``ceil(batch_size / grads_per_worker)``).  Either way the answer
        is clipped to ``[min_workers, max_workers]``.

        Examples
        --------
        >>> Constant(batch_size=32).workers_for(32) is None
        True
        """
        return None

    def speedups(self, most: int) -> list[float] | None:
        """The predicted speedup on 1, 2, ... ``most`` workers (goodput against one worker's), by
        which a shared cluster divides its workers among the fits that predict one; None: no
        prediction (the fit gets an equal share).

        Examples
        --------
        >>> Constant(batch_size=32).speedups(4) is None
        True
        """
        return None

    def bind_optimizer(self, family: str) -> None:
        """Told, before the first update of each ``fit``/``partial_fit`` call, which optimizer
        the fit steps: ``"sgd"`` (``torch.optim.SGD``) or ``"adaptive"`` (Adam and the others,
        whose step is normalized by the gradient's magnitude).  Dampers whose learning-rate rule
        depends on it (:class:`Goodput`) keep it; the default ignores it.

        Examples
        --------
        >>> d = Goodput().reset(n_data=100)
        >>> d.bind_optimizer("adaptive")
        >>> d.optimizer_family_
        'adaptive'
        """

    def observe(self, record) -> None:
        """Told after each model update what it cost: its :class:`~adadamp.records.UpdateRecord`
        (batch size, workers, ``compute_time``, ``comm_time``, ``update_time``, ...).  The
        default ignores it; :class:`Goodput` fits its throughput model to these.

        Examples
        --------
        >>> from adadamp.records import UpdateRecord
        >>> Constant(batch_size=32).observe(UpdateRecord(32, 0.1, 1, 0.5, 0.01, 0.002, 0.0, 0.0, 0.0, 0.013))
        """

    def explain(self) -> dict[str, float]:
        """Numbers the damper adds to the row of the update it just planned in ``history_``:
        why it chose as it did (:class:`Goodput`: the noise scale, the efficiency, the predicted
        throughput).  Plain floats; the default adds none.

        Examples
        --------
        >>> Constant(batch_size=32).explain()
        {}
        """
        return {}

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

        Examples
        --------
        >>> GeoDamp(factor=0.5).reset(n_data=1000)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: GeoDamp: factor must be >= 1 ...
        """
        return self

    def scheduler_steps(self, n_updates: int) -> int:
        """The iterations a per-update learning-rate scheduler has reached after ``n_updates`` updates.

        Model updates by default; :class:`AdaScale` counts scale-invariant
        iterations ``floor(tau)`` (Johnson et al. 2020, Alg. 2).

        Examples
        --------
        >>> Constant(batch_size=32).scheduler_steps(7)
        7
        """
        return int(n_updates)

    def next_batch_size(self, state: TrainState) -> int:
        """Batch size of the coming update.

        Parameters
        ----------
        state : TrainState
            The training state before the update.

        Returns
        -------
        int
            Examples to use (>= 1).  The engine takes fewer at the end of a
            data epoch: batches never straddle two epochs.

        Examples
        --------
        >>> d = PadaDamp(initial=32, rate=2).reset(n_data=1000)
        >>> d.next_batch_size(TrainState(10, 320, 0.32, 1000, 1))
        52
        """
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

        Returns
        -------
        UpdatePlan

        Examples
        --------
        Above ``max_batch_size`` the batch stays capped and the learning rate
        is scaled by ``max_batch_size / D`` instead:

        >>> d = GeoDamp(initial=100, delay=1, factor=4, max_batch_size=200).reset(n_data=1000)
        >>> s = TrainState(0, 0, epoch=1.0, n_data=1000, n_workers=2)
        >>> d.next_batch_size(s), d.plan_update(s, 200, None).lr_factor
        (200, 0.5)
        """
        momentum = _resolve_momentum(getattr(self, "momentum", None), state.n_workers, batch_size)
        return UpdatePlan(momentum=momentum)

    def forecast_batch_size(self, epoch: float) -> int | None:
        """Batch size expected at a future ``epoch`` (None if unknown).

        Lets the engine ask for workers before the batch grows.

        Parameters
        ----------
        epoch : float
            A point on the engine's epoch clock.

        Returns
        -------
        int or None

        Examples
        --------
        >>> GeoDamp(initial=32, delay=5, factor=2).forecast_batch_size(10)
        128
        >>> AdaDamp().forecast_batch_size(10) is None  # depends on the loss
        True
        """
        return None

    def stats_level(self) -> str | None:
        """``needs_grad_stats`` as None, ``"norm"`` or ``"chunks"``.

        Examples
        --------
        >>> AdaScale().stats_level(), RadaDamp().stats_level(), GeoDamp().stats_level()
        ('chunks', 'norm', None)
        """
        need = self.needs_grad_stats
        if need is True or need == "chunks":
            return "chunks"
        return "norm" if need == "norm" else None

    def continue_from(self, progress: float) -> BaseDamper:
        """Pick up a training run whose epoch clock stands at ``progress`` examples.

        Called on a damper built afresh for a run that goes on (a warm start
        after ``batch_size__*`` changed), so that clocks of its own continue
        instead of restarting.  Dampers that read only the engine's
        :class:`TrainState` need nothing here.

        Parameters
        ----------
        progress : float
            The engine's epoch clock, in examples.

        Returns
        -------
        self

        Examples
        --------
        >>> GeoDamp(initial=32).reset(1000).continue_from(5000.0).initial
        32
        """
        return self



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
        self._keep(locals())

    def reset(self, n_data: int) -> Constant:
        _check_int(self.batch_size, "batch_size", low=1, owner="Constant")
        _check_momentum(self.momentum, type(self).__name__)
        return self

    def next_batch_size(self, state: TrainState) -> int:
        return int(self.batch_size)

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


def _schedule_forecast(wrapper: BaseDamper, epoch: float) -> int | None:
    """The forecast of a damper that wraps a batch-size schedule (:class:`AdaScale`,
    :class:`DynamicSGD`): its schedule's (``schedule_`` once reset, else ``batch_size``: a damper
    or an int)."""
    sched = getattr(wrapper, "schedule_", None)
    if sched is None:
        if isinstance(wrapper.batch_size, BaseDamper):
            return wrapper.batch_size.forecast_batch_size(epoch)
        return int(wrapper.batch_size)
    return sched.forecast_batch_size(epoch)


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
