"""Time-to-accuracy tasks on emulated devices, and the measurement of a fit's time to a target.

Shared by the time-to-accuracy benchmarks of issue 32 (``benchmarks/time_to_accuracy/``: the
paper's Table 1 measured; the ``Goodput`` damper's comparison).  A :class:`Task` is deterministic
synthetic data split into train and test, a module wrapped in :class:`benchmarks.common.emulated.Emulated`
(each training forward on a worker sleeps a fixed time plus a time per example, so that the time
of an update falls as the workers grow with the batch), SGD settings, a target test accuracy and
an epoch budget.  :func:`measure` fits an estimator to the target and returns a :class:`Run`: the
time to the target, where it was reached and the test-accuracy curve against wall-clock time.

Time to target: wall-clock seconds from the ``fit`` call to the end of the first epoch whose test
accuracy reaches the target, less the seconds spent evaluating (on the client, in eval mode, where
the emulated device does not sleep).  The accuracy is evaluated at every epoch's end, where both
backends hold the model on the client.

Examples
--------
>>> from benchmarks.common.accuracy_tasks import TASKS, estimator, measure  # doctest: +SKIP
>>> task = TASKS["blobs4"]                                           # doctest: +SKIP
>>> run = measure(task, estimator(task, batch_size=32, max_workers=1))  # doctest: +SKIP
>>> run.time_to_target, run.epoch_at_target                         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np
import torch
from sklearn.datasets import make_classification
from torch import nn

from adadamp import DaskClassifier
from adadamp.callbacks import Callback
from adadamp.exceptions import StopTraining
from adadamp.modules import MLP

from .emulated import FIXED_S, PER_EXAMPLE_S, Emulated


class SmallCNN(nn.Module):
    """conv3x3(8)-pool-conv3x3(16)-pool-linear, for ``(n, 1, 16, 16)`` images."""

    def __init__(self, n_outputs: int = 4):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, n_outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclasses.dataclass(frozen=True)
class Task:
    """One time-to-accuracy task: data, model, optimizer, target and budget.

    Attributes
    ----------
    name : str
    data : callable
        ``data() -> (X_train, y_train, X_test, y_test)``, deterministic (cached).
    module : type of nn.Module
        The real model (wrapped in :class:`~benchmarks.common.emulated.Emulated`), built with ``module_params``.
    lr, momentum : float
        SGD's learning rate and momentum (the base learning rate the dampers scale).
    target : float
        Test accuracy to reach.
    max_epochs : int
        Epoch budget of a run (the target is usually reached before).
    base_batch : int
        The batch of the constant-batch run on one worker (Table 1's 128 row, scaled).
    fixed, per_example : float
        The emulated device: seconds per training forward and per example.
    about : str
        What the task is, for the reports.
    """

    name: str
    data: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    module: type[nn.Module]
    module_params: dict
    lr: float
    momentum: float
    target: float
    max_epochs: int
    base_batch: int = 32
    fixed: float = FIXED_S
    per_example: float = PER_EXAMPLE_S
    about: str = ""

    @property
    def n_train(self) -> int:
        return len(self.data()[0])


@functools.cache
def blobs(n_classes: int = 4, n_features: int = 32, n_informative: int = 16, flip_y: float = 0.0,
          n_train: int = 30_000, n_test: int = 10_000):
    """``make_classification``: 2 Gaussian clusters per class on the vertices of a hypercube,
    ``n_informative`` informative features of ``n_features`` (the rest noise), seed 0."""
    X, y = make_classification(
        n_samples=n_train + n_test, n_features=n_features, n_informative=n_informative, n_redundant=0,
        n_classes=n_classes, n_clusters_per_class=2, class_sep=1.0, flip_y=flip_y, random_state=0,
    )
    X = X.astype(np.float32)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


@functools.cache
def templates(n_classes: int = 4, n_train: int = 30_000, n_test: int = 10_000, strength: float = 0.15):
    """16x16 images: a class template (4x4 noise blown up to 4x4 blocks) times ``strength`` plus
    N(0, 1) pixel noise, seed 0 (a CNN sees the blocks through its pooling)."""
    rng = np.random.default_rng(0)
    coarse = rng.standard_normal((n_classes, 1, 4, 4)).astype(np.float32)
    tmpl = np.kron(coarse, np.ones((1, 1, 4, 4), np.float32))
    n = n_train + n_test
    y = rng.integers(0, n_classes, n)
    X = rng.standard_normal((n, 1, 16, 16), dtype=np.float32) + strength * tmpl[y]
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        # The Table 1 task: a learning-rate decay (or a batch growth) by 2 every 3 epochs takes the test
        # accuracy from ~0.92 (the noise floor of lr 0.05 at batch 32) to ~0.984; plain PyTorch reaches
        # 0.98 in the first epoch after the second decay, at batch 32 (lr decay) and 64 -> 256 (GeoDamp).
        Task(
            "blobs4", functools.partial(blobs, 4, 32, 16), MLP,
            {"n_features": 32, "n_outputs": 4, "hidden": (128, 128)}, lr=0.05, momentum=0.9, target=0.98,
            max_epochs=12,
            about="4 classes x 2 Gaussian clusters, 32 features (16 informative), 30k train / 10k test; MLP 32-128-128-4",
        ),
        # Label noise (10 % random labels) on 10 classes: the gradient noise stays large, so a large
        # batch buys little statistical progress per example (small batches are efficient).
        Task(
            "noisy10", functools.partial(blobs, 10, 64, 24, 0.1), MLP,
            {"n_features": 64, "n_outputs": 10, "hidden": (256,)}, lr=0.02, momentum=0.9, target=0.765,
            max_epochs=12,
            about="10 classes x 2 clusters, 64 features (24 informative), 10 % labels random, 30k / 10k; MLP 64-256-10",
        ),
        # Images through a small CNN: a smooth, low-noise task where large batches lose little.
        Task(
            "images4", templates, SmallCNN, {"n_outputs": 4}, lr=0.05, momentum=0.9, target=0.83, max_epochs=12,
            about="16x16 images, 4 class templates (4x4 blocks) x 0.15 + N(0, 1) noise, 30k / 10k; CNN conv8-conv16-linear",
        ),
    )
}


def estimator(task: Task, *, speeds: str | None = None, **params) -> DaskClassifier:
    """A :class:`~adadamp.DaskClassifier` of ``task`` on emulated devices; ``params`` are the
    estimator's (``batch_size``, ``grads_per_worker``, ``max_workers``, ``client``, ``backend``...),
    overriding the task's defaults (SGD at ``task.lr`` with ``task.momentum``, ``max_epochs``,
    ``random_state=0``).  ``speeds``: :class:`~benchmarks.common.emulated.Emulated`'s speeds file."""
    module_params = {f"module__{k}": v for k, v in task.module_params.items()}
    defaults = dict(
        module=Emulated, module__inner=task.module, module__fixed=task.fixed, module__per_example=task.per_example,
        module__speeds=speeds, **module_params,
        optimizer=torch.optim.SGD, optimizer__lr=task.lr, optimizer__momentum=task.momentum,
        max_epochs=task.max_epochs, random_state=0,
    )
    return DaskClassifier(**{**defaults, **params})


