"""A fit's checkpoints cost the same at any length: the finished epochs' rows are appended to a
journal beside the file (``<checkpoint>.history``), which a resumed fit reads once and which is
refused when it is not the rows the checkpoint names (docs/guide/checkpoints.rst)."""

import os
import re

import numpy as np
import pytest
import torch

from adadamp import DaskRegressor, checkpoint
from adadamp.callbacks import Callback


class Crash(Callback):
    """Interrupts the fit after update ``at``, as a crash or preemption would."""

    def __init__(self, at=None):
        self.at = at

    def on_update_end(self, estimator, loop=None, **info):
        if loop.n_updates == self.at:
            raise RuntimeError("crashed")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype("float32")
    return X, X @ np.arange(1, 5, dtype="float32")


PARAMS = {"module__hidden": (8,), "batch_size": 16, "random_state": 3, "optimizer": torch.optim.SGD,
          "optimizer__lr": 0.01}


def test_a_checkpoint_write_costs_the_same_at_any_length(client, data, tmp_path):
    """Every write held the whole history: with ``checkpoint_every=20`` on a 150-epoch fit the epoch
    time grew from 0.76 s to 8.75 s by epoch 26.  The file a 100-epoch fit leaves is now the size of a
    10-epoch fit's, while the journal holds a row an epoch (what a write costs in time:
    ``benchmarks/checkpoints/``)."""
    sizes = {}
    for epochs in (10, 100):
        path = tmp_path / f"fit-{epochs}.ckpt"
        DaskRegressor(max_epochs=epochs, checkpoint=path, checkpoint_every=2, **PARAMS).fit(*data)
        sizes[epochs] = path.stat().st_size
        rows = checkpoint.journal.journal_path(path).read_bytes().splitlines()
        assert len(rows) == epochs and len(checkpoint.load(path)["history"]) == epochs
    assert abs(sizes[100] - sizes[10]) < 64, sizes  # digits of the row count, nothing more


def _rows(est) -> list:
    return [(r["epoch"], r["n_updates"], r["train_loss"], [u["loss"] for u in r["updates"]]) for r in est.history_]


def test_a_resumed_fit_has_the_whole_history(client, data, tmp_path):
    whole = DaskRegressor(max_epochs=6, **PARAMS).fit(*data)
    path = tmp_path / "fit.ckpt"
    with pytest.raises(RuntimeError, match="crashed"):
        DaskRegressor(max_epochs=6, checkpoint=path, checkpoint_every=3, callbacks=[("crash", Crash(11))],
                      **PARAMS).fit(*data)
    resumed = DaskRegressor(max_epochs=6, checkpoint=path, **PARAMS).fit(*data)
    assert _rows(resumed) == _rows(whole)
    np.testing.assert_array_equal(resumed.predict(data[0]), whole.predict(data[0]))


@pytest.fixture
def written(client, data, tmp_path):
    path = tmp_path / "fit.ckpt"
    DaskRegressor(max_epochs=3, checkpoint=path, **PARAMS).fit(*data)
    return path


def test_a_journal_that_is_not_the_checkpoints_rows_is_refused(written):
    journal = checkpoint.journal.journal_path(written)
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0].replace(b'"epoch": 1', b'"epoch": 7') + b"".join(lines[1:]))
    with pytest.raises(checkpoint.CorruptCheckpointError, match=f"{re.escape(str(written))}.*does not hold the 3 rows"):
        checkpoint.load(written)
    journal.write_bytes(b"".join(lines[:2]))  # one row short
    with pytest.raises(checkpoint.CorruptCheckpointError, match="does not hold the 3 rows"):
        checkpoint.load(written)
    journal.unlink()
    with pytest.raises(checkpoint.CorruptCheckpointError, match="is missing"):
        checkpoint.load(written)


def test_a_journal_others_could_write_is_refused(written):
    journal = checkpoint.journal.journal_path(written)
    os.chmod(journal, 0o664)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="chmod go-w"):
        checkpoint.load(written)
