"""The estimators' declaration: their scikit-learn contract.

The constructor parameters and their numpydoc documentation (most of the lines, kept beside them
as scikit-learn does), their constraint table (:mod:`adadamp.estimators.parameters`),
``get_params`` / ``set_params`` with routed keys (skorch's ``module__hidden=8``,
``optimizer__lr=0.05``, ``batch_size__delay=5``), the client they train on, cloning and pickling,
and the targets that make one a classifier and the other a regressor.  Everything is validated
before any cluster work.  What the estimators do is in two mixins: training in
:mod:`adadamp.estimators.fitting` and ``predict`` / ``predict_proba`` / ``score`` in
:mod:`adadamp.estimators.predicting`.
"""

from __future__ import annotations

import inspect
import logging
from typing import ClassVar

import torch
from sklearn.base import BaseEstimator, clone

from .. import porting
from ..cluster import pickled_client
from ..cluster import policy as cl
from ..data import Labels, Values
from ..engine.backends import backend_names
from ..wire.averaging import KINDS
from ..wire.precision import PRECISIONS
from . import fitting, parameters
from .fitting import FitMixin, is_fitted
from .predicting import ClassifierPredictMixin, RegressorPredictMixin

__all__ = ["BaseDaskEstimator", "DaskBaseDamper", "DaskClassifier", "DaskRegressor"]

logger = logging.getLogger(__name__)


#: What each parameter takes that the constraint alone does not say.
_PARAMETER_HINTS = {
    "backend": "Use 'allreduce' for large models on many workers, 'parameter-server' (the default) otherwise.",
    "checkpoint_every": "It counts model updates.",
    "dataset_threads": "It counts threads per worker.",
    "precision": "'bf16-mixed' and '16-mixed' run the forward pass under torch.autocast (Lightning's names).",
    "micro_batch_size": "It counts examples per forward and backward pass on one worker; None: a worker's whole share at once.",
    "clip_grad_norm": "It is the largest global norm of the batch's gradient (torch.nn.utils.clip_grad_norm_); None: no clipping.",
    "shares": "Use 'speed' on a cluster whose workers differ in speed, 'equal' (the default) for bitwise reproducibility.",
}

