"""The training kit against single-process PyTorch doing the same thing on the same batches:
gradient clipping (``clip_grad_norm_``), a warmup (``LinearLR``), bf16 autocast, and float16 with
loss scaling (``torch.amp.GradScaler``) -- on 1 and 2 workers, on both backends.

The batches are the fit's: data epoch ``e``'s order is ``epoch_permutation(seed, e, n)``, cut into
consecutive batches.  Tolerances, as the norm of the weights' difference over the norm of
PyTorch's weights after the 12 updates: float32 fits differ from PyTorch only by the order of the
gradient's sums (the workers' shard sums added, then divided once): 1e-5.  Under autocast each
shard's weight-gradient product is rounded to the low precision before the shards are added
(bfloat16 keeps 8 bits of mantissa, float16 11), so a batch cut over 2 workers rounds differently
from one pass: 1e-2 (bf16; measured 5.5e-3, where bf16 itself is 9.7e-3 from float32) and 3e-3
(fp16); on 1 worker (one pass) 1e-6.
"""

import copy
import math

import dask
import numpy as np
import pytest
import torch
from torch import nn

from adadamp import DaskRegressor
from adadamp.callbacks import LRScheduler, Warmup
from adadamp.wire.batches import epoch_permutation

PS, AR = "parameter-server", "allreduce"
N, BATCH, EPOCHS, LR = 256, 64, 3, 0.05


class Net(nn.Module):
    """A small MLP whose output is multiplied by ``gain`` (a large gain overflows float16's
    scaled backward pass, as a real network's activations do at GradScaler's first scale)."""

    def __init__(self, gain: float = 1.0):
        super().__init__()
        self.gain = gain
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x) * self.gain


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 8)).astype(np.float32)
    y = (X @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(N, 1))).astype(np.float32)
    return X, y


def _start(gain: float = 1.0) -> nn.Module:
    torch.manual_seed(3)
    return Net(gain)


def _fit(client, data, backend: str, workers: int, module: nn.Module, **params) -> DaskRegressor:
    sgd = {"optimizer": torch.optim.SGD, "optimizer__momentum": 0.9} if "optimizer" not in params else {}
    params = {**sgd, "optimizer__lr": LR, "batch_size": BATCH, "max_epochs": EPOCHS, **params}
    est = DaskRegressor(
        module=module, random_state=5,
        backend=backend, client=client, grads_per_worker=BATCH // 2, min_workers=workers, max_workers=workers,
        **params,
    )
    return est.fit(*data)


def _reference(data, module: nn.Module, seed: int, *, clip=None, warmup=None, dtype=None, scaler=False, lr=LR,
               optimizer=None, averaged=None):
    """Plain PyTorch on the fit's batches; returns the model and (scaler) each update's skip;
    ``averaged``: an ``AveragedModel`` of the model, updated after each step of its data epochs."""
    X, y = (torch.from_numpy(a) for a in data)
    model = copy.deepcopy(module)
    if averaged is not None:  # (kind, start epoch): the AveragedModel is built on the model trained
        multi = torch.optim.swa_utils.get_ema_multi_avg_fn(0.9) if averaged[0] == "ema" else None
        averaged = (torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=multi), averaged[1])
    if optimizer is None:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        opt = optimizer(model.parameters(), lr=lr)
    sched = None if warmup is None else torch.optim.lr_scheduler.LinearLR(opt, start_factor=warmup[1], total_iters=warmup[0])
    amp = torch.amp.GradScaler("cpu") if scaler else None
    skips = []
    for epoch in range(EPOCHS):
        perm = torch.from_numpy(epoch_permutation(seed, epoch, N))
        for start in range(0, N, BATCH):
            idx = perm[start:start + BATCH]
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = nn.functional.mse_loss(model(X[idx]), y[idx])
            if amp is not None:
                before = amp.get_scale()
                amp.scale(loss).backward()
                amp.unscale_(opt)
            else:
                loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if amp is not None:
                amp.step(opt)
                amp.update()
                skips.append(int(amp.get_scale() < before))
            else:
                opt.step()
            if averaged is not None and epoch >= averaged[1]:
                averaged[0].update_parameters(model)
            if sched is not None:
                sched.step()
    return (model if averaged is None else averaged[0].module), skips


