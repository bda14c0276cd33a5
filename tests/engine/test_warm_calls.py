"""Set-up at the speed of the hardware (issue 15, item 4): ``partial_fit`` on the same data resumes
the workers and data of the last call, and workers on the client's machine map the training data
instead of receiving it."""

import gc
import time

import dask
import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.engine import session
from adadamp.exceptions import ConvergenceError
from adadamp.worker import plugin as _worker


def _mapped_on_workers(client, ids) -> list[bool]:
    return [v for vs in client.run(lambda: [s.data.shared for f, s in _worker.TRAINER.fits.items() if f in ids]).values()
            for v in vs]


def _data(n=400, seed=0):
    X, y = make_classification(n_samples=n, n_features=8, n_informative=5, random_state=seed)
    return X.astype(np.float32), y


def _weights(est):
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def test_partial_fit_on_the_same_data_resumes_the_last_call(client, new_fits):
    X, y = _data()
    est = DaskClassifier(batch_size=32, random_state=0)
    est.partial_fit(X, y)
    first = new_fits()
    assert len(first) == 1 and all(_mapped_on_workers(client, first))  # kept, on the data mapped from the client
    est.partial_fit(X, y)
    est.partial_fit(X.copy(), y.copy())  # equal contents: the same data
    assert new_fits() == first  # nothing set up or placed again
    # the three warm calls train as one fit of three epochs
    once = DaskClassifier(batch_size=32, random_state=0, max_epochs=3).fit(X, y)
    np.testing.assert_allclose(_weights(est), _weights(once), rtol=0, atol=1e-6)
    assert new_fits() == first  # that fit kept nothing; this estimator's call is still kept

    X2, y2 = _data(seed=1)
    est.partial_fit(X2, y2)  # other data: the kept call is released, a new one set up
    second = new_fits()
    assert len(second) == 1 and second.isdisjoint(first)
    del est
    gc.collect()
    assert new_fits() == set()  # released with the estimator


def test_fit_keeps_nothing_and_a_kept_call_expires(client, new_fits, monkeypatch):
    X, y = _data()
    DaskClassifier(batch_size=32, random_state=0, max_epochs=1).fit(X, y)
    assert new_fits() == set()
    monkeypatch.setattr(session, "KEEP_SECONDS", 0.5)
    est = DaskClassifier(batch_size=32, random_state=0).partial_fit(X, y)
    assert len(new_fits()) == 1
    deadline = time.monotonic() + 10
    while new_fits() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert new_fits() == set()
    est.partial_fit(X, y)  # and the next call sets up again
    assert est.n_iter_ == 2


def test_a_failed_call_releases_the_kept_one(client, new_fits):
    X, y = _data()
    est = DaskClassifier(batch_size=32, random_state=0).partial_fit(X, y)
    before = _weights(est).copy()
    bad = X.copy()
    bad[3, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        est.partial_fit(bad, y)  # refused before any cluster work: the kept call stays
    np.testing.assert_array_equal(_weights(est), before)
    assert len(new_fits()) == 1
    est.set_params(optimizer__lr=1e12)
    with pytest.raises(ConvergenceError):
        est.partial_fit(X * 1e20, y)  # diverges: the call fails mid-training
    assert new_fits() == set()  # whatever it had is released


def _deleted_shared_mappings() -> int:
    """This process's mappings of adadamp shared-memory files that were already removed."""
    with open("/proc/self/maps") as maps:
        return sum("adadamp-" in line and "(deleted)" in line for line in maps)


def test_a_finished_fit_leaves_no_mapping_of_its_data_on_the_workers(client):
    """A fit's release drops its state on the workers at once: the mapping of the client's data (a
    whole copy of X in /dev/shm) went only at the workers' next full garbage collection, so
    consecutive fits piled up a copy each (183 MB per W1 fit) and page allocation slowed the next
    fits' set-up (0.2 s -> 0.4-0.8 s outside the updates in fits 8-10 of a series)."""
    X, y = _data(2000)
    client.run(gc.collect)  # what earlier tests' fits left for the collector is not this test's
    before = sum(client.run(_deleted_shared_mappings).values())
    client.run(gc.disable)  # as in a long fit, whose state reached the oldest generation: no collection soon
    try:
        with dask.config.set({"adadamp.shm-keep-data": 0}):  # removed, not kept: a mapping left shows "(deleted)"
            for seed in range(3):
                DaskClassifier(client=client, max_epochs=1, batch_size=64, random_state=seed).fit(X, y)
        deadline = time.monotonic() + 10
        while (left := sum(client.run(_deleted_shared_mappings).values()) - before) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        client.run(gc.enable)
    assert left <= 0, f"{left} mappings of these fits' shared memory are still open on the workers"
