"""Plots of a fitted estimator's training history (matplotlib).

Each function takes a fitted :class:`~adadamp.DaskClassifier` /
:class:`~adadamp.DaskRegressor` (or its ``history_``) and draws one quantity
against ``x``:

* ``x="epoch"`` (or ``"epochs"``): one point per epoch (the epoch rows of
  ``history_``);
* ``x="update"`` (or ``"updates"``): one point per model update (the
  ``"updates"`` of each epoch row), numbered 1, 2, ...;
* ``x="time"``: the same points against training time in seconds: the
  previous epochs' ``dur`` plus the update times so far in this epoch, so the
  axis grows with every update.

Per update, the batch size and learning rate drawn are the schedule's: the
last batch of a data epoch holds the examples left (e.g. 3), fewer than the
schedule asked for, and is drawn at the size and learning rate of the update
before it (AdaScale and Goodput give a small batch a small step), rather than
as a dip every data epoch.
New figures use matplotlib's constrained layout, so that a plain
``fig.savefig`` keeps the axis labels inside the image.

:func:`plot_history` draws loss, batch size, learning rate and workers in
one figure; :func:`plot_loss`, :func:`plot_batch_size`, :func:`plot_lr` and
:func:`plot_n_workers` draw one of them into an ``Axes`` (new or given with
``ax=``), so several estimators can share a plot.

matplotlib is optional for adadamp; these functions raise an ``ImportError``
saying how to install it when it is missing (``pip install matplotlib`` or
``pip install "adadamp[plot]"``).  Figures are made with ``pyplot``, which
falls back to the non-interactive Agg backend where there is no display.

Examples
--------
>>> from adadamp import DaskClassifier, GeoDamp, plot  # doctest: +SKIP
>>> est = DaskClassifier(batch_size=GeoDamp(initial=32, delay=2, factor=2), max_epochs=6).fit(X, y)  # doctest: +SKIP
>>> fig = plot.plot_history(est, x="update")  # doctest: +SKIP
>>> fig.savefig("history.png")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_batch_size", "plot_history", "plot_loss", "plot_lr", "plot_n_workers", "series"]

XS = ("epoch", "update", "time")
#: The words ``x`` takes for each axis (the docs and notebooks write both the singular and the plural).
X_ALIASES = {"epoch": "epoch", "epochs": "epoch", "update": "update", "updates": "update", "time": "time"}
X_LABELS = {"epoch": "epoch", "update": "model update", "time": "training time (s)"}
# quantity -> (epoch-row key, per-update key, y label)
QUANTITIES = {
    "loss": ("train_loss", "loss", "loss"),
    "batch_size": ("batch_size", "batch_size", "batch size"),
    "lr": ("lr", "lr", "learning rate"),
    "n_workers": ("n_workers", "n_workers", "workers"),
}


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "adadamp.plot needs matplotlib, which is not installed: "
            "pip install matplotlib (or pip install 'adadamp[plot]')."
        ) from err
    return plt


def _history(estimator) -> list[dict]:
    """The epoch rows of a fitted estimator, or ``estimator`` itself if it is a history."""
    if isinstance(estimator, Sequence) and not isinstance(estimator, str):
        history = list(estimator)
        what = "The history"
    else:
        history = getattr(estimator, "history_", None)
        what = f"This {type(estimator).__name__}"
        if history is None:
            raise ValueError(f"{what} is not fitted yet (it has no history_): call fit before plotting.")
    if not history:
        raise ValueError(f"{what} has no epochs to plot (history_ is empty).")
    if not all(isinstance(row, dict) and "epoch" in row for row in history):
        raise ValueError("Expected a fitted estimator or its history_ (a list of epoch rows with an 'epoch' key).")
    return history


def _check_x(x: str) -> str:
    """The axis ``x`` names (:data:`X_ALIASES`); an unknown word is an error listing the accepted ones."""
    axis = X_ALIASES.get(x) if isinstance(x, str) else None
    if axis is None:
        raise ValueError(f"x must be one of {', '.join(map(repr, X_ALIASES))}; got {x!r}.")
    return axis


def _ragged(updates: Sequence[Sequence[dict]]) -> list[bool]:
    """Which updates are a ragged batch, from the update records of each epoch row.

    A batch never straddles two data epochs, so a data epoch's last batch holds the examples left,
    often fewer than the schedule asked for; drawn as they are, these batches look like the
    schedule dropping and coming back every data epoch.  Such a batch is smaller than the batch
    before it and ends its row, the history, or is followed by a larger batch: with AdaScale's
    clock an epoch row ends apart from the data epochs, so its ragged batches fall inside a row.

    Examples
    --------
    >>> _ragged([[{"batch_size": 32}, {"batch_size": 32}, {"batch_size": 3}],
    ...          [{"batch_size": 64}, {"batch_size": 5}, {"batch_size": 64}]])
    [False, False, True, False, True, False]
    """
    sizes = [u["batch_size"] for epoch in updates for u in epoch]
    row_ends = set(np.cumsum([len(epoch) for epoch in updates]) - 1)
    return [i > 0 and size < sizes[i - 1] and (i in row_ends or i + 1 == len(sizes) or sizes[i + 1] > size)
            for i, size in enumerate(sizes)]


def _scheduled(updates: Sequence[Sequence[dict]], key: str) -> list:
    """Each update's ``key`` as the schedule set it: a ragged last batch (:func:`_ragged`) takes the
    value of the update before it.

    Examples
    --------
    >>> _scheduled([[{"batch_size": 32, "lr": 0.2}, {"batch_size": 3, "lr": 0.02}]], "lr")
    [0.2, 0.2]
    """
    values: list = []
    for u, ragged in zip((u for epoch in updates for u in epoch), _ragged(updates), strict=True):
        values.append(values[-1] if ragged else u[key])
    return values


def _updates(history: list[dict]) -> list[list[dict]]:
    missing = [row["epoch"] for row in history if not row.get("updates")]
    if missing:
        raise ValueError(f"Epoch row(s) {missing[:5]} have no per-update records ('updates'); use x='epoch'.")
    return [row["updates"] for row in history]


def series(estimator, key: str, x: str = "epoch") -> tuple[np.ndarray, np.ndarray]:
    """The x and y data that the plots draw for one quantity.

    Parameters
    ----------
    estimator : fitted DaskClassifier or DaskRegressor, or list of dict
        The estimator, or its ``history_``.
    key : {"loss", "valid_loss", "batch_size", "lr", "n_workers"}
        ``"valid_loss"`` is recorded once per epoch (``validation_fraction``);
        with ``x="update"`` / ``"time"`` it sits at each epoch's last update.
        ``"batch_size"`` per update and ``"lr"`` are the schedule's: a data
        epoch's ragged last batch (the examples left) has the size and the
        learning rate of the update before it.
    x : {"epoch", "update", "time"}, default="epoch"
        Also ``"epochs"`` and ``"updates"``.

    Returns
    -------
    xs : ndarray
        The x data (float).
    ys : ndarray
        The y data (float), as long as ``xs``.

    Examples
    --------
    >>> history = [{"epoch": 1, "train_loss": 0.9, "batch_size": 32, "lr": 0.1, "n_workers": 2, "dur": 1.0,
    ...             "updates": [{"loss": 1.0, "batch_size": 32, "lr": 0.1, "n_workers": 2, "update_time": 0.4},
    ...                         {"loss": 0.8, "batch_size": 32, "lr": 0.1, "n_workers": 2, "update_time": 0.5}]}]
    >>> series(history, "loss", x="update")
    (array([1., 2.]), array([1. , 0.8]))
    >>> series(history, "loss", x="time")[0]
    array([0.4, 0.9])
    """
    x = _check_x(x)
    history = _history(estimator)
    if key == "valid_loss":
        rows = [row for row in history if "valid_loss" in row]
        if not rows:
            raise ValueError("The history has no 'valid_loss' (fit with validation_fraction to record it).")
        ys = [row["valid_loss"] for row in rows]
        if x == "epoch":
            xs = [row["epoch"] for row in rows]
        else:
            ends = dict(zip((row["epoch"] for row in history), _epoch_ends(history, x), strict=True))
            xs = [ends[row["epoch"]] for row in rows]
        return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if key not in QUANTITIES:
        raise ValueError(f"key must be one of {', '.join(map(repr, [*QUANTITIES, 'valid_loss']))}; got {key!r}.")
    epoch_key, update_key, _ = QUANTITIES[key]
    if x == "epoch":
        ys = [row[epoch_key] for row in history]
        if key == "lr" and all(row.get("updates") for row in history):  # the row's is its last update's
            ends = np.cumsum([len(row["updates"]) for row in history]) - 1
            ys = np.take(_scheduled(_updates(history), update_key), ends)
        return np.asarray([row["epoch"] for row in history], dtype=float), np.asarray(ys, dtype=float)
    per_epoch = _updates(history)
    if key in ("batch_size", "lr"):
        ys = _scheduled(per_epoch, update_key)
    else:
        ys = [u[update_key] for updates in per_epoch for u in updates]
    return _update_xs(history, per_epoch, x), np.asarray(ys, dtype=float)


def _update_xs(history: list[dict], per_epoch: list[list[dict]], x: str) -> np.ndarray:
    """x of every update: its number (1, 2, ...) or its end in training time."""
    if x == "update":
        return np.arange(1, sum(map(len, per_epoch)) + 1, dtype=float)
    starts = np.concatenate([[0.0], np.cumsum([row["dur"] for row in history])[:-1]])
    return np.concatenate(
        [start + np.cumsum([u["update_time"] for u in updates]) for start, updates in zip(starts, per_epoch, strict=True)]
    )


def _epoch_ends(history: list[dict], x: str) -> np.ndarray:
    """x of each epoch's end on the update or time axis."""
    if x == "update":
        return np.cumsum([len(updates) for updates in _updates(history)]).astype(float)
    return np.cumsum([row["dur"] for row in history]).astype(float)


