"""The learning-rate schedule of a fit as callbacks (:class:`LRScheduler`, skorch's; :class:`Warmup`),
applied on top of the damper's learning-rate factor."""

from __future__ import annotations

import math

import torch

from ..wire.optimizer_plan import WARMUP_KEY
from .base import Callback


class LRScheduler(Callback):
    """A torch learning-rate scheduler, composed with the damper's learning-rate factor.

    The damper sets every update's learning rate as ``base_lr * factor``
    (GeoDampLR's decay, AdaScale's gain, a capped batch); a scheduler given
    here multiplies in: ``lr = scheduled_lr * factor``, where
    ``scheduled_lr`` is what ``policy`` would set from ``base_lr``
    (``optimizer__lr``).  The scheduler runs on a shadow copy of the param
    groups, so it never fights the damper over ``param_group["lr"]``.

    The scheduler is stepped in the damper's clock: with
    ``step_every="batch"`` once per model update, or under
    :class:`~adadamp.dampers.AdaScale` once per scale-invariant iteration
    ``floor(tau)`` (Johnson et al. 2020, Alg. 2: ``lr(floor(tau_t))``), so a
    cosine or step schedule tuned at the base batch size keeps its shape when
    the batch grows; with ``step_every="epoch"`` once per epoch of the
    engine's epoch clock (scale-invariant epochs under AdaScale).  The
    scheduler's position is a function of that clock, so ``partial_fit``,
    warm starts and a ``fit`` resumed from a checkpoint continue the schedule
    where it was.  ``ReduceLROnPlateau`` steps at the end of each epoch with
    ``row[monitor]`` (its patience counters restart with each ``fit`` call).

    Parameters
    ----------
    policy : str or class, default="StepLR"
        A class of :mod:`torch.optim.lr_scheduler` or its name.
    step_every : {"epoch", "batch"}, default="epoch"
        Step per epoch or per model update (skorch's names).
    monitor : str, default="train_loss"
        Key of the epoch row passed to ``ReduceLROnPlateau``.
    **kwargs
        Parameters of ``policy`` (e.g. ``T_max=...``); they route as
        ``callbacks__<name>__T_max=...``.

    Attributes
    ----------
    lr_scheduler_ : torch.optim.lr_scheduler.LRScheduler
        The scheduler of the last fit (stepping a shadow optimizer).

    Examples
    --------
    >>> import torch
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(
    ...     optimizer=torch.optim.SGD, optimizer__lr=0.1,
    ...     callbacks=[("lr", LRScheduler(policy=torch.optim.lr_scheduler.CosineAnnealingLR, T_max=20))],
    ... )
    """

    _own = ("policy", "step_every", "monitor")

    def __init__(self, policy="StepLR", step_every: str = "epoch", monitor: str = "train_loss", **kwargs):
        self.policy = policy
        self.step_every = step_every
        self.monitor = monitor
        vars(self).update(kwargs)

    def _policy_kwargs(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in self._own and not k.endswith("_")}

    def get_params(self, deep: bool = True) -> dict:
        return {**super().get_params(deep=deep), **self._policy_kwargs()}

    def set_params(self, **params) -> LRScheduler:
        vars(self).update(params)  # policy parameters are open-ended (skorch: LRScheduler(**kwargs))
        return self

    def check_params(self) -> None:
        """Build the scheduler once on a stand-in optimizer: a bad policy or argument fails here, not mid-fit."""
        self._build([1.0])

    def _build(self, base_lrs: list[float]):
        """The scheduler on a shadow optimizer whose param groups hold ``base_lrs``."""
        policy = self._policy_class()
        shadow = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in base_lrs])
        try:
            scheduler = policy(shadow, **self._policy_kwargs())
        except (TypeError, ValueError) as err:
            raise type(err)(f"LRScheduler: {policy.__name__}({self._policy_kwargs()}): {err}") from err
        shadow.step()  # a no-op (no gradients): marks the optimizer-then-scheduler order torch checks
        return scheduler

    def _policy_class(self):
        policy = self.policy
        if isinstance(policy, str):
            policy = getattr(torch.optim.lr_scheduler, policy, None)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        if not (isinstance(policy, type) and issubclass(policy, (torch.optim.lr_scheduler.LRScheduler, plateau))):
            raise TypeError(
                f"LRScheduler: policy must be a class of torch.optim.lr_scheduler or its name, e.g. "
                f"policy='CosineAnnealingLR'; got {self.policy!r}."
            )
        if self.step_every not in ("epoch", "batch"):
            raise ValueError(f"LRScheduler: step_every must be 'epoch' or 'batch'; got {self.step_every!r}.")
        if issubclass(policy, plateau) and self.step_every != "epoch":
            raise ValueError("LRScheduler: ReduceLROnPlateau steps on an epoch metric; use step_every='epoch'.")
        return policy

    def on_train_begin(self, estimator, optimizer=None, damper=None, loop=None, **info) -> None:
        self.optimizer_, self.damper_, self.loop_ = optimizer, damper, loop
        self.lr_scheduler_ = self._build([g["adadamp_base_lr"] for g in optimizer.param_groups])
        self._follow_clock()

    def _clock(self) -> int:
        if self.step_every == "batch":
            return self.damper_.scheduler_steps(self.loop_.n_updates)
        return math.floor(self.loop_.epoch + 1e-9)

    def _follow_clock(self) -> None:
        scheduler = self.lr_scheduler_
        if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            for _ in range(self._clock() - scheduler.last_epoch):
                scheduler.step()
        for group, shadow in zip(self.optimizer_.param_groups, scheduler.optimizer.param_groups):
            group["adadamp_scheduled_lr"] = float(shadow["lr"])

    def on_update_end(self, estimator, **info) -> None:
        self._follow_clock()

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        if isinstance(self.lr_scheduler_, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if self.monitor not in row:
                raise ValueError(f"LRScheduler monitors {self.monitor!r}, which the epoch rows do not have: {sorted(row)}.")
            self.lr_scheduler_.step(row[self.monitor])
            self._follow_clock()

    def on_train_end(self, estimator, **info) -> None:
        for group in self.optimizer_.param_groups:
            group.pop("adadamp_scheduled_lr", None)

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ("optimizer_", "damper_", "loop_"):  # borrowed from the fit, not part of the callback
            state.pop(key, None)
        return state


class Warmup(Callback):
    """A linear learning-rate warmup over the first ``updates`` model updates or ``epochs`` epochs.

    The learning rate of update ``t`` is multiplied by ``start_factor + (1 - start_factor) *
    min(1, t / updates)`` (or ``epochs`` seen, counted in examples, so a growing batch warms up
    over the same data), as :class:`torch.optim.lr_scheduler.LinearLR` stepped once per update;
    the factor multiplies whatever else sets the learning rate: the damper's factor (AdaScale's
    gain, GeoDampLR's decay, a capped batch) and an :class:`LRScheduler`.  It is the gradual warmup
    of Goyal et al. 2017 (Sec. 2.2): with the linear scaling rule (the learning rate of batch ``kB``
    is ``k`` times that of batch ``B``) start from ``1/k`` of it over about 5 epochs (user guide,
    "Training kit").  The factor is a function of the training clock, so ``partial_fit``, warm
    starts and a resumed checkpoint continue it.

    Parameters
    ----------
    updates : int or None, default=None
        Model updates to warm up over.
    epochs : float or None, default=None
        Epochs to warm up over (exactly one of ``updates`` and ``epochs``).
    start_factor : float, default=1/3
        The first update's factor, in ``(0, 1]`` (``LinearLR``'s name and default).

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(optimizer__lr=0.8, callbacks=[Warmup(epochs=5, start_factor=1 / 8)])
    """

    def __init__(self, updates: int | None = None, epochs: float | None = None, start_factor: float = 1 / 3):
        self.updates = updates
        self.epochs = epochs
        self.start_factor = start_factor

    def check_params(self) -> None:
        if (self.updates is None) == (self.epochs is None):
            raise ValueError(f"Warmup: give exactly one of updates= and epochs=; got updates={self.updates!r}, "
                             f"epochs={self.epochs!r}.")
        length = self.updates if self.epochs is None else self.epochs
        if isinstance(length, bool) or not isinstance(length, int | float) or not 0 < length < math.inf:
            raise ValueError(f"Warmup: updates= or epochs= must be a finite number > 0; got {length!r}.")
        if isinstance(self.start_factor, bool) or not 0 < self.start_factor <= 1:
            raise ValueError(f"Warmup: start_factor must be in (0, 1]; got {self.start_factor!r}.")

    def factor(self) -> float:
        """The next update's factor, from the training clock."""
        done = self.loop_.n_updates / self.updates if self.epochs is None else self.loop_.epoch / self.epochs
        return self.start_factor + (1.0 - self.start_factor) * min(1.0, done)

    def on_train_begin(self, estimator, optimizer=None, loop=None, **info) -> None:
        self.optimizer_, self.loop_ = optimizer, loop
        self._set()

    def on_update_end(self, estimator, **info) -> None:
        self._set()

    def _set(self) -> None:
        value = self.factor()
        for group in self.optimizer_.param_groups:
            group[WARMUP_KEY] = value

    def on_train_end(self, estimator, **info) -> None:
        for group in self.optimizer_.param_groups:
            group.pop(WARMUP_KEY, None)

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ("optimizer_", "loop_"):  # borrowed from the fit, not part of the callback
            state.pop(key, None)
        return state
