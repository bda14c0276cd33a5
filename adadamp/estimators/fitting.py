"""``fit`` and ``partial_fit``: one recipe from the estimator's parameters to its fitted state.

The recipe (``FitMixin._fit``): check the parameters, turn the inputs into a data source
(:mod:`adadamp.data`), build the objects a fit trains from the parameters (as skorch's
``initialize_*``: module, criterion, optimizer, damper, callbacks; each with errors that name the
parameter and the fix, none touching the cluster) or continue the fitted ones, draw the fit's seed
and resume from a ``checkpoint`` file, train in :func:`adadamp.engine.session.train`, and set the
state on the estimator only when training returns.  Saving and loading that state (skorch's
``save_params`` / ``load_params``) and its summary ``meta_`` go with it.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import types
from collections.abc import Mapping
from typing import Self

import numpy as np
import torch
from sklearn.base import ClassifierMixin, clone
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted
from torch import nn

from .. import checkpoint, dashboard, porting
from ..callbacks import resolve as resolve_callbacks
from ..cluster import policy as cl
from ..dampers import BaseDamper, Constant
from ..dampers.clock import LoopState
from ..data import FitData, Targets, convert, make_source
from ..engine import session
from ..engine.loop import FitLoop
from ..exceptions import ConvergenceError, FitInterrupted, NoWorkersError, SchedulerLostError
from ..modules import MLP
from ..records import TrainingState
from ..sample_weight import SampleWeightedLoss
from ..wire import optimizer_plan
from ..wire.averaging import averaged_copy, refresh_batch_norm
from ..wire.seeding import seeded
from . import kit, parameters
from .parameters import routed

logger = logging.getLogger(__name__)


def build_module(params: Mapping, n_features: int, n_outputs: int, seed: int) -> nn.Module:
    """``module`` (None: an :class:`~adadamp.modules.MLP`), its initial weights drawn from ``seed``."""
    spec, kwargs = params["module"], routed(params, "module")
    with seeded(seed):  # the lock keeps other threads' seeding out of these draws
        if spec is None:
            return parameters.construct(MLP, {"n_features": n_features, "n_outputs": n_outputs, **kwargs}, "module")
        if isinstance(spec, nn.Module):
            return parameters.construct(type(spec), kwargs, "module") if kwargs else copy.deepcopy(spec)
        if isinstance(spec, type) and issubclass(spec, nn.Module):
            return parameters.construct(spec, kwargs, "module")
    raise ValueError(f"module must be None, a torch.nn.Module class or instance; got {spec!r}.")


def build_criterion(params: Mapping, default: type[nn.Module]) -> nn.Module:
    """``criterion`` (None: the estimator's ``default``)."""
    spec = params["criterion"] if params["criterion"] is not None else default
    kwargs = routed(params, "criterion")
    if isinstance(spec, nn.Module):
        return parameters.construct(type(spec), kwargs, "criterion") if kwargs else copy.deepcopy(spec)
    if isinstance(spec, type) and issubclass(spec, nn.Module):
        return parameters.construct(spec, kwargs, "criterion")
    raise ValueError(f"criterion must be a torch.nn.Module class or instance; got {spec!r}.")


def build_optimizer(params: Mapping, module: nn.Module) -> torch.optim.Optimizer:
    """``optimizer`` over the module's parameters."""
    return parameters.construct(params["optimizer"], routed(params, "optimizer"), "optimizer", module.parameters())


def build_damper(params: Mapping, n_data: int) -> BaseDamper:
    """``batch_size``: an int (a :class:`~adadamp.dampers.Constant`), a damper class or instance."""
    spec, kwargs = params["batch_size"], routed(params, "batch_size")
    if isinstance(spec, BaseDamper):
        damper = clone(spec)
        try:
            damper.set_params(**kwargs)
        except ValueError as err:
            hint = porting.damper_hint(type(damper), (), kwargs)
            raise ValueError(f"batch_size__*: {hint or err}") from err
    elif isinstance(spec, type):
        damper = parameters.construct(spec, kwargs, "batch_size")
    else:
        if kwargs:
            keys = ", ".join(f"batch_size__{k}" for k in kwargs)
            raise ValueError(f"{keys} given but batch_size={spec!r} is not a damper; pass e.g. batch_size=GeoDamp.")
        damper = Constant(batch_size=int(spec))
    damper.reset(n_data)
    return damper


def damper_spec(params: Mapping) -> str:
    """What the damper is built from, to notice a changed ``batch_size`` on a warm start."""
    return repr((params["batch_size"], sorted(routed(params, "batch_size").items())))


def apply_optimizer_params(state: TrainingState, params: Mapping) -> None:
    """``set_params(optimizer=..., optimizer__*=...)`` since the last fit takes effect now (as in skorch)."""
    if type(state.optimizer) is not params["optimizer"]:
        state.optimizer = build_optimizer(params, state.module)
        return
    for group in state.optimizer.param_groups:
        for key, value in routed(params, "optimizer").items():
            group[key] = value
            if key == "lr":
                group["adadamp_base_lr"] = value  # what the schedules' lr factor multiplies


def check_output_shape(
    module: nn.Module, criterion: nn.Module, X: np.ndarray, y: np.ndarray, expected: tuple | None, params: Mapping
) -> None:
    """A forward pass on two examples on the client, so a misfit module fails here, clearly.

    ``expected``: the output shape the criterion needs for ``y[:2]`` (None: any shape it takes).
    The pass is seeded (a training-mode dropout draws): it holds the generator lock, so another
    fit's thread drawing its initial weights meanwhile gets the same weights, and the caller's
    random stream is left where it was.
    """
    try:
        with torch.no_grad(), seeded(0):
            out = module(torch.tensor(X[:2]))
    except Exception as err:
        keys = sorted(routed(params, "module")) or ["..."]
        raise ValueError(
            f"The module {type(module).__name__} cannot take X's examples of shape {tuple(X.shape[1:])}: "
            f"{type(err).__name__}: {err}. Change its input size (module__{keys[0]}=...) or reshape X."
        ) from err
    target = torch.from_numpy(y[:2])
    if expected is not None and tuple(out.shape) != expected:
        raise ValueError(
            f"The module's output shape {tuple(out.shape)} does not fit the criterion "
            f"{type(criterion).__name__}: expected {expected} for targets of shape "
            f"{tuple(target.shape)}. Change the module's output size."
        )
    try:
        criterion(out, target)
    except Exception as err:
        raise ValueError(
            f"The criterion {type(criterion).__name__} cannot compare the module's output of "
            f"shape {tuple(out.shape)} with targets of shape {tuple(target.shape)}: {err}"
        ) from err


def check_params(params: Mapping) -> list:
    """The checks of the parameters that their constraint table (:mod:`adadamp.estimators.parameters`) does
    not express; returns the fit's callbacks, resolved (:func:`adadamp.callbacks.resolve`: clones)."""
    kit.training_kit(params)  # precision, clipping, micro-batches, compile__*, weight_averaging__*
    if params["checkpoint_every"] is not None and params["checkpoint"] is None:
        raise ValueError(f"checkpoint_every={params['checkpoint_every']} needs a checkpoint file: pass checkpoint='fit.ckpt'.")
    resolved = resolve_callbacks(params["callbacks"], routed(params, "callbacks"))
    optimizer = params["optimizer"]
    closure = inspect.signature(optimizer.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ValueError(
            f"optimizer={optimizer.__name__} needs a closure in step() (it evaluates the loss again within "
            "an update), which data-parallel updates on the workers cannot give. Use a first-order optimizer "
            "such as torch.optim.SGD or torch.optim.Adam."
        )
    # the optimizer's own checks (lr >= 0, ...) now, on one stand-in parameter, naming optimizer__*
    parameters.construct(optimizer, routed(params, "optimizer"), "optimizer", [torch.zeros(1, requires_grad=True)])
    client = params["client"]
    if client is not None and getattr(client, "status", "running") in ("closing", "closed"):
        raise ValueError(
            f"client= is closed (status {client.status!r}): pass a running distributed.Client, or "
            "client=None to use the current one or the embedded cluster."
        )
    return resolved


def draw_seed(random_state) -> int:
    """A fresh fit's seed: from ``random_state``, or (None) from torch's global generator, so that
    ``torch.manual_seed`` makes fits reproducible as it makes a PyTorch script (and skorch)."""
    if random_state is None:
        return int(torch.randint(2**31 - 1, ()).item())
    return int(check_random_state(random_state).randint(2**31 - 1))


def fingerprint(params: Mapping, data) -> dict:
    """What decides a fit's trajectory (:func:`adadamp.checkpoint.fingerprint`): the training data
    and the parameters that shape it (not ``max_epochs``, nor the callbacks)."""
    keys = ("module", "criterion", "optimizer", "batch_size", "random_state", "validation_fraction")
    # the kit's math (not micro_batch_size: a resumed job may bound its passes as its devices need)
    kit = {k: params[k] for k in ("precision", "clip_grad_norm") if params.get(k) not in (None, "32-true")}
    params = {k: v for k, v in params.items() if k in keys or parameters.routed_prefix(k)} | kit
    params = {k: v for k, v in params.items() if not k.startswith(("callbacks__", "compile__", "weight_averaging__"))}
    return checkpoint.fingerprint(data.X, data.y, params)


def resume(state: TrainingState, params: Mapping, source, fresh: bool) -> list:
    """With a ``checkpoint`` file: mark ``state`` with the fit's fingerprint and, on a fresh fit whose
    file exists, restore the saved state over it (refused if the file is another fit's).  Returns
    the updates the saved epoch had taken (none without a file)."""
    path = params["checkpoint"]
    if path is None:
        return []
    current = fingerprint(params, source)
    epoch_updates = []
    if fresh and os.path.exists(path):
        saved = checkpoint.load(path, like=state, fingerprint=current)
        epoch_updates = checkpoint.restore(state, saved, len(source))
    state.fingerprint = current
    return epoch_updates


def fit_label(est, params: Mapping) -> str:
    """The estimator in short, as the verbose output names a fit: its class and the parameters that
    differ from the defaults (what a search varies).

    Examples
    --------
    >>> from adadamp import DaskRegressor
    >>> est = DaskRegressor(max_epochs=3, optimizer__lr=0.01)
    >>> fit_label(est, est.get_params(deep=False))
    'DaskRegressor(max_epochs=3, optimizer__lr=0.01)'
    """
    defaults = {k: p.default for k, p in inspect.signature(type(est).__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    changed = {k: v for k, v in params.items()
               if k not in ("client", "verbose") and (k not in defaults or not _same(v, defaults[k]))}
    return f"{type(est).__name__}({', '.join(f'{k}={v}' for k, v in dashboard.short_params(changed).items())})"


def _same(value, default) -> bool:
    if value is default:
        return True
    try:
        return type(value) is type(default) and bool(value == default)
    except (TypeError, ValueError):  # arrays, tensors: not a default
        return False


def _say_resumed(state: TrainingState, path, verbose) -> None:
    """Say that a fit goes on from its checkpoint file, and from where (printed with ``verbose``)."""
    if state.loop.n_updates == 0:
        return
    said = (f"resumed from the checkpoint {os.path.basename(os.fspath(path))} at update {state.loop.n_updates} "
            f"(epoch {state.loop.epoch:.2f}, {len(state.history)} epochs done)")
    if verbose:
        print(said, flush=True)
    logger.info(said)


def ready(state: TrainingState, made: FitData) -> tuple[SampleWeightedLoss | None, tuple | None]:
    """Check that the damper can drive the optimizer and bind them; returns the workers' criterion
    (None: the state's, unweighted) and the held-out examples as the loop scores them."""
    optimizer_plan.check_supported(state.optimizer, state.damper)
    state.damper.bind_optimizer(optimizer_plan.lr_family(state.optimizer))
    weighted = weighted_criterion(state.criterion, made.head[1]) if made.weighted else None
    return weighted, made.valid if weighted is None or made.valid is None else (*made.valid, weighted)


def initial_state(params: Mapping, made: FitData, targets: Targets) -> TrainingState:
    """A fresh fit's state: everything built from the parameters, checked on the data's first examples
    (``targets``: the default criterion and the output shape a criterion needs)."""
    X, y = made.head
    module = build_module(params, int(np.prod(X.shape[1:])), made.n_outputs, made.seed)
    criterion = build_criterion(params, targets.default_criterion)
    check_output_shape(module, criterion, X, y, targets.output_shape(criterion, y[:2], made.n_outputs), params)
    return TrainingState(
        module=module,
        criterion=criterion,
        optimizer=build_optimizer(params, module),
        damper=build_damper(params, len(made.source)),
        loop=LoopState(seed=made.seed, n_data=len(made.source)),
        targets=made.attrs,
    )


def continued_state(state: TrainingState, params: Mapping, made: FitData, built_from: str) -> TrainingState:
    """A warm call's ``state`` (a copy of the fitted one) updated to the parameters and data of this call.

    ``built_from``: :func:`damper_spec` of the fitted damper; a changed ``batch_size`` builds a new
    damper on the run's continuing clock.
    """
    state.targets.update(made.attrs)
    apply_optimizer_params(state, params)
    if damper_spec(params) != built_from:
        state.damper = build_damper(params, len(made.source)).continue_from(state.loop.progress)
    if state.loop.n_data != len(made.source):
        state.loop = state.loop.resized(len(made.source))
    return state


def weighted_criterion(criterion: nn.Module, y_packed: np.ndarray) -> SampleWeightedLoss:
    """The workers' criterion when the targets carry sample weights (:mod:`adadamp.sample_weight`)."""
    return SampleWeightedLoss(criterion, torch.from_numpy(y_packed[:0]).dtype, y_packed.ndim)



class FitMixin:
    """The training side of :class:`~adadamp.estimators.BaseDaskEstimator` (whose docstring
    documents the parameters and fitted attributes): ``fit``, ``partial_fit``, ``save_params``,
    ``load_params`` and ``meta_``."""

    def fit(self, X, y=None, sample_weight=None, **fit_params) -> Self:
        """Train for ``max_epochs`` epochs (afresh unless ``warm_start``).

        Parameters
        ----------
        X : array-like of shape (n_samples, ...) or torch Dataset
            numpy, torch tensor, pandas or list (placed on the workers once),
            a dask array or DataFrame (trained on where its partitions are;
            the client holds none of it), or a map-style torch Dataset of
            ``(x, y)`` pairs (then ``y=None``), which the workers read example
            by example (the embedded cluster's too).
            N-dimensional inputs (images, sequences) are kept as they are.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Targets: labels for the classifier, numbers for the regressor.
            None when ``X`` is a torch Dataset.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the examples: the trained loss is the
            weighted mean ``sum(w * loss) / sum(w)`` of each batch (with the
            criterion's class weights, if any, multiplied in).  A dask array
            when ``X`` is one.  Not with a torch Dataset.
        **fit_params
            ``classes`` (:class:`DaskClassifier` only): every label, when
            ``y`` may not contain all of them.

        Returns
        -------
        self

        Raises
        ------
        ConvergenceError
            The loss became non-finite; the estimator keeps the last finite
            weights.
        NoWorkersError
            No worker was left and none joined within ``worker_timeout``.
        SchedulerLostError
            The Dask scheduler went away during the fit.

        Examples
        --------
        >>> from sklearn.datasets import load_digits
        >>> from adadamp import DaskClassifier
        >>> X, y = load_digits(return_X_y=True)
        >>> est = DaskClassifier(max_epochs=3, random_state=0)
        >>> est.fit(X / 16, y)  # doctest: +SKIP
        DaskClassifier(max_epochs=3, random_state=0)
        >>> len(est.history_)  # doctest: +SKIP
        3
        """
        warm = self.warm_start and is_fitted(self)
        return self._fit(X, y, epochs=self.max_epochs, fresh=not warm, sample_weight=sample_weight,
                         **self._check_fit_params(fit_params))

    def partial_fit(self, X, y=None, sample_weight=None, **fit_params) -> Self:
        """Train for exactly one epoch, continuing from the fitted state.

        ``max_epochs`` is ignored.  The first call on an unfitted estimator
        starts afresh; later calls continue with the same weights,
        optimizer state, damper state and epoch clock, so ``n`` calls train
        like ``fit`` with ``max_epochs=n``.  If ``batch_size`` (or a
        ``batch_size__*`` parameter) changed since the last call, the damper
        is built again.

        On a cluster of yours (``client``, or a current Client) the workers
        keep the module and the placed data between calls: a call on the
        same data (the same dask graph, Dataset, or arrays with the same
        contents) starts at once.  They are released by a call on other
        data, by ``fit``, after 10 minutes without a call, or when the
        estimator is deleted.

        Parameters
        ----------
        X, y
            As for :meth:`fit`.
        **fit_params
            As for :meth:`fit`.

        Returns
        -------
        self

        Examples
        --------
        >>> from sklearn.datasets import make_regression
        >>> from adadamp import DaskRegressor
        >>> X, y = make_regression(n_features=10, random_state=0)
        >>> est = DaskRegressor(random_state=0)
        >>> for _ in range(3):  # doctest: +SKIP
        ...     est = est.partial_fit(X, y)
        >>> est.n_iter_  # doctest: +SKIP
        3
        """
        return self._fit(X, y, epochs=1, fresh=not is_fitted(self), keep=True, sample_weight=sample_weight,
                         **self._check_fit_params(fit_params))

    def _check_fit_params(self, fit_params: dict) -> dict:
        """The keyword arguments of ``fit`` beyond ``sample_weight`` that this estimator takes."""
        allowed = ("classes",) if isinstance(self, ClassifierMixin) else ()
        unknown = sorted(set(fit_params) - set(allowed))
        if unknown:
            takes = ", ".join(("sample_weight", *allowed))
            raise TypeError(f"{type(self).__name__}.fit got unexpected keyword argument(s) {unknown}; "
                            f"it takes X, y and {takes}.")
        return fit_params

    def _fit(self, X, y, *, epochs: int, fresh: bool, classes=None, keep: bool = False, sample_weight=None):
        """The recipe of ``fit`` and ``partial_fit``: check, make the data source, build or continue
        the state, train it on the cluster, and commit it only when training returns."""
        callbacks = self._check_params()
        if sample_weight is not None and convert.is_dataset(X):
            raise ValueError("sample_weight is not taken with a torch Dataset as X: weight the examples' loss in "
                             "the criterion, or fit arrays.")
        params = self.get_params(deep=False)
        with self._call_client() as client:
            return self._fit_with(client, X, y, epochs=epochs, fresh=fresh, classes=classes, keep=keep,
                                  sample_weight=sample_weight, callbacks=callbacks, params=params)

    def _fit_with(self, given, X, y, *, epochs, fresh, classes, keep, sample_weight, callbacks, params):
        """:meth:`_fit` on the ``given`` client (None: the embedded cluster)."""
        policy = cl.ClusterPolicy.of(params, embedded=given is None)
        with cl.reading_client(given, policy, workers_read=convert.is_dataset(X)) as (client, policy):
            targets = self._targets(fresh, classes)
            made = make_source(
                X, y, targets, estimator=self, fresh=fresh, client=client, sample_weight=sample_weight,
                seed=functools.partial(draw_seed, self.random_state) if fresh else lambda: self.loop_.seed,
                validation_fraction=self.validation_fraction,
                loading={"threads": int(self.dataset_threads), "cache": bool(self.dataset_cache)},
                dask_data=self.dask_data,
            )
            if fresh:
                state = initial_state(params, made, targets)
            else:  # on copies, so that a failed call leaves the fitted state as it was
                state = continued_state(copy.deepcopy(self._state()), params, made, self._damper_spec_)
            epoch_updates = resume(state, params, made.source, fresh)  # from the checkpoint file
            if fresh:
                epochs -= len(state.history)  # the epochs a resumed checkpoint trained
                _say_resumed(state, params["checkpoint"], self.verbose)
            state.callbacks = callbacks  # the clones that run, kept with what they learn
            weighted, valid = ready(state, made)
            loop = FitLoop(self, state, checkpoint=self.checkpoint, checkpoint_every=self.checkpoint_every,
                           verbose=self.verbose, valid=valid, page=dashboard.opener(type(self).__name__, params, state),
                           label=fit_label(self, params),
                           budgeted=not keep)
            self._training_state = state  # save_params from a callback saves this state, not the last fit's
            start = state.loop.n_updates
            try:
                self._kept_backend = session.train(
                    loop, made.source, epochs, epoch_updates, backend=self.backend, device=str(self.device),
                    client=client, policy=policy, criterion=weighted, fresh=fresh, keep=keep, owner=self,
                    kit=kit.training_kit(params),
                    kept=self.__dict__.pop("_kept_backend", None),  # one call at a time uses it
                )
            except (ConvergenceError, NoWorkersError, SchedulerLostError, FitInterrupted):
                if state.loop.n_updates > start:
                    self._commit(state, made.source)  # training stopped cleanly, with the last good weights
                raise
            finally:
                del self._training_state
        self._commit(state, made.source)
        self._data_path = made.path
        return self

    def _commit(self, state: TrainingState, source=None) -> None:
        """Make ``state`` the fitted state; with ``weight_averaging``, also ``averaged_module_`` (its
        BatchNorm statistics recomputed on the training data ``source`` holds in memory)."""
        state.set_on(self)
        averaged = averaged_copy(state.module, state.optimizer) if self.weight_averaging is not None else None
        if averaged is None:
            self.__dict__.pop("averaged_module_", None)
        else:
            arrays = None if source is None else source.shared_arrays()
            batch = state.history[-1]["batch_size"] if state.history else 256
            refresh_batch_norm(averaged, None if arrays is None else arrays[0], batch)
            self.averaged_module_ = averaged
        self._damper_spec_ = damper_spec(self.get_params(deep=False))

    # --------------------------------------------------------- save / load
    def save_params(self, f_params=None, f_optimizer=None, f_history=None, f_checkpoint=None) -> None:
        """Save parts of the fitted state (skorch's names).

        Parameters
        ----------
        f_params : path, optional
            The module's ``state_dict`` (``torch.save``).
        f_optimizer : path, optional
            The optimizer's ``state_dict``.
        f_history : path, optional
            ``history_`` as JSON.
        f_checkpoint : path, optional
            Everything needed to resume training (see ``checkpoint``).

        Examples
        --------
        >>> est.save_params(f_params="model.pt", f_history="history.json")  # doctest: +SKIP
        """
        state = getattr(self, "_training_state", None)  # during fit (from a callback): what is being trained
        if state is None:
            check_is_fitted(self)
            state = self._state()
        checkpoint.save_parts(state, f_params=f_params, f_optimizer=f_optimizer, f_history=f_history,
                              f_checkpoint=f_checkpoint)

    def load_params(self, f_params=None, f_optimizer=None, f_history=None, f_checkpoint=None) -> Self:
        """Load what :meth:`save_params` saved into a fitted estimator of the same structure.

        There is no separate initialisation step: the estimator must have
        been fitted (for instance for one epoch on the same data), so that
        ``module_`` and ``optimizer_`` exist to receive the saved state.

        Parameters
        ----------
        f_params : path, optional
            A module ``state_dict`` saved by :meth:`save_params`.
        f_optimizer : path, optional
            An optimizer ``state_dict``.
        f_history : path, optional
            A JSON history; sets ``history_`` and ``n_iter_``.
        f_checkpoint : path, optional
            A full training state (weights, optimizer, damper, epoch clock,
            history).  It must have been written for the same number of
            training examples as this estimator was fitted on.

        Returns
        -------
        self

        Examples
        --------
        >>> est.save_params(f_params="model.pt")  # doctest: +SKIP
        >>> new = DaskClassifier(max_epochs=1).fit(X, y)  # doctest: +SKIP
        >>> new.load_params(f_params="model.pt")  # doctest: +SKIP
        """
        check_is_fitted(self)
        state = self._state()
        checkpoint.load_parts(state, self.loop_.n_data, f_params=f_params, f_optimizer=f_optimizer,
                              f_history=f_history, f_checkpoint=f_checkpoint)
        if f_checkpoint is not None:
            self._commit(state)  # the damper and the epoch clock too
        self.history_, self.n_iter_ = state.history, len(state.history)
        return self

    def _state(self) -> TrainingState:
        """The fitted state as a :class:`~adadamp.records.TrainingState` (shares the objects)."""
        return TrainingState.of(self, target_keys=("classes_", "_y_1d"))

    @property
    def meta_(self) -> types.MappingProxyType:
        """Read-only summary of the fitted state (adadamp's ``meta_``).

        Keys: ``n_updates``, ``n_samples_seen``, ``epochs`` (the epoch
        clock), from the last epoch's row of ``history_``: ``batch_size``,
        ``lr``, ``n_workers`` and ``train_loss``, and ``data``: how the last
        call's examples reached the workers ("sent", "persisted",
        "streamed" or "read").

        Examples
        --------
        >>> est.fit(X, y).meta_["n_updates"]  # doctest: +SKIP
        570
        """
        check_is_fitted(self)
        return porting.meta(self.loop_, self.history_, data=getattr(self, "_data_path", None))


def is_fitted(est) -> bool:
    return hasattr(est, "module_")