class TimeToTarget(Callback):
    """Evaluate the test accuracy at every epoch's end; stop the fit when it reaches ``target``
    (``stop=True``).  ``curve`` holds one point per epoch: seconds since ``start`` (a
    ``time.perf_counter`` reading; None: the first epoch's beginning) less the seconds spent
    evaluating, epochs, updates and accuracy.  ``hit`` is the first point at the target or None."""

    def __init__(self, X_test=None, y_test=None, target: float = 1.0, stop: bool = True, start: float | None = None):
        self.X_test = X_test
        self.y_test = y_test
        self.target = target
        self.stop = stop
        self.start = start

    def on_train_begin(self, estimator, **info) -> None:
        self.curve_: list[dict] = []
        self.hit_: dict | None = None
        self._evaluating = 0.0
        if self.start is None:
            self.start = time.perf_counter()

    def on_epoch_end(self, estimator, row=None, module=None, loop=None, **info) -> None:
        t = time.perf_counter()
        acc = accuracy(module, self.X_test, self.y_test, estimator)
        point = {"time": t - self.start - self._evaluating, "epoch": float(loop.epoch), "updates": int(loop.n_updates),
                 "accuracy": acc, "batch_size": int(row["batch_size"]), "n_workers": int(row["n_workers"])}
        self.curve_.append(point)
        self._evaluating += time.perf_counter() - t
        if self.hit_ is None and acc >= self.target:
            self.hit_ = point
            if self.stop:
                raise StopTraining(f"test accuracy {acc:.4f} >= {self.target} after {point['time']:.1f} s")