def _draw(estimator, key: str, x: str, ax, label: str | None, **kwargs):
    """Draw one quantity into ``ax`` (a new Axes if None); returns the Axes."""
    x = _check_x(x)
    history = _history(estimator)
    if ax is None:  # constrained: a plain savefig keeps the labels in the image
        _, ax = _pyplot().subplots(layout="constrained")
    _, _, ylabel = QUANTITIES[key]
    style = {} if key == "loss" else {"drawstyle": "steps-post"}
    xs, ys = series(history, key, x)
    if key == "loss":
        train = "train" if label is None else f"{label} (train)"
        ax.plot(xs, ys, label=train, **{**style, **kwargs})
        if any("valid_loss" in row for row in history):
            vx, vy = series(history, "valid_loss", x)
            valid = "valid" if label is None else f"{label} (valid)"
            ax.plot(vx, vy, marker="o", linestyle="--", label=valid, **kwargs)
        ax.legend()
    else:
        ax.plot(xs, ys, label=label, **{**style, **kwargs})
        if label is not None:
            ax.legend()
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel(ylabel)
    return ax


_ONE_QUANTITY_DOC = """{summary}

    Parameters
    ----------
    estimator : fitted DaskClassifier or DaskRegressor, or list of dict
        The estimator, or its ``history_`` (also one read back from JSON).
    x : {{"epoch", "update", "time"}}, default="epoch"
        Per epoch, or per model update against the update number or the
        training time in seconds (``"epochs"`` and ``"updates"`` work too).
    ax : matplotlib Axes, optional
        Draw into this Axes; a new figure is made when None.
    label : str, optional
        Legend entry, to tell several estimators apart.
    **kwargs
        Passed to ``Axes.plot`` (``color``, ``alpha``, ...).

    Returns
    -------
    matplotlib.axes.Axes
        The Axes drawn into.

    Raises
    ------
    ValueError
        If the estimator is not fitted or ``x`` is unknown.

    Examples
    --------
    >>> from adadamp.plot import {name}
{examples}
    """


