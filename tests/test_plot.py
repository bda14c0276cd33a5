"""adadamp.plot on real fits (the shared LocalCluster): panels, lines, x data, errors."""

import numpy as np
import pytest
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.dampers import AdaScale, GeoDamp

matplotlib = pytest.importorskip("matplotlib", reason="adadamp.plot needs the plot extra: pip install -e .[plot]")
matplotlib.use("Agg")

import matplotlib.pyplot as plt

from adadamp import plot


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def fitted(session_client):
    """GeoDamp doubles the batch each epoch (16, 32, 64) with a validation split."""
    X, y = make_classification(n_samples=200, n_features=6, n_informative=4, random_state=0)
    est = DaskClassifier(
        batch_size=GeoDamp(initial=16, delay=1, factor=2),
        validation_fraction=0.2,
        max_epochs=3,
        random_state=0,
        client=session_client,
    )
    return est.fit(X, y)


def updates(est, key):
    return [u[key] for row in est.history_ for u in row["updates"]]


def schedule(est):
    """Each update's batch size as GeoDamp set it: its epoch's first (the last one's may be ragged)."""
    return [row["updates"][0]["batch_size"] for row in est.history_ for _ in row["updates"]]


def test_history_figure_has_one_panel_per_quantity(fitted):
    fig = plot.plot_history(fitted)
    assert len(fig.axes) == 4
    loss, batch, lr, workers = fig.axes
    assert [line.get_label() for line in loss.get_lines()] == ["train", "valid"]
    assert len(batch.get_lines()) == len(lr.get_lines()) == len(workers.get_lines()) == 1
    epochs = [row["epoch"] for row in fitted.history_]
    for ax in fig.axes:
        np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), epochs)
    np.testing.assert_allclose(loss.get_lines()[0].get_ydata(), [r["train_loss"] for r in fitted.history_])
    np.testing.assert_allclose(loss.get_lines()[1].get_ydata(), [r["valid_loss"] for r in fitted.history_])
    np.testing.assert_array_equal(batch.get_lines()[0].get_ydata(), [16, 32, 64])
    assert workers.get_ylabel() == "workers" and workers.get_xlabel() == "epoch"


def test_update_axis_numbers_every_update(fitted):
    fig = plot.plot_history(fitted, x="update", keys=("loss", "batch_size"))
    loss, batch = fig.axes
    n = fitted.history_[-1]["n_updates"]
    train, valid = loss.get_lines()
    np.testing.assert_array_equal(train.get_xdata(), np.arange(1, n + 1))
    np.testing.assert_allclose(train.get_ydata(), updates(fitted, "loss"))
    np.testing.assert_array_equal(valid.get_xdata(), [row["n_updates"] for row in fitted.history_])
    assert updates(fitted, "batch_size")[-3:] == [64, 64, 32]  # 160 examples: the last batch is ragged
    np.testing.assert_array_equal(batch.get_lines()[0].get_ydata(), schedule(fitted))
    assert batch.get_xlabel() == "model update"


def test_time_axis_is_monotone_and_ends_with_the_training_time(fitted):
    ax = plot.plot_lr(fitted, x="time")
    xs = ax.get_lines()[0].get_xdata()
    assert len(xs) == fitted.history_[-1]["n_updates"]
    assert np.all(np.diff(xs) > 0) and xs[0] > 0
    assert xs[-1] <= sum(row["dur"] for row in fitted.history_) + 1e-9
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), updates(fitted, "lr"))
    assert ax.get_xlabel() == "training time (s)"


def test_two_estimators_share_axes(fitted):
    other = plot.plot_history(fitted.history_, x="update", label="GeoDamp")  # the history works as well
    fig = plot.plot_history(fitted, x="update", ax=other.axes, label="again")
    assert fig is other
    assert [line.get_label() for line in fig.axes[1].get_lines()] == ["GeoDamp", "again"]
    assert len(fig.axes[0].get_lines()) == 4  # train and valid of each
    ax = plot.plot_n_workers(fitted, x="update", ax=fig.axes[3], color="red")
    assert ax is fig.axes[3] and len(ax.get_lines()) == 3
    np.testing.assert_array_equal(ax.get_lines()[-1].get_ydata(), updates(fitted, "n_workers"))
    assert ax.get_lines()[-1].get_color() == "red"