def _distance(est, model) -> float:
    ours = torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()])
    theirs = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return float((ours - theirs).norm() / theirs.norm())


def _updates(est) -> list[dict]:
    return [u for row in est.history_ for u in row["updates"]]


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
def test_clip_grad_norm_clips_the_whole_batchs_gradient_as_pytorch_does(client, data, backend, workers):
    module = _start()
    est = _fit(client, data, backend, workers, module, clip_grad_norm=0.5)
    model, _ = _reference(data, module, est.loop_.seed, clip=0.5)
    assert _distance(est, model) < 1e-5
    norms = [u["grad_norm"] for u in _updates(est)]
    assert len(norms) == EPOCHS * N // BATCH and all(math.isfinite(g) for g in norms)
    assert max(norms) > 0.5  # the clip acted (the fit differs from an unclipped one)
    unclipped = _fit(client, data, backend, workers, _start())
    assert "grad_norm" not in _updates(unclipped)[0]
    assert _distance(unclipped, model) > 1e-3


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
def test_warmup_over_updates_is_linearlr_stepped_per_update(client, data, backend, workers):
    module = _start()
    est = _fit(client, data, backend, workers, module, callbacks=[Warmup(updates=8, start_factor=0.1)])
    model, _ = _reference(data, module, est.loop_.seed, warmup=(8, 0.1))
    assert _distance(est, model) < 1e-5
    lrs = [u["lr"] for u in _updates(est)]
    np.testing.assert_allclose(lrs, [LR * (0.1 + 0.9 * min(t, 8) / 8) for t in range(len(lrs))], rtol=1e-6)