class BaseDaskEstimator(FitMixin, BaseEstimator):
    """Base of :class:`DaskClassifier` and :class:`DaskRegressor` (not instantiated itself).

    Trains a PyTorch module with synchronous data-parallel SGD on the workers
    of a Dask cluster.  The client holds the weights and the optimizer; each
    model update sends the weights to the workers, each worker returns the
    gradient sum over its share of the batch, and the client steps.  The batch
    size may grow during training (``batch_size=GeoDamp``) and the cluster
    with it.

    Parameters
    ----------
    module : torch.nn.Module class or instance, default=None
        The model.  A class is built with the ``module__*`` parameters; an
        instance is copied at each fresh fit.  None builds an :class:`MLP`
        sized to the data (``module__hidden`` sets its hidden layers).
    criterion : torch.nn.Module class or instance, default=None
        The loss (built with ``criterion__*``).  None means
        ``CrossEntropyLoss`` for the classifier and ``MSELoss`` for the
        regressor.
    optimizer : torch.optim.Optimizer class, default=torch.optim.Adam
        Built on the client with ``optimizer__*`` (e.g. ``optimizer__lr``).
    batch_size : int, damper class or damper instance, default=32
        Examples per model update.  A damper (see :mod:`adadamp.dampers`)
        changes it during training; a class is built with ``batch_size__*``.
    max_epochs : int, default=10
        Epochs of ``fit``.  ``partial_fit`` runs exactly one epoch.
    warm_start : bool, default=False
        Continue from the fitted state instead of starting afresh.
    random_state : int, RandomState or None, default=None
        Seeds the module's initial weights, the data order and dropout.
        None draws the fit's seed from torch's global generator, so
        ``torch.manual_seed(0)`` before a fit makes it reproducible, as in
        PyTorch and skorch.
        Same seed and the same number of workers throughout the fit give
        bitwise the same weights, whichever workers and wherever the client
        runs; after workers change mid-fit, equal up to float summation
        order (user guide, "Reproducibility").
    device : str, default="cpu"
        Where the workers compute ("cuda" for their GPU).  The client side
        always stays on the CPU.
    precision : {"32-true", "bf16-mixed", "16-mixed"}, default="32-true"
        Lightning's names.  "Mixed": the workers' forward pass and loss run
        under ``torch.autocast`` in bfloat16 or float16; the weights, the
        optimizer and the summed gradient stay float32.  "16-mixed" scales
        the loss as ``torch.amp.GradScaler`` does (a step whose gradient is
        not finite is skipped, ``history_``'s update rows say so; the scale
        is saved with the optimizer).  User guide, "Training kit".
    clip_grad_norm : float or None, default=None
        Clip the batch's mean gradient to this global norm before each
        step, as ``torch.nn.utils.clip_grad_norm_`` does in a single
        process (the norm of the whole batch's gradient, whatever the
        workers); the update rows record ``grad_norm`` before clipping.
    micro_batch_size : int or None, default=None
        The most examples a worker passes forward and backward at once
        (DeepSpeed's name): a larger share of the batch is accumulated
        over several passes, so a worker's memory stays that of one pass
        while the batch grows past what the cluster adds workers for.  The
        gradient is the same sum (bitwise the same for the same seed and
        workers); BatchNorm normalizes per pass and dropout draws per pass.
        None: a worker's whole share in one pass.
    compile : bool, default=False
        Run the workers' module through ``torch.compile`` (skorch's name),
        with the ``compile__*`` parameters (``compile__mode``,
        ``compile__backend``, ...).  Each worker compiles once per fit, its
        batch dimension dynamic, so a growing batch, micro-batches and an
        epoch's ragged last batch need no new compilation; ``predict``
        runs the plain module on the client.
    weight_averaging : {None, "ema", "swa"}, default=None
        Average the weights over the steps, as
        ``torch.optim.swa_utils.AveragedModel`` does: an exponential moving
        average (``weight_averaging__decay``, 0.999) or the running mean
        of SWA, from the first update of data epoch
        ``weight_averaging__start_epoch`` (0).  ``predict``,
        ``predict_proba`` and ``score`` then use ``averaged_module_``;
        training continues from ``module_``.  The average is saved with the
        optimizer's state (checkpoints, ``partial_fit``).
    backend : {"parameter-server", "allreduce"}, default="parameter-server"
        How the workers train (user guide, "Backends").  ``"parameter-server"``:
        the client holds the weights, sends them each update and steps (best
        for small models and one machine).  ``"allreduce"``: every worker holds
        a replica of the module and optimizer, gradients are all-reduced among
        the workers with ``torch.distributed`` (gloo; NCCL on CUDA) and the
        client sends and receives only a few numbers per update (best for large
        models and many workers).  Same data order, dampers and elasticity.
        Other names: backends registered with
        :func:`adadamp.engine.backends.register_backend`.
    client : distributed.Client or None, default=None
        The cluster to train on.  None uses the active client if there is
        one, else the embedded cluster: one LocalCluster per process, which
        the fits with no client share (started by the first, closed after 10
        minutes without a fit, by :func:`adadamp.close_embedded_cluster` or
        at exit).  Pickled, it keeps the scheduler's address (and, for
        joblib's and multiprocessing's worker processes, its TLS settings), so
        a search with ``n_jobs`` on joblib's processes trains on this cluster;
        an estimator with None sent to such a process takes the sender's
        default client (:mod:`adadamp.cluster.pickled_client`).
    grads_per_worker : int, default=128
        Examples per worker per update: a batch of ``B`` examples trains on
        ``clip(ceil(B / grads_per_worker), min_workers, max_workers)``
        workers, on any cluster (the others stay free for other fits).
    min_workers, max_workers : int, default=1 and None
        Bounds for the workers a batch trains on (and the cluster size).
        ``max_workers=None`` means one worker per core for the embedded
        cluster and 16 otherwise.  Raise ``min_workers`` to spread small
        batches over more workers.
    scale_cluster : bool or None, default=None
        Grow and shrink the cluster with the batch size (``cluster.scale``).
        None: yes for the embedded cluster, no for a cluster you passed
        (whose idle workers a growing batch takes).
    scale_wait : float, default=30
        When the batch outgrows the live workers, seconds to wait once for
        the workers asked for before training on with those that came (so an
        HPC queue never blocks training for long).  The cluster is asked one
        worker start ahead (measured; at least one epoch) when the damper
        knows its schedule (GeoDamp).
    worker_timeout : float, default=60
        Seconds to wait for a worker when none is left.
    update_timeout : float, default=120
        The most seconds one worker may take for one gradient (or its
        set-up) before it is treated as lost (its share is recomputed on the
        others); a worker still listed after that is left out of the fit as
        hung.  A worker that has not answered when the others have is
        treated as lost sooner: after ten times their time, at least 5 s
        (user guide, "Heterogeneous clusters").
    shares : {"equal", "speed"}, default="equal"
        How each update's batch is shared among the workers.  ``"equal"``:
        equal shares; the same seed and workers give bitwise the same
        weights, and an update waits for the slowest worker.  ``"speed"``:
        each worker's share follows its measured throughput (examples per
        second, smoothed over updates, less its fixed time per update), so
        that all finish together; its data blocks follow its share.  Every example of an update is still
        used exactly once and the gradient is the same sum, so the weights
        equal those of equal shares up to float summation order, but they
        are no longer bitwise reproducible (who computes what follows the
        timings), and a module with BatchNorm or dropout normalizes and
        draws masks per smaller shard (user guide, "Heterogeneous
        clusters").
    checkpoint : str or path-like, default=None
        File for the training state (weights, optimizer, damper, epoch clock,
        sampler position, history), written atomically after every epoch
        and every ``checkpoint_every`` updates.  If the file exists when a
        fresh ``fit`` starts, training resumes from it and ends as the
        uninterrupted run would have.
    checkpoint_every : int or None, default=None
        Also checkpoint every this many model updates (None: epochs only).
    validation_fraction : float or None, default=None
        Hold out this fraction of ``X`` (seeded) and record ``valid_loss``
        per epoch (for ``EarlyStopping``).  None: no internal split, so
        ``GridSearchCV`` does the validating.
    dask_data : {"auto", "persist", "stream"}, default="auto"
        How a dask ``X`` reaches the workers: persisted there for the whole
        fit, or streamed through them a few blocks at a time (each epoch in
        a seeded windowed order; see the data guide).  "auto" streams when
        persisting would not fit in the workers' memory.
    dataset_threads : int, default=2
        Threads per worker that read a lazy torch Dataset's examples, the
        next update's while this one computes (as ``DataLoader(num_workers=...)``).
    dataset_cache : bool, default=False
        Keep every example of a torch Dataset in the memory of the worker
        that read it, and read without seeding, in parallel.  Only for
        Datasets without random transforms (their augmentation would be
        frozen at the first read).
    callbacks : list of Callback or (name, Callback), default=None
        Hooks named as in skorch (``on_train_begin/end``,
        ``on_epoch_begin/end``, ``on_update_end``), e.g. ``EarlyStopping``,
        ``ProgressBar`` (see :mod:`adadamp.callbacks`); parameters route as
        ``callbacks__<name>__<param>``.
    verbose : int, default=0
        1 prints the live training page's address when the fit starts (0
        logs it at INFO level), the estimated time left after the first
        updates, and one line per epoch.
    **kwargs
        Routed parameters: ``module__*``, ``criterion__*``, ``optimizer__*``,
        ``batch_size__*``, ``callbacks__*``, ``compile__*``, ``weight_averaging__*``.

    Attributes
    ----------
    module_ : torch.nn.Module
        The trained module (on the CPU).
    optimizer_ : torch.optim.Optimizer
        The optimizer with its state (momentum buffers survive epochs,
        batch-size changes and ``partial_fit`` calls).
    criterion_ : torch.nn.Module
    damper_ : BaseDamper
        The resolved batch-size schedule with its training state.
    callbacks_ : list of (str, Callback)
        The callbacks of the last fit, by name: clones of ``callbacks`` (the
        instances passed in stay untouched, as scikit-learn parameters do),
        holding what they recorded, e.g. ``dict(est.callbacks_)["stop"].best_epoch_``.
    history_ : list of dict
        One row per epoch: ``epoch, train_loss, batch_size, lr, n_workers,
        n_updates, n_samples_seen, dur`` and the per-update rows under
        ``"updates"`` (batch size, lr, workers, loss and a time breakdown:
        ``compute_time, comm_time, send_time, aggregate_time, step_time,
        update_time``; see the callbacks guide; ``shares``: the examples
        each worker computed, ``stragglers``: the ranks of workers that
        would take over twice the median's time for an equal share,
        ``lost``: workers the update lost, ``peak_memory``: each worker's
        peak memory in the update, bytes; the epoch row holds the largest).
    averaged_module_ : torch.nn.Module
        With ``weight_averaging``: the module with the averaged weights
        (BatchNorm's statistics as ``module_``'s), what ``predict`` uses.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X has string column names (pandas).
    n_iter_ : int
        Epochs trained.

    Examples
    --------
    Use :class:`DaskClassifier` or :class:`DaskRegressor`; this class holds
    what they share.  Routed parameters are parameters like any other:
    ``get_params`` returns them, so ``clone`` and ``GridSearchCV`` keep them.

    >>> from adadamp import DaskRegressor
    >>> from adadamp.dampers import GeoDamp
    >>> est = DaskRegressor(batch_size=GeoDamp, batch_size__delay=60)
    >>> est.get_params()["batch_size__delay"]
    60
    """

    #: What each constructor parameter accepts (:func:`adadamp.parameters.check`); parameters whose
    #: value is routed or built (``module``, ``criterion``, ``callbacks``, ``client``) are checked
    #: when they are used.
    _parameter_constraints: ClassVar[dict] = {
        "optimizer": (parameters.OptimizerClass(),),
        "batch_size": (parameters.Integer(1), parameters.Damper()),
        "max_epochs": (parameters.Integer(1),),
        "warm_start": (parameters.Boolean(),),
        "device": (parameters.TorchDevice(),),
        "precision": (parameters.OneOf(lambda: PRECISIONS),),
        "clip_grad_norm": (None, parameters.Positive()),
        "micro_batch_size": (None, parameters.Integer(1)),
        "compile": (parameters.Boolean(),),
        "weight_averaging": (None, parameters.OneOf(lambda: KINDS)),
        "backend": (parameters.OneOf(backend_names),),
        "grads_per_worker": (parameters.Integer(1),),
        "min_workers": (parameters.Integer(1),),
        "max_workers": (None, parameters.Integer("min_workers")),
        "scale_cluster": (None, parameters.Boolean()),
        "scale_wait": (parameters.Seconds(strict=False),),
        "worker_timeout": (parameters.Seconds(),),
        "update_timeout": (parameters.Seconds(),),
        "shares": (parameters.OneOf(lambda: ("equal", "speed")),),
        "checkpoint_every": (None, parameters.Integer(1)),
        "validation_fraction": (None, parameters.Unit()),
        "dask_data": (parameters.OneOf(lambda: ("auto", "persist", "stream")),),
        "dataset_threads": (parameters.Integer(1),),
        "dataset_cache": (parameters.Boolean(),),
        "verbose": (parameters.Integer(0), parameters.Boolean()),
    }

    def __init__(
        self,
        module=None,
        criterion=None,
        optimizer=torch.optim.Adam,
        batch_size=32,
        max_epochs: int = 10,
        warm_start: bool = False,
        random_state=None,
        device: str = "cpu",
        precision: str = "32-true",
        clip_grad_norm: float | None = None,
        micro_batch_size: int | None = None,
        compile: bool = False,
        weight_averaging: str | None = None,
        backend: str = "parameter-server",
        client=None,
        grads_per_worker: int = 128,
        min_workers: int = 1,
        max_workers: int | None = None,
        scale_cluster: bool | None = None,
        scale_wait: float = 30.0,
        worker_timeout: float = 60.0,
        update_timeout: float = 120.0,
        shares: str = "equal",
        checkpoint=None,
        checkpoint_every: int | None = None,
        validation_fraction: float | None = None,
        dask_data: str = "auto",
        dataset_threads: int = 2,
        dataset_cache: bool = False,
        callbacks=None,
        verbose: int = 0,
        **kwargs,
    ):
        if type(self) is BaseDaskEstimator:
            raise TypeError(porting.BASE_CLASS)
        self.module = module
        self.criterion = criterion
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.warm_start = warm_start
        self.random_state = random_state
        self.device = device
        self.precision = precision
        self.clip_grad_norm = clip_grad_norm
        self.micro_batch_size = micro_batch_size
        self.compile = compile
        self.weight_averaging = weight_averaging
        self.backend = backend
        self.client = client
        self.grads_per_worker = grads_per_worker
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.scale_cluster = scale_cluster
        self.scale_wait = scale_wait
        self.worker_timeout = worker_timeout
        self.update_timeout = update_timeout
        self.shares = shares
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.validation_fraction = validation_fraction
        self.dask_data = dask_data
        self.dataset_threads = dataset_threads
        self.dataset_cache = dataset_cache
        self.callbacks = callbacks
        self.verbose = verbose
        for key, value in kwargs.items():
            setattr(self, key, value)

    # ------------------------------------------------------------ parameters
    @classmethod
    def _init_param_names(cls) -> list[str]:
        sig = inspect.signature(BaseDaskEstimator.__init__)
        return [p for p in sig.parameters if p not in ("self", "kwargs")]

    def _get_param_names(self) -> list[str]:
        # Extra keyword arguments (routed ``prefix__name`` keys, or typos that
        # fit will reject with a hint) are parameters too, so clone keeps them.
        names = self._init_param_names()
        extra = sorted(k for k in vars(self) if k not in names and not k.startswith("_") and not k.endswith("_"))
        return names + extra

    def set_params(self, **params):
        """Set parameters; routed ``prefix__name`` keys are stored as given.

        Routed keys (``module__*``, ``criterion__*``, ``optimizer__*``,
        ``batch_size__*``, ``callbacks__*``) are not checked here: ``fit``
        checks them against the object they are routed to and raises a
        ``ValueError`` with a "did you mean" hint for a wrong name.

        Parameters
        ----------
        **params
            Parameter names and their new values.

        Returns
        -------
        self

        Examples
        --------
        >>> from adadamp import DaskRegressor
        >>> from adadamp.dampers import GeoDamp
        >>> est = DaskRegressor().set_params(batch_size=GeoDamp, batch_size__factor=5)
        >>> est.batch_size__factor
        5
        """
        normal = {}
        for key, value in params.items():
            if parameters.routed_prefix(key):
                setattr(self, key, value)
            else:
                normal[key] = value
        if normal:
            super().set_params(**normal)
        return self

    def _check_params(self) -> list:
        """Validate every parameter before any data or cluster work; returns the fit's callbacks (clones)."""
        parameters.check_names(type(self).__name__, self._get_param_names(), self._init_param_names())
        params = self.get_params(deep=False)
        parameters.check(self._parameter_constraints, params, _PARAMETER_HINTS)
        return fitting.check_params(params)

    # -------------------------------------- the client, pickling and cloning
    def _client(self):
        """The client this estimator works with: its own (a pickled one connected in this process,
        :mod:`adadamp.cluster.pickled_client`), the current one, the default client of the process that sent
        it here (a joblib worker process), or None (the embedded cluster).  Hold it for the call with
        :meth:`_call_client`."""
        if self.client is not None:
            return pickled_client.resolve(self.client)
        client = cl.active_client()
        sender = self.__dict__.get("_sender")
        if client is None and sender is not None:
            return sender.resolve(type(self).__name__)
        return client

    def _call_client(self, needed: bool = True):
        """A context holding :meth:`_client` (None where not ``needed``) for one call: a connection
        made in this process for a pickled estimator is closed after the last call using it, unless
        a backend is kept open on it (``partial_fit``)."""
        return pickled_client.in_use(self._client() if needed else None,
                                     keep=lambda: self.__dict__.get("_kept_backend") is not None)

    def __getattr__(self, name: str):
        """Only reached for a missing attribute: the original adadamp's names get their new spelling."""
        raise porting.missing_attribute(type(self).__name__, name)

    def __getstate__(self):
        """The pickled estimator: its ``client`` as the scheduler's address (and TLS settings), so
        that it trains on the same cluster in another process (:mod:`adadamp.cluster.pickled_client`); with
        ``client=None``, for a child process, where it came from (:class:`~adadamp.cluster.pickled_client.Sender`)."""
        state = self.__dict__.copy()
        state["client"] = pickled_client.pickled(self.client)
        if self.client is None:
            state["_sender"] = self.__dict__.get("_sender") or pickled_client.Sender()  # for child processes only
        state.pop("_kept_backend", None)  # live connections to the workers stay with this object
        return state

    def __setstate__(self, state):
        state = dict(state)
        state["client"] = pickled_client.unpickled(state.get("client"))  # the same client in its own process
        if state.get("_sender", 0) is None:
            del state["_sender"]
        super().__setstate__(state)

    def __sklearn_clone__(self):
        """``sklearn.base.clone`` that shares the ``client`` instead of copying it.

        A Dask client is a live connection (it cannot be deep-copied), and the
        clones made by ``GridSearchCV`` should train on the same cluster.  A
        clone made in a joblib worker process keeps where its original came from.
        """
        params = self.get_params(deep=False)
        client = params.pop("client")
        new = type(self)(**{k: clone(v, safe=False) for k, v in params.items()})
        new.client = client
        if "_sender" in self.__dict__:
            new._sender = self._sender
        return new

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = str(self.device) != "cpu"
        return tags