def _one_quantity(summary: str, examples: str):
    """Give a plotting function the shared docstring with its own summary and examples."""

    def document(func):
        lines = "\n".join(f"    >>> {line}  # doctest: +SKIP" for line in examples.strip().splitlines())
        func.__doc__ = _ONE_QUANTITY_DOC.format(summary=summary, name=func.__name__, examples=lines)
        return func

    return document


@_one_quantity(
    "Plot the training loss, and ``valid_loss`` when recorded.\n\n"
    "    Per epoch: ``train_loss``; per model update: each update's batch loss\n"
    "    (``valid_loss`` then sits at each epoch's last update).  With ``label``,\n"
    '    the legend says ``"<label> (train)"`` and ``"<label> (valid)"``.',
    """
est = DaskClassifier(max_epochs=3, validation_fraction=0.2).fit(X, y)
ax = plot_loss(est, x="update")
ax.figure.savefig("loss.png")
""",
)
def plot_loss(estimator, x: str = "epoch", *, ax: Axes | None = None, label: str | None = None, **kwargs: Any) -> Axes:
    return _draw(estimator, "loss", x, ax, label, **kwargs)


@_one_quantity(
    "Plot the batch size (per epoch: the epoch's largest; per update: the schedule's, each data\n"
    "    epoch's ragged last batch drawn at the size before it).",
    """
ax = plot_batch_size(constant, x="update", label="Constant")
plot_batch_size(geodamp, x="update", ax=ax, label="GeoDamp")
""",
)
def plot_batch_size(
    estimator, x: str = "epoch", *, ax: Axes | None = None, label: str | None = None, **kwargs: Any
) -> Axes:
    return _draw(estimator, "batch_size", x, ax, label, **kwargs)