def test_warmup_over_epochs_composes_with_a_scheduler_and_the_dampers_factor(client, data):
    """Epochs count examples: with a batch that grows 2x a warmup over 2 epochs still ends at
    the 2nd epoch's end; the factor multiplies a scheduler's learning rate and the damper's."""
    from adadamp.dampers import GeoDampLR

    est = DaskRegressor(
        module=_start(), optimizer=torch.optim.SGD, optimizer__lr=LR, max_epochs=4, random_state=5, client=client,
        batch_size=GeoDampLR(initial=32, delay=1, factor=2),
        callbacks=[Warmup(epochs=2, start_factor=0.25),
                   LRScheduler(policy="StepLR", step_size=3, gamma=0.5)],
    ).fit(*data)
    seen = 0
    for u in _updates(est):
        epoch = seen / N
        damper = 0.5 ** math.floor(epoch)  # GeoDampLR: the batch stays 32, the lr halves per epoch
        scheduled = LR * 0.5 ** (math.floor(epoch) // 3)
        warm = 0.25 + 0.75 * min(1.0, epoch / 2)
        assert u["lr"] == pytest.approx(scheduled * warm * damper, rel=1e-6), (seen, u["lr"])
        seen += u["batch_size"]


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
def test_bf16_mixed_is_pytorchs_autocast(client, data, backend, workers):
    module = _start()
    est = _fit(client, data, backend, workers, module, precision="bf16-mixed")
    model, _ = _reference(data, module, est.loop_.seed, dtype=torch.bfloat16)
    assert _distance(est, model) < (1e-6 if workers == 1 else 1e-2)
    full, _ = _reference(data, module, est.loop_.seed)
    assert _distance(est, full) > 1e-3  # autocast ran: the weights are bf16's, not float32's


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
def test_16_mixed_skips_exactly_the_steps_gradscaler_skips_and_trains_as_it_does(client, data, backend, workers):
    """A planted overflow: one example's feature is past float16's range, so every batch holding
    it has a non-finite loss and gradient, once per epoch, wherever its shard is computed."""
    X, y = data[0].copy(), data[1] * 0.05  # small targets: no overflow of the scaled gradient itself
    X[17, 0] = 7e4  # float16's largest is 65504
    module = _start()
    est = _fit(client, (X, y), backend, workers, module, precision="16-mixed")
    model, skips = _reference((X, y), module, est.loop_.seed, dtype=torch.float16, scaler=True)
    updates = _updates(est)
    assert [u["skipped"] for u in updates] == skips
    assert sum(skips) == EPOCHS
    assert updates[0]["loss_scale"] == 2.0**16
    assert est.optimizer_.param_groups[0]["adadamp_loss_scale"] == 2.0**16 * 0.5**EPOCHS
    assert _distance(est, model) < (1e-6 if workers == 1 else 3e-3)
    full, _ = _reference((X, y), module, est.loop_.seed, dtype=torch.float16)  # no scaling: NaN weights
    assert not torch.isfinite(torch.cat([p.reshape(-1) for p in full.parameters()])).all()


@pytest.mark.parametrize(("params", "message"), [
    ({"precision": "fp16"}, "precision"),
    ({"clip_grad_norm": 0}, "clip_grad_norm"),
    ({"clip_grad_norm": float("inf")}, "clip_grad_norm"),
    ({"callbacks": [Warmup()]}, "exactly one of updates= and epochs="),
    ({"callbacks": [Warmup(updates=5, start_factor=0)]}, "start_factor"),
    ({"compile": True, "compile__modes": "max-autotune"}, "compile__modes: torch.compile has no parameter"),
    ({"compile": 1}, "compile"),
    ({"micro_batch_size": 0}, "micro_batch_size"),
    ({"weight_averaging": "mean"}, "weight_averaging"),
    ({"weight_averaging": "swa", "weight_averaging__decay": 0.9}, r"weight_averaging__decay: weight_averaging='swa' takes"),
    ({"weight_averaging": "ema", "weight_averaging__decay": 1.5}, r"weight_averaging__decay must be a number in \(0, 1\)"),
    ({"weight_averaging__decay": 0.9}, "weight_averaging=None"),
])
def test_a_bad_kit_value_is_refused_before_any_cluster_work(params, message):
    est = DaskRegressor(module=_start(), **params)  # no client: the embedded cluster would start
    with pytest.raises(ValueError, match=message) as err:
        est.fit(np.zeros((4, 8), np.float32), np.zeros((4, 1), np.float32))
    if "precision" in params and params["precision"] == "fp16":
        assert "'16-mixed'" in str(err.value) and "'bf16-mixed'" in str(err.value)


@pytest.mark.parametrize("backend", [PS, AR])
def test_16_mixed_resumes_its_loss_scale_exactly_from_a_checkpoint(client, data, tmp_path, backend):
    """The scale lives in the optimizer's state: a fit stopped after its skipped steps and resumed
    from its checkpoint ends bitwise where the uninterrupted fit ends, at the same scale."""
    from test_elastic import StopAt, Stopped

    X, y = data[0].copy(), data[1] * 0.05
    X[17, 0] = 7e4
    whole = _fit(client, (X, y), backend, 2, _start(), precision="16-mixed")
    path = tmp_path / "fit.ckpt"
    with pytest.raises(Stopped):
        _fit(client, (X, y), backend, 2, _start(), precision="16-mixed", checkpoint=path, checkpoint_every=3,
             callbacks=[("stop", StopAt(stop=7))])
    resumed = _fit(client, (X, y), backend, 2, _start(), precision="16-mixed", checkpoint=path)
    assert [u["skipped"] for u in _updates(resumed)] == [u["skipped"] for u in _updates(whole)]
    assert resumed.optimizer_.param_groups[0]["adadamp_loss_scale"] == whole.optimizer_.param_groups[0]["adadamp_loss_scale"]
    assert _distance(resumed, whole.module_) == 0.0


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_adascale_sees_the_unscaled_gradients_statistics(client, data, precision, backend):
    """AdaScale's gain reads the workers' chunk statistics and the client's mean gradient; under
    loss scaling both must be of the unscaled gradient (a scaled one on either side moves the gain
    by orders of magnitude), so the learning rates follow the float32 fit's."""
    from adadamp.dampers import AdaScale

    small = (data[0], data[1] * 0.05)
    lrs = {}
    for p in ("32-true", precision):
        est = _fit(client, small, backend, 2, _start(), precision=p, batch_size=AdaScale(batch_size=BATCH, base_batch_size=16, smoothing=0.5))
        lrs[p] = np.array([u["lr"] for u in _updates(est)])
    assert lrs["32-true"].max() > 1.5 * LR  # the gain moved the learning rate
    np.testing.assert_allclose(lrs[precision], lrs["32-true"], rtol=2e-2)  # measured: within 1%


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["Lamb", "LARS"])
def test_large_batch_optimizers_from_pytorch_optimizer_train_as_in_one_process(client, data, backend, workers, name):
    """Any torch.optim.Optimizer: LAMB (You et al. 2020) and LARS from the pytorch-optimizer
    package, the large-batch optimizers no framework ships, with clipping and a warmup."""
    import pytorch_optimizer

    optimizer = getattr(pytorch_optimizer, name)
    module = _start()
    est = _fit(client, data, backend, workers, module, optimizer=optimizer, clip_grad_norm=1.0,
               callbacks=[Warmup(updates=4, start_factor=0.25)])
    model, _ = _reference(data, module, est.loop_.seed, optimizer=optimizer, clip=1.0, warmup=(4, 0.25))
    assert _distance(est, model) < 1e-5
    assert _distance(est, module) > 1e-3  # it trained


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
def test_micro_batches_accumulate_the_same_gradient_as_one_pass(client, data, backend, workers):
    """Shares of 32 (2 workers) or 64 examples in passes of at most 10: PyTorch's weights on the
    same batches; the same seed twice: bitwise the same weights, dropout's masks included."""
    module = _start()
    est = _fit(client, data, backend, workers, module, micro_batch_size=10)
    model, _ = _reference(data, module, est.loop_.seed)
    assert _distance(est, model) < 1e-5
    torch.manual_seed(0)
    dropout = DropoutNet()
    first, second = (_fit(client, data, backend, workers, dropout, micro_batch_size=10) for _ in range(2))
    assert _distance(first, second.module_) == 0.0
    whole = _fit(client, data, backend, workers, dropout)
    assert _distance(first, whole.module_) > 1e-4  # the passes draw their own masks


