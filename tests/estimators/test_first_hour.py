"""What a new user meets first, on the README's install (issue 35): inputs that work without the
optional extras, errors that name the user's parameter, seeding as in PyTorch."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

BLOCK_DATAFRAME_STACK = textwrap.dedent(
    """
    import importlib.abc
    import importlib.machinery
    import sys

    class _Missing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        # as on the README's install: dask[array] brings neither pandas nor pyarrow
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pandas", "pyarrow"):
                return importlib.machinery.ModuleSpec(name, self)
            return None

        def create_module(self, spec):
            raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)

        def exec_module(self, module):  # never reached: create_module raised
            raise ModuleNotFoundError(f"No module named {module.__name__!r}", name=module.__name__)

    sys.meta_path.insert(0, _Missing())
    """
)


def test_a_dask_array_fits_without_pandas_or_pyarrow(tmp_path):
    """A dask array fits, predicts and scores where pandas and pyarrow cannot be imported, on the
    client and on the workers (the blocker is a sitecustomize every process of the run loads)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_DATAFRAME_STACK)
    script = tmp_path / "fit_dask_array.py"
    script.write_text(textwrap.dedent(
        """
        import dask.array as da
        import numpy as np
        from distributed import Client, LocalCluster

        from adadamp import DaskRegressor

        if __name__ == "__main__":
            rng = np.random.default_rng(0)
            X = rng.normal(size=(200, 4)).astype("float32")
            y = X @ np.arange(4.0).astype("float32")
            with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \\
                    Client(cluster):
                est = DaskRegressor(max_epochs=2, random_state=0, batch_size=32)
                est.fit(da.from_array(X, chunks=50), da.from_array(y, chunks=50))
                predicted = est.predict(da.from_array(X, chunks=50)).compute()
                score = est.score(da.from_array(X, chunks=50), da.from_array(y, chunks=50))
                import sys
                assert "pandas" not in sys.modules
                print("FITTED", predicted.shape, np.isfinite(score))
        """
    ))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, env=env,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FITTED (200,) True" in out.stdout


def _weights(est) -> np.ndarray:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


def test_torch_manual_seed_makes_unseeded_fits_reproducible(client, regression_data):
    """random_state=None draws the fit's seed from torch's global generator, as PyTorch and skorch
    users expect: the same torch.manual_seed gives the same weights, another seed others."""
    import torch

    from adadamp import DaskRegressor

    X, y = regression_data

    def fit(seed: int | None) -> np.ndarray:
        if seed is not None:
            torch.manual_seed(seed)
        return _weights(DaskRegressor(max_epochs=1, batch_size=64).fit(X, y))

    first, again, other = fit(0), fit(0), fit(1)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
    assert not np.allclose(first, fit(None))  # the generator moved on: a new draw


class _NoCluster:
    """A client that fails any use: the errors must come before the cluster is touched."""

    status = "running"

    def __getattr__(self, name):
        raise AssertionError(f"the cluster was used ({name}) before the parameters were checked")


def _small():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 4)).astype(np.float32)
    return X, (X[:, 0] > 0).astype(np.int64)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"optimizer__lr": -0.1}, r"optimizer__lr=-0.1: Adam refused it: Invalid learning rate"),
        ({"optimizer": "SGD", "optimizer__momentum": -1.0}, r"optimizer__momentum=-1.0: SGD refused it"),
        ({"optimizer": "LBFGS"}, r"optimizer=LBFGS needs a closure in step\(\)"),
    ],
)
def test_optimizer_errors_name_the_users_parameter_before_any_cluster_work(params, match):
    import torch

    from adadamp import DaskClassifier

    if isinstance(params.get("optimizer"), str):
        params = {**params, "optimizer": getattr(torch.optim, params["optimizer"])}
    X, y = _small()
    with pytest.raises(ValueError, match=match):
        DaskClassifier(client=_NoCluster(), **params).fit(X, y)


def test_a_closed_client_is_named():
    from distributed import Client, LocalCluster

    from adadamp import DaskClassifier

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        client = Client(cluster, set_as_default=False)
        client.close()
        X, y = _small()
        with pytest.raises(ValueError, match=r"client= is closed \(status 'closed'\)"):
            DaskClassifier(client=client).fit(X, y)


def test_a_single_class_is_refused_and_new_labels_name_classes(client):
    from adadamp import DaskClassifier

    X, y = _small()
    with pytest.raises(ValueError, match="needs at least 2 classes; y has only one class, 1"):
        DaskClassifier(client=_NoCluster()).fit(X, np.ones_like(y))
    est = DaskClassifier(max_epochs=1, random_state=0).partial_fit(X, y)
    with pytest.raises(ValueError, match=r"does not know: \[2\].*pass every label as classes= to the first partial_fit"):
        est.partial_fit(X, np.where(y == 1, 2, y))
    # the documented way: every label on the first call, even if its y has one class
    est = DaskClassifier(max_epochs=1, random_state=0).partial_fit(X, np.zeros_like(y), classes=[0, 1, 2])
    est.partial_fit(X, np.where(y == 1, 2, y))
    assert est.classes_.tolist() == [0, 1, 2]


def test_a_module_the_workers_cannot_import_is_named_with_the_fixes(client, tmp_path, monkeypatch):
    """The class lives in a file only the client's path reaches (the workers started before)."""
    (tmp_path / "only_on_the_client.py").write_text(textwrap.dedent(
        """
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(4, 2)

            def forward(self, x):
                return self.linear(x)
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    from only_on_the_client import Net

    from adadamp import DaskClassifier

    X, y = _small()
    with pytest.raises(ModuleNotFoundError, match=r"cannot import 'only_on_the_client'.*client.upload_file.*"
                                                  r"register_pickle_by_value\(only_on_the_client\)"):
        DaskClassifier(module=Net, max_epochs=1, update_timeout=30).fit(X, y)


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_the_docs_agree_with_the_code():
    """Sentences that contradicted the code once, and every extra of setup.cfg in install.rst."""
    import configparser

    written = [p for p in (ROOT / "docs").rglob("*.rst") if not {"_build", "auto_examples"} & set(p.parts)]
    docs = {p: p.read_text() for p in [ROOT / "README.md", *written, *(ROOT / "docs" / "gallery").glob("*.py"),
                                       *(ROOT / "notebooks").glob("*.ipynb")]}
    import re

    stale_cluster = (  # the embedded cluster is started by the first fit, reused, closed when idle
        r"trains on it\s+and closes it", r"closed afterwards", r"starts and stops its own cluster",
        r"starts its own (Local)?[Cc]luster", r"lived only during `fit`",
    )
    stale_data = (r"checked, encoded and trained",)  # category columns are refused, not encoded
    for stale in (r"[Dd]ask (arrays?|data ?frames?)[^.]*computed on the client", r"cores / 16", *stale_cluster, *stale_data):
        assert not [str(p) for p, text in docs.items() if re.search(stale, text)], stale
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    install = (ROOT / "docs" / "install.rst").read_text()
    extras = list(setup["options.extras_require"])
    assert extras and [e for e in extras if f"``{e}``" not in install] == []


def test_skorchs_spelling_of_the_mlflow_logger_answers():
    import adadamp
    from adadamp.callbacks.loggers import MLflowLogger

    assert adadamp.MlflowLogger is MLflowLogger