@_one_quantity("Plot the schedule's learning rate (per epoch: the epoch's last; per update: each update's), each data\n"
               "    epoch's ragged last batch drawn at the rate before it.", 'ax = plot_lr(est, x="time")')
def plot_lr(estimator, x: str = "epoch", *, ax: Axes | None = None, label: str | None = None, **kwargs: Any) -> Axes:
    return _draw(estimator, "lr", x, ax, label, **kwargs)


@_one_quantity(
    "Plot the number of Dask workers that computed each epoch's last update (or each update).",
    'ax = plot_n_workers(est, x="update")',
)
def plot_n_workers(
    estimator, x: str = "epoch", *, ax: Axes | None = None, label: str | None = None, **kwargs: Any
) -> Axes:
    return _draw(estimator, "n_workers", x, ax, label, **kwargs)


def plot_history(
    estimator,
    x: str = "epoch",
    *,
    ax: Sequence[Axes] | None = None,
    label: str | None = None,
    keys: Sequence[str] = ("loss", "batch_size", "lr", "n_workers"),
    **kwargs: Any,
) -> Figure:
    """Plot loss, batch size, learning rate and workers, one panel each, sharing ``x``.

    Parameters
    ----------
    estimator : fitted DaskClassifier or DaskRegressor, or list of dict
        The estimator, or its ``history_`` (also one read back from JSON).
    x : {"epoch", "update", "time"}, default="epoch"
        Per epoch, or per model update against the update number or the
        training time in seconds (``"epochs"`` and ``"updates"`` work too).
    ax : sequence of matplotlib Axes, optional
        One Axes per entry of ``keys`` (e.g. ``fig.axes`` of an earlier call,
        to draw a second estimator into the same panels); a new figure with
        ``len(keys)`` stacked panels (constrained layout) is made when None.
    label : str, optional
        Legend entry, to tell several estimators apart.
    keys : sequence of str, default=("loss", "batch_size", "lr", "n_workers")
        The panels, from ``"loss"``, ``"batch_size"``, ``"lr"``, ``"n_workers"``.
    **kwargs
        Passed to ``Axes.plot``.

    Returns
    -------
    matplotlib.figure.Figure
        The figure of the panels (``fig.axes`` in the order of ``keys``).

    Raises
    ------
    ValueError
        If the estimator is not fitted, ``x`` or a key is unknown, or ``ax``
        does not hold one Axes per key.

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> from adadamp.dampers import GeoDamp
    >>> from adadamp.plot import plot_history
    >>> constant = DaskClassifier(batch_size=32, max_epochs=4).fit(X, y)  # doctest: +SKIP
    >>> geodamp = DaskClassifier(batch_size=GeoDamp(initial=32, delay=1), max_epochs=4).fit(X, y)  # doctest: +SKIP
    >>> fig = plot_history(constant, x="update", label="Constant")  # doctest: +SKIP
    >>> fig = plot_history(geodamp, x="update", ax=fig.axes, label="GeoDamp")  # doctest: +SKIP
    >>> fig.savefig("history.png")  # doctest: +SKIP
    """
    x = _check_x(x)
    history = _history(estimator)
    keys = list(keys)
    unknown = [k for k in keys if k not in QUANTITIES]
    if unknown or not keys:
        raise ValueError(f"keys must be a non-empty selection of {list(QUANTITIES)}; got {keys!r}.")
    if ax is None:
        # constrained layout: the default subplot margins cut the y labels off a plain fig.savefig
        fig, axes = _pyplot().subplots(len(keys), 1, sharex=True, figsize=(6.4, 1.9 * len(keys) + 0.6), squeeze=False,
                                       layout="constrained")
        axes = list(axes[:, 0])
    else:
        axes = list(np.ravel(ax))
        if len(axes) != len(keys):
            raise ValueError(f"ax must hold one Axes per key ({len(keys)}: {keys}); got {len(axes)}.")
        fig = axes[0].figure
    for key, axis in zip(keys, axes, strict=True):
        _draw(history, key, x, axis, label, **kwargs)
        if axis is not axes[-1]:
            axis.set_xlabel("")
    fig.align_ylabels(axes)
    return fig