def test_micro_batches_give_adascale_the_same_statistics(client, data):
    """The two halves AdaScale reads from a share are passes of their own: the same statistics
    (and learning rates) as from one pass and an extra backward of the first half."""
    from adadamp.dampers import AdaScale

    lrs = []
    for micro in (None, 6):
        est = _fit(client, data, PS, 1, _start(), micro_batch_size=micro,
                   batch_size=AdaScale(batch_size=BATCH, base_batch_size=16, smoothing=0.5))
        lrs.append([u["lr"] for u in _updates(est)])
    assert max(lrs[0]) > 1.5 * LR
    np.testing.assert_allclose(lrs[1], lrs[0], rtol=1e-4)


def test_a_workers_peak_memory_stays_flat_as_the_batch_grows_16x_past_micro_batch_size():
    """A worker's peak resident memory in each fit (Linux's ``VmHWM``, reset before it): a fit
    whose shares are the bound, one whose shares are 16 times it in passes of the bound, then the
    same without the bound (what a pass of the whole share costs: the measurement can fail).  The
    history's ``peak_memory`` (each update's, reported by the worker) tells the same."""
    import logging

    from distributed import Client, LocalCluster

    def reset_peak() -> None:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)  # what glibc kept of the last fit's memory: given back
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident size starts again from the current one

    def peak() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    wide = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1))
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2048, 64)).astype(np.float32)
    y = rng.normal(size=(2048, 1)).astype(np.float32)
    peaks, reported = [], []
    with (
        dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}),  # a new interpreter's heap, as a user's
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster) as one,
    ):
        for batch, micro in ((128, 128), (2048, 128), (2048, None)):
            one.run(reset_peak)
            est = DaskRegressor(module=wide, optimizer=torch.optim.SGD, optimizer__lr=1e-4, batch_size=batch,
                                max_epochs=1, random_state=0, client=one, micro_batch_size=micro,
                                grads_per_worker=4096).fit(X, y)
            peaks.append(next(iter(one.run(peak).values())))
            reported.append(est.history_[-1]["peak_memory"])
            assert all(len(u["peak_memory"]) == 1 and u["peak_memory"][0] > 0 for u in est.history_[-1]["updates"])
    bounded, grown, unbounded = peaks  # measured: 436, 435 and 518 MB
    assert grown <= 1.1 * bounded, peaks
    assert unbounded - grown > 64 * 2**20, peaks  # one pass of 2048 examples holds ~100 MB of activations
    # (a fit's first reply counts from the worker's previous reply, before this test's reset: 1.05)
    assert all(0.8 * p <= r <= 1.05 * p for p, r in zip(peaks, reported)), (peaks, reported)
    assert reported[2] - reported[1] > 64 * 2**20 and reported[1] <= 1.1 * reported[0], reported