def test_plot_loss_without_validation(session_client):
    X, y = make_classification(n_samples=80, n_features=4, random_state=0)
    est = DaskClassifier(max_epochs=2, random_state=0, client=session_client).fit(X, y)
    ax = plot.plot_loss(est)
    assert [line.get_label() for line in ax.get_lines()] == ["train"]
    np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), [1, 2])


def test_errors(fitted):
    with pytest.raises(ValueError, match="not fitted"):
        plot.plot_history(DaskClassifier())
    with pytest.raises(ValueError, match="not fitted"):
        plot.plot_loss(DaskClassifier())
    with pytest.raises(ValueError, match="x must be one of 'epoch', 'epochs', 'update', 'updates', 'time'; got 'step'"):
        plot.plot_history(fitted, x="step")
    with pytest.raises(ValueError, match="x must be one of"):
        plot.plot_batch_size(fitted, x="Update")
    with pytest.raises(ValueError, match="no epochs"):
        plot.plot_lr([])
    with pytest.raises(ValueError, match="keys must be"):
        plot.plot_history(fitted, keys=("accuracy",))
    with pytest.raises(ValueError, match="one Axes per key"):
        plot.plot_history(fitted, ax=plt.subplots(2)[1])
    trimmed = [{k: v for k, v in row.items() if k != "updates"} for row in fitted.history_]
    assert len(plot.plot_history(trimmed).axes) == 4
    with pytest.raises(ValueError, match="use x='epoch'"):
        plot.plot_history(trimmed, x="update")


