"""The CUDA path (issue 29, item 5): whoever has a GPU runs ``pytest -m gpu`` and nothing else.

Both backends with ``device="cuda"`` (the parameter server's copies between the client's
CPU weights and the workers' GPUs; NCCL for the all-reduce backend, with a GPU per worker), and a
checkpoint written on a GPU resumed on the CPU.  One worker process per GPU, each seeing only its
own (``CUDA_VISIBLE_DEVICES``).  Everything skips with the reason where CUDA is absent.  GPU float
kernels differ from the CPU's: results are compared with the loose tolerance of float32 training.
"""

import logging

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification

from adadamp import DaskClassifier

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is false)"),
]

PS, AR = "parameter-server", "allreduce"
RTOL, ATOL = 1e-3, 1e-4  # CPU and GPU float kernels differ; SGD amplifies little over 2 epochs


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=512, n_features=8, n_informative=6, n_classes=3, random_state=2)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def gpus():
    """A client of one single-threaded worker process per GPU (at most 2)."""
    from distributed import Client, Nanny, Scheduler, SpecCluster

    n = min(2, torch.cuda.device_count())
    workers = {i: {"cls": Nanny, "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}}}
               for i in range(n)}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with (
        SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(n)
        yield client


def _params(**kw) -> dict:
    return {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9, "batch_size": 32, "max_epochs": 2,
            "random_state": 0, "scale_cluster": False, "grads_per_worker": 1, **kw}  # the batch on every GPU worker


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().cpu().reshape(-1) for p in est.module_.parameters()]).numpy()


def _replica_backends() -> list[str]:
    from adadamp.worker import plugin

    return [s.replica.backend for s in plugin.TRAINER.fits.values() if s.replica is not None]


def test_parameter_server_on_cuda_trains_as_on_cpu(gpus, data):
    cpu = DaskClassifier(client=gpus, **_params()).fit(*data)
    gpu = DaskClassifier(client=gpus, device="cuda", **_params()).fit(*data)
    np.testing.assert_allclose(_weights(gpu), _weights(cpu), rtol=RTOL, atol=ATOL)
    assert gpu.predict(data[0][:8]).shape == (8,)


def test_allreduce_on_cuda_uses_nccl_and_trains_as_on_cpu(gpus, data):
    if torch.cuda.device_count() < 2:
        pytest.skip(reason=f"NCCL needs a GPU per replica: 2 GPUs, this machine has {torch.cuda.device_count()}")
    cpu = DaskClassifier(client=gpus, **_params()).fit(*data)
    est = DaskClassifier(client=gpus, device="cuda", backend=AR, **_params())
    est.partial_fit(*data)  # kept open: the replicas stay on the workers
    try:
        backends = [b for bs in gpus.run(_replica_backends).values() for b in bs]
    finally:
        est._kept_backend.claim(None)
    assert backends == ["nccl", "nccl"]
    est = DaskClassifier(client=gpus, device="cuda", backend=AR, **_params()).fit(*data)
    np.testing.assert_allclose(_weights(est), _weights(cpu), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backend", [PS, AR])
def test_a_checkpoint_written_on_gpu_resumes_on_cpu(gpus, data, tmp_path, backend):
    from test_elastic import StopAt, Stopped  # the crash the elastic tests simulate

    if backend == AR and torch.cuda.device_count() < 2:
        pytest.skip(reason=f"NCCL needs a GPU per replica: 2 GPUs, this machine has {torch.cuda.device_count()}")
    path = tmp_path / "ckpt.pt"
    stopped = DaskClassifier(client=gpus, device="cuda", backend=backend, callbacks=[("stop", StopAt(stop=21))],
                             checkpoint=path, checkpoint_every=4, **_params())
    with pytest.raises(Stopped):
        stopped.fit(*data)
    assert path.exists()
    resumed = DaskClassifier(client=gpus, device="cpu", backend=backend, checkpoint=path, **_params()).fit(*data)
    whole = DaskClassifier(client=gpus, device="cpu", backend=backend, **_params()).fit(*data)
    assert all(p.device.type == "cpu" for p in resumed.module_.parameters())
    assert [r["n_updates"] for r in resumed.history_] == [r["n_updates"] for r in whole.history_]
    np.testing.assert_allclose(_weights(resumed), _weights(whole), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("backend", "precision"), [(PS, "16-mixed"), (PS, "bf16-mixed"), (AR, "bf16-mixed")])
def test_mixed_precision_on_gpus_trains_as_float32_does(gpus, data, backend, precision):
    """autocast on the GPU workers (float16 with the client's loss scale; bf16 on NCCL replicas):
    the fit's accuracy is float32's within a few points, and float16's skipped steps are few."""
    X, y = data
    full = DaskClassifier(client=gpus, device="cuda", backend=backend, **_params()).fit(X, y)
    mixed = DaskClassifier(client=gpus, device="cuda", backend=backend, precision=precision, **_params()).fit(X, y)
    assert mixed.score(X, y) > full.score(X, y) - 0.05
    updates = [u for row in mixed.history_ for u in row["updates"]]
    if precision == "16-mixed":
        assert sum(u["skipped"] for u in updates) < len(updates) // 4
