"""Coming from the original adadamp (0.x): every old spelling gets an error naming the new one,
before any cluster work; the base class says which estimator to use; the ported examples run."""

import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from adadamp import DaskBaseDamper, DaskClassifier, DaskRegressor, porting
from adadamp.dampers import AdaDamp, BaseDamper, CntsDampLR, GeoDamp, GeoDampLR, PadaDamp, RadaDamp

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clf_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(96, 4)).astype(np.float32)
    return X, (X[:, 0] > 0).astype(int)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"loss": nn.CrossEntropyLoss}, r"`loss` is called `criterion` here \(as in skorch\); use criterion="),
        ({"loss__weight": None}, "`loss__weight` is called `criterion__weight`"),
        ({"max_batch_size": 1024}, "batch_size__max_batch_size"),
        ({"cluster": "tcp://x"}, r"client=Client\(cluster\)"),
        ({"metrics": ["acc"]}, "score"),
        ({"batch_size": GeoDamp, "batch_size__dampingdelay": 5}, "`dampingdelay` is called `delay`"),
        ({"batch_size": GeoDamp(), "batch_size__initial_batch_size": 8}, "`initial_batch_size` is called `initial`"),
        ({"batch_size": PadaDamp, "batch_size__growth_rate": 0.1}, "`growth_rate` is called `rate`"),
    ],
)
def test_old_estimator_spellings_name_the_new_one(clf_data, params, match, new_processes):
    X, y = clf_data
    with pytest.raises(ValueError, match=match):
        DaskClassifier(max_epochs=1, **params).fit(X, y)
    assert new_processes() == []  # before any cluster work


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: GeoDamp(dampingdelay=5), "`dampingdelay` is called `delay`"),
        (lambda: GeoDamp(dampingfactor=5), "`dampingfactor` is called `factor`"),
        (lambda: GeoDampLR(dampingfactor=5), "`dampingfactor` is called `factor`"),
        (lambda: PadaDamp(batch_growth_rate=0.1), "`batch_growth_rate` is called `rate`"),
        (lambda: CntsDampLR(dampingfactor=0.1), "`dampingfactor` is called `rate`"),
        (lambda: GeoDamp(initial_batch_size=4), "`initial_batch_size` is called `initial`"),
        (lambda: GeoDamp(dwell=20), "`dwell` has no equivalent"),
        (lambda: RadaDamp(reduction="min"), "`reduction` has no equivalent"),
        (lambda: AdaDamp(approx_loss=True), "`approx_loss` has no equivalent"),
        (lambda: PadaDamp(nn.Linear(2, 2), None, None), "schedules, not optimizers"),
        (lambda: PadaDamp(initial=4, loss=nn.functional.nll_loss), "schedules, not optimizers"),
    ],
)
def test_old_damper_spellings_name_the_new_one(make, match):
    with pytest.raises(TypeError, match=match):
        make()


def test_a_users_damper_may_use_the_old_names():
    class Seeded(BaseDamper):
        def __init__(self, initial=8, random_state=None):
            self.initial = initial
            self.random_state = random_state

        def next_batch_size(self, state):
            return self.initial

    assert Seeded(random_state=0).random_state == 0


def test_base_class_names_the_estimators():
    with pytest.raises(TypeError, match="use DaskClassifier for labels, DaskRegressor for real-valued"):
        DaskBaseDamper(module=nn.Linear, loss=nn.NLLLoss)
    assert DaskRegressor(max_epochs=2).max_epochs == 2  # the subclasses construct as before


def test_old_attributes_and_meta_keys_name_the_new_ones(client, clf_data):
    X, y = clf_data
    est = DaskClassifier(max_epochs=1, random_state=0).fit(X, y)
    for name, new in [("loss_", "criterion_"), ("initialized_", "history_"), ("n_workers_", "n_workers"),
                      ("batch_size_", "meta_"), ("initialize", "fit"), ("run_single_epoch", "partial_fit")]:
        with pytest.raises(AttributeError, match=new):
            getattr(est, name)
        assert not hasattr(est, name)
    with pytest.raises(AttributeError, match="no attribute 'anything_else'"):
        est.anything_else  # noqa: B018
    for key in porting.META_KEYS:
        with pytest.raises(KeyError, match=key):
            est.meta_[key]
    with pytest.raises(KeyError, match="n_samples_seen"):
        est.meta_["n_data"]
    assert est.meta_.get("n_data") is None and est.meta_["n_samples_seen"] == len(X)


def test_score_takes_a_dataset_as_the_original_did(client, clf_data):
    X, y = clf_data
    est = DaskClassifier(max_epochs=2, random_state=0).fit(X, y)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(y))
    assert est.score(dataset) == est.score(X, y)
    with pytest.raises(TypeError, match="loader.dataset"):
        est.score(torch.utils.data.DataLoader(dataset, batch_size=10))


def test_docs_page_lists_every_old_spelling():
    page = (ROOT / "docs" / "guide" / "porting.rst").read_text()
    tables = [porting.ESTIMATOR_PARAMS, porting.ESTIMATOR_ATTRIBUTES, porting.META_KEYS, porting.DAMPER_PARAMS]
    tables += list(porting.DAMPER_CLASS_PARAMS.values())
    missing = [name for table in tables for name in table if name not in page]
    assert not missing, f"old spellings missing from docs/guide/porting.rst: {missing}"


@pytest.mark.parametrize(("name", "least_accuracy"), [("porting_basic_usage", 0.8), ("porting_mnist_dask", 0.7)])
def test_ported_examples_run(client, name, least_accuracy, monkeypatch):
    examples = ROOT / "docs" / "examples"
    monkeypatch.syspath_prepend(str(examples))
    module = runpy.run_path(str(examples / f"{name}.py"), run_name="example")
    assert module["main"]() >= least_accuracy
    sys.modules.pop("porting_basic_usage", None)