def _graphs() -> int:
    """The graphs torch.compile captured in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("backend", [PS, AR])
def test_a_compiled_fit_compiles_a_bounded_number_of_times_through_a_growing_batch(client, data, backend):
    """GeoDamp through 4 batch sizes (12 to 96), micro-batches of at most 24 and ragged ends (256 is
    no multiple of 48 or 96): shares of a dozen sizes, and each worker captures the module's graph
    at most twice -- once with a dynamic batch dimension, once for a one-example share (torch
    specializes sizes 0 and 1); the next fit of the module captures nothing new.  The ``eager`` backend of torch.compile: the capture is what is
    counted (inductor compiles what is captured)."""
    from adadamp.dampers import GeoDamp

    client.run(torch.compiler.reset)  # a module class compiled by an earlier test is reused: count this fit's
    before = client.run(_graphs)
    schedule = {"batch_size": GeoDamp(initial=12, delay=1, factor=2, max_batch_size=96), "max_epochs": 4}
    module = _start()
    est = _fit(client, data, backend, 2, module, compile=True, compile__backend="eager", micro_batch_size=24, **schedule)
    sizes = {u["batch_size"] for u in _updates(est)}
    assert len(sizes) >= 5, sizes  # 12, 24, 48, 96 and the ragged ends
    graphs = [g - before.get(w, 0) for w, g in client.run(_graphs).items()]
    assert all(1 <= g <= 2 for g in graphs), graphs
    eager = _fit(client, data, backend, 2, module, micro_batch_size=24, **schedule)
    assert _distance(est, eager.module_) < 1e-6
    before = client.run(_graphs)  # the next fit of the module reuses what the workers compiled
    again = _fit(client, data, backend, 2, module, compile=True, compile__backend="eager", micro_batch_size=24,
                 **schedule)
    assert [g - before[w] for w, g in client.run(_graphs).items()] == [0, 0]
    assert _distance(again, est.module_) == 0.0


def test_compile_with_inductor_trains_as_the_eager_module(client, data):
    """inductor compiles C++ for this CPU (gcc): the compiled fit's weights are the eager fit's up
    to the fused kernels' float order."""
    module = _start()
    compiled = _fit(client, data, PS, 1, module, compile=True, max_epochs=1)
    eager = _fit(client, data, PS, 1, module, max_epochs=1)
    assert _distance(compiled, eager.module_) < 1e-5


def test_16_mixed_skips_alike_where_the_step_is_planned_after_the_round(client, data):
    """AdaScale reads the round's statistics, so the all-reduce backend plans each step after the
    round and sends it with the next request: a skipped step is still owed (each replica skips it)
    and the replicas stay with the parameter server's weights."""
    from adadamp.dampers import AdaScale

    X, y = data[0].copy(), data[1] * 0.05
    X[17, 0] = 7e4
    fits = [_fit(client, (X, y), backend, 2, _start(), precision="16-mixed",
                 batch_size=AdaScale(batch_size=BATCH, base_batch_size=16, smoothing=0.5)) for backend in (PS, AR)]
    skipped = [[u["skipped"] for u in _updates(est)] for est in fits]
    assert skipped[0] == skipped[1] and sum(skipped[0]) >= 2
    assert _distance(fits[1], fits[0].module_) < 1e-5