class DaskClassifier(ClassifierPredictMixin, BaseDaskEstimator):
    """Classify with a PyTorch module trained on a Dask cluster.

    See :class:`BaseDaskEstimator` for the parameters.  Labels may be of any
    type (strings, ``{3, 7}``); ``classes_`` holds them sorted and the module
    outputs one score per class.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from adadamp import DaskClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> est = DaskClassifier(max_epochs=5, random_state=0).fit(X, y)  # doctest: +SKIP
    >>> est.score(X, y) > 0.9  # doctest: +SKIP
    True
    """

    def partial_fit(self, X, y=None, classes=None, sample_weight=None) -> DaskClassifier:
        """Train one epoch; ``classes`` fixes the labels on the first call.

        Parameters
        ----------
        X, y, sample_weight
            As for :meth:`fit`.
        classes : array-like, optional
            Every label the classifier will see.  Needed on the first call
            when its ``y`` may lack some labels (labels are fixed by the
            first call); ignored afterwards.

        Returns
        -------
        self

        Examples
        --------
        >>> est = DaskClassifier()
        >>> est.partial_fit(X[:500], y[:500], classes=np.arange(10))  # doctest: +SKIP
        >>> est.partial_fit(X[500:], y[500:])  # doctest: +SKIP
        """
        return self._fit(X, y, epochs=1, fresh=not is_fitted(self), classes=classes, keep=True,
                         sample_weight=sample_weight)

    def _targets(self, fresh: bool, classes=None) -> Labels:
        """The labels of this fit's ``y``: those of ``classes=`` or ``y``, or the fitted ones (warm)."""
        return Labels(type(self).__name__, None if fresh else self.classes_, classes)


class DaskRegressor(RegressorPredictMixin, BaseDaskEstimator):
    """Regress with a PyTorch module trained on a Dask cluster.

    See :class:`BaseDaskEstimator` for the parameters.  ``y`` may be 1-d (the
    module then outputs one column and ``predict`` returns 1-d) or 2-d.

    Examples
    --------
    >>> from sklearn.datasets import make_regression
    >>> from adadamp import DaskRegressor
    >>> X, y = make_regression(n_features=10, random_state=0)
    >>> est = DaskRegressor(optimizer__lr=0.01, random_state=0).fit(X, y)  # doctest: +SKIP
    """

    def _targets(self, fresh: bool, classes=None) -> Values:
        """The values of this fit's ``y``; a warm start keeps the fitted ``y``'s dimensions."""
        return Values(None if fresh else self._y_1d)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


# ------------------------------------------------------------------ helpers
#: The original adadamp's name of the base class (kept for its users; it is not fitted itself).
DaskBaseDamper = BaseDaskEstimator