def accuracy(module: nn.Module, X: np.ndarray, y: np.ndarray, estimator=None) -> float:
    """Fraction of ``X`` classified as ``y`` by ``module`` (eval mode, no gradients, on the client);
    ``estimator``'s ``classes_`` decode the outputs when it has them."""
    was_training = module.training
    module.eval()
    with torch.no_grad():
        pred = torch.cat([module(torch.from_numpy(X[i : i + 8192])).argmax(1) for i in range(0, len(X), 8192)]).numpy()
    module.train(was_training)
    classes = getattr(estimator, "classes_", None)
    if classes is not None:
        pred = np.asarray(classes)[pred]
    return float(np.mean(pred == y))


@dataclasses.dataclass
class Run:
    """One fit to a target: its time to the target and what it trained."""

    name: str
    time_to_target: float | None  #: seconds from the fit call (evaluation excluded); None: not reached
    epoch_at_target: float | None
    updates_at_target: int | None
    final_accuracy: float
    wall: float  #: the whole fit call, evaluation included
    setup: float  #: outside the epochs and the evaluations: set-up, data placement, release
    curve: list[dict]
    history: list[dict]
    estimator: DaskClassifier

    def summary(self) -> dict:
        """The run without the estimator and the per-update history (JSON-ready)."""
        out = dataclasses.asdict(dataclasses.replace(self, estimator=None, history=[]))
        out.pop("estimator"), out.pop("history")
        out["workers"] = sorted({u["n_workers"] for row in self.history for u in row["updates"]})
        out["batch_sizes"] = sorted({row["batch_size"] for row in self.history})
        return out


def measure(task: Task, est: DaskClassifier, name: str = "", *, stop: bool = True) -> Run:
    """Fit ``est`` on ``task``'s training data, evaluating the test accuracy at every epoch's end,
    until the target (``stop``) or ``max_epochs``; returns the :class:`Run`."""
    X, y, X_test, y_test = task.data()
    callbacks = [c for c in (est.get_params()["callbacks"] or []) if not (isinstance(c, tuple) and c[0] == "time_to_target")]
    start = time.perf_counter()
    est.set_params(callbacks=[*callbacks, ("time_to_target", TimeToTarget(X_test, y_test, task.target, stop, start))])
    est.fit(X, y)
    wall = time.perf_counter() - start
    watch = dict(est.callbacks_)["time_to_target"]
    hit = watch.hit_
    epochs = sum(row["dur"] for row in est.history_)
    return Run(
        name=name or task.name,
        time_to_target=None if hit is None else hit["time"],
        epoch_at_target=None if hit is None else hit["epoch"],
        updates_at_target=None if hit is None else hit["updates"],
        final_accuracy=watch.curve_[-1]["accuracy"] if watch.curve_ else float("nan"),
        wall=wall,
        setup=max(0.0, wall - epochs - watch._evaluating),
        curve=watch.curve_,
        history=est.history_,
        estimator=est,
    )