def test_missing_matplotlib_says_how_to_install(fitted, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        plot.plot_loss(fitted)


def _ragged_history(sizes=(32, 32, 3), epochs=3) -> list[dict]:
    """A constant batch of 32 on 67 examples: every epoch ends with the 3 examples left."""
    return [{"epoch": e, "train_loss": 1.0 / e, "batch_size": max(sizes), "lr": 0.1, "n_workers": 2, "dur": 1.0,
             "updates": [{"loss": 1.0 / e, "batch_size": b, "lr": 0.1, "n_workers": 2, "update_time": 0.3}
                         for b in sizes]} for e in range(1, epochs + 1)]


@pytest.mark.parametrize("x", ["update", "time"])
def test_the_ragged_last_batch_of_an_epoch_is_no_dip(x):
    """Issue 54, item 5: each epoch's last batch holds the examples left (3); drawn as it is, the
    constant schedule dipped to 3 at every epoch's end.  The line is the schedule's size."""
    fig = plot.plot_history(_ragged_history(), x=x, keys=("batch_size",))
    np.testing.assert_array_equal(fig.axes[0].get_lines()[0].get_ydata(), [32] * 9)
    np.testing.assert_array_equal(plot.series(_ragged_history(), "batch_size", x=x)[1], [32] * 9)
    growing = _ragged_history(sizes=(16, 48, 3))  # a schedule that grows within the epoch
    np.testing.assert_array_equal(plot.series(growing, "batch_size", x=x)[1], [16, 48, 48] * 3)
    assert plot.plot_batch_size(_ragged_history(), x="epoch").get_lines()[0].get_ydata().tolist() == [32] * 3


def test_a_default_savefig_keeps_the_labels_inside_the_image(fitted, tmp_path):
    """Issue 54, item 5: ``fig.savefig`` without ``bbox_inches`` cut the y labels off (they started
    left of the image); the figure lays itself out (constrained layout)."""
    from PIL import Image

    for x in ("epoch", "update", "time"):
        fig = plot.plot_history(fitted, x=x)
        path = tmp_path / f"history-{x}.png"
        fig.savefig(path)  # matplotlib's defaults: the figure's size, no tight bounding box
        with Image.open(path) as png:
            assert png.size == (round(fig.bbox.width), round(fig.bbox.height))
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:  # its y label, and all it draws (tick labels, x label, legend)
            for box in (ax.yaxis.label.get_window_extent(renderer), ax.get_tightbbox(renderer)):
                assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height, (
                    x, ax.get_ylabel(), box)
    ax = plot.plot_lr(fitted, x="time")  # a new one-panel figure lays itself out too
    ax.figure.savefig(tmp_path / "lr.png")
    assert ax.yaxis.label.get_window_extent(ax.figure.canvas.get_renderer()).x0 >= 0


def test_x_takes_the_words_the_docs_use(fitted):
    """Issue 54, item 5: ``x="updates"`` was refused; the plural of each axis works as the singular."""
    for plural, singular in (("updates", "update"), ("epochs", "epoch")):
        a, b = plot.plot_history(fitted, x=plural), plot.plot_history(fitted, x=singular)
        for ax_a, ax_b in zip(a.axes, b.axes, strict=True):
            np.testing.assert_array_equal(ax_a.get_lines()[0].get_xdata(), ax_b.get_lines()[0].get_xdata())
        assert a.axes[-1].get_xlabel() == b.axes[-1].get_xlabel()
        np.testing.assert_array_equal(plot.series(fitted, "loss", x=plural)[0], plot.series(fitted, "loss", x=singular)[0])
    assert plot.plot_batch_size(fitted, x="updates").get_xlabel() == "model update"


@pytest.fixture(scope="module")
def adascaled(session_client):
    """AdaScale over GeoDamp (16, 32, 64): its epochs run on the scale-invariant clock, ahead of the data."""
    import torch

    X, y = make_classification(n_samples=300, n_features=6, n_informative=4, random_state=0)
    est = DaskClassifier(batch_size=AdaScale(batch_size=GeoDamp(initial=16, delay=1, factor=2)),
                         optimizer=torch.optim.SGD, optimizer__lr=0.05, max_epochs=3, random_state=0, client=session_client)
    return est.fit(X, y)


def _dips(values) -> list[int]:
    """The updates drawn below both neighbours (or, the last, below the one before it)."""
    v = list(values)
    return [i for i in range(1, len(v)) if v[i] < v[i - 1] and (i + 1 == len(v) or v[i + 1] > v[i])]


def test_an_adascale_fits_ragged_batches_draw_no_dip(adascaled):
    """Issue 54, item 5: with AdaScale a data epoch ends inside an epoch row (its epochs are scale-invariant),
    and its ragged last batch, with the small step AdaScale gives it, drew a dip in the batch size and the
    learning rate at every data epoch; per epoch, a row that ended with one drew its small step."""
    sizes, lrs = updates(adascaled, "batch_size"), updates(adascaled, "lr")
    row_ends = np.cumsum([len(row["updates"]) for row in adascaled.history_]) - 1
    inside = [i for i in _dips(sizes) if i not in row_ends]
    assert inside and all(lrs[i] < lrs[i - 1] for i in inside), sizes  # what the fit must hold for the test to mean anything
    batch, lr = plot.plot_history(adascaled, x="update", keys=("batch_size", "lr")).axes
    assert _dips(batch.get_lines()[0].get_ydata()) == []
    drawn = lr.get_lines()[0].get_ydata()  # AdaScale's gain moves its rate every update: only the ragged ones are held
    assert all(drawn[i] == drawn[i - 1] for i in inside)

    first = adascaled.history_[0]["updates"]
    assert first[-1]["batch_size"] < first[-2]["batch_size"] and first[-1]["lr"] < first[-2]["lr"]  # a ragged row end
    assert adascaled.history_[0]["lr"] == first[-1]["lr"]
    assert plot.plot_lr(adascaled).get_lines()[0].get_ydata()[0] == first[-2]["lr"]