@pytest.mark.parametrize("backend", [PS, AR])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("kind", "start"), [("ema", 0), ("swa", 1)])
def test_weight_averaging_is_averagedmodels_and_predict_uses_it(client, data, backend, workers, kind, start):
    """EMA (decay 0.9) from the first step, SWA from data epoch 1: ``averaged_module_`` holds
    AveragedModel's weights on the same batches; ``predict`` uses them, ``module_`` the trained."""
    module = _start()
    settings = {"weight_averaging__decay": 0.9} if kind == "ema" else {}
    est = _fit(client, data, backend, workers, module, weight_averaging=kind, weight_averaging__start_epoch=start,
               **settings)
    averaged, _ = _reference(data, module, est.loop_.seed, averaged=(kind, start))
    trained, _ = _reference(data, module, est.loop_.seed)
    assert _distance(est, trained) < 1e-5
    ours = torch.cat([p.detach().reshape(-1) for p in est.averaged_module_.parameters()])
    theirs = torch.cat([p.detach().reshape(-1) for p in averaged.parameters()])
    assert float((ours - theirs).norm() / theirs.norm()) < 1e-5
    assert float((ours - torch.cat([p.detach().reshape(-1) for p in trained.parameters()])).norm()) > 1e-3
    X = torch.from_numpy(data[0][:5])
    np.testing.assert_allclose(est.predict(data[0][:5]).ravel(), averaged(X).detach().numpy().ravel(), rtol=1e-4, atol=1e-5)


def test_the_average_resumes_from_a_checkpoint_and_a_partial_fit(client, data, tmp_path):
    """The average is optimizer state: a fit stopped mid-way and resumed from its checkpoint ends
    with the uninterrupted fit's average, bitwise; a warm ``partial_fit`` goes on averaging."""
    from test_elastic import StopAt, Stopped

    params = {"weight_averaging": "swa"}
    whole = _fit(client, data, PS, 2, _start(), **params)
    path = tmp_path / "fit.ckpt"
    with pytest.raises(Stopped):
        _fit(client, data, PS, 2, _start(), checkpoint=path, checkpoint_every=3, callbacks=[("stop", StopAt(stop=7))],
             **params)
    resumed = _fit(client, data, PS, 2, _start(), checkpoint=path, **params)
    assert _distance(resumed, whole.module_) == 0.0
    assert _distance(resumed, whole.averaged_module_) > 0  # (the trained weights are not the average)
    a, b = (torch.cat([p.detach().reshape(-1) for p in e.averaged_module_.parameters()]) for e in (resumed, whole))
    assert torch.equal(a, b)
    steps = [int(s["adadamp_n_averaged"]) for s in whole.optimizer_.state.values()]
    assert steps == [EPOCHS * N // BATCH] * len(steps)
    whole.partial_fit(*data)
    assert {int(s["adadamp_n_averaged"]) for s in whole.optimizer_.state.values()} == {(EPOCHS + 1) * N // BATCH}


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def test_the_averaged_modules_batchnorm_statistics_are_recomputed_for_its_weights(client, data):
    """SWA's recipe ends with ``update_bn``: the averaged module's running statistics are those of
    its own weights over the training data (one worker: the batch is one BatchNorm pass, as in
    PyTorch), not the trained module's."""
    torch.manual_seed(1)
    module = BatchNormNet()
    est = _fit(client, data, PS, 1, module, weight_averaging="swa")
    averaged, _ = _reference(data, module, est.loop_.seed, averaged=("swa", 0))
    batches = [torch.from_numpy(data[0][i:i + BATCH]) for i in range(0, N, BATCH)]
    torch.optim.swa_utils.update_bn(batches, averaged)
    ours, theirs = est.averaged_module_.net[1], averaged.net[1]
    np.testing.assert_allclose(ours.running_mean, theirs.running_mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours.running_var, theirs.running_var, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(ours.running_mean, est.module_.net[1].running_mean, rtol=1e-3)
