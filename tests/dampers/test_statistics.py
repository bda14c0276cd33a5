"""The gradient statistics AdaScale and RadaDamp read never change what is trained, and every
example counts in them (issue: single-example shares, chunking, wrappers)."""

import numpy as np
import pytest
import torch
from sklearn.datasets import make_regression
from torch import nn

from adadamp import DaskRegressor
from adadamp.dampers import AdaScale, DynamicSGD, RadaDamp
from adadamp.estimators import fitting as building
from adadamp.records import Block
from adadamp.wire import parameters
from adadamp.worker import gradient
from adadamp.worker.state import FitState


def _fit_state(module, criterion, n=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6)).astype(np.float32)
    y = rng.normal(size=(n, 1)).astype(np.float32)
    flat, grads = parameters.flatten_parameters(module)
    state = FitState(module, criterion, torch.device("cpu"), flat, grads, n, buffers=parameters.float_buffers(module))
    state.update_blocks([Block(0, np.arange(n), X, y)], [])
    return state


def _gradient(state, indices, n_chunks):
    r = gradient.share_gradient(state, state.flat.numpy().copy(), np.asarray(indices), n_chunks, seed=3)
    return r, None if r.grad is None else r.grad.copy()


def _mlp(batch_norm=False):
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8)] + ([nn.BatchNorm1d(8)] if batch_norm else []) + [nn.ReLU(), nn.Linear(8, 1)]
    return nn.Sequential(*layers)


def test_statistics_do_not_change_the_gradient():
    state = _fit_state(_mlp(), nn.MSELoss())
    plain, g_plain = _gradient(state, range(10), n_chunks=0)
    stats, g_stats = _gradient(state, range(10), n_chunks=2)
    np.testing.assert_array_equal(g_stats, g_plain)  # bitwise: one forward, one backward of the same loss
    assert plain.loss_sum == stats.loss_sum and stats.n_chunks == 2
    # the statistic itself: ||G_1||^2 / 5 + ||G_2||^2 / 5 from separate per-half gradients
    halves = []
    for part in (range(5), range(5, 10)):
        _, g = _gradient(state, part, n_chunks=0)
        halves.append(g.astype(np.float64))
    expected = sum(float(g @ g) / 5 for g in halves)
    assert stats.chunk_sq_norm_sum == pytest.approx(expected, rel=1e-5)


def test_batch_norm_sees_the_share_once():
    module = _mlp(batch_norm=True)
    state = _fit_state(module, nn.MSELoss())
    before = [b.clone() for b in state.buffers]
    _, g_plain = _gradient(state, range(12), n_chunks=0)
    after_plain = [b.clone() for b in state.buffers]
    for b, v in zip(state.buffers, before):
        b.copy_(v)
    _, g_stats = _gradient(state, range(12), n_chunks=2)
    np.testing.assert_array_equal(g_stats, g_plain)  # it differed by 45% with a backward per half
    for b, v in zip(state.buffers, after_plain):  # running statistics advanced once, as without statistics
        assert torch.equal(b, v)


def test_a_share_asked_for_one_chunk_is_one_sample_without_the_extra_backward(monkeypatch):
    """A batch cut into several shards: each shard's gradient is one sample (as fairscale and adaptdl
    take each replica's), its squared norm per example, with no second backward pass."""
    state = _fit_state(_mlp(), nn.MSELoss())
    plain, g_plain = _gradient(state, range(10), n_chunks=0)
    halves = []
    monkeypatch.setattr(gradient, "_first_half_gradient", lambda *a: halves.append(a) or 1 / 0)
    one, g_one = _gradient(state, range(10), n_chunks=1)
    np.testing.assert_array_equal(g_one, g_plain)
    g64 = g_one.astype(np.float64)
    assert (one.n_chunks, halves) == (1, []) and plain.n_chunks == 0
    assert one.chunk_sq_norm_sum == pytest.approx(float(g64 @ g64) / 10, rel=1e-6)


def test_a_one_example_share_is_a_chunk():
    state = _fit_state(_mlp(), nn.MSELoss())
    r, g = _gradient(state, [4], n_chunks=2)
    g64 = g.astype(np.float64)
    assert r.n_chunks == 1 and r.chunk_sq_norm_sum == pytest.approx(float(g64 @ g64), rel=1e-6)


def test_adascale_estimates_with_one_example_per_worker(client):
    """Batch 2 on 2 workers: every share is one example; the gain used to stay at 1 silently."""
    X, y = make_regression(n_samples=64, n_features=6, noise=5.0, random_state=0)
    est = DaskRegressor(batch_size=AdaScale(batch_size=2, base_batch_size=1), optimizer=torch.optim.SGD,
                        optimizer__lr=1e-3, max_epochs=1, random_state=0, grads_per_worker=1)
    est.fit(X.astype(np.float32), (y / y.std()).astype(np.float32))
    assert {u["n_workers"] for row in est.history_ for u in row["updates"]} == {2}
    assert est.damper_.n_estimates_ > 0 and est.damper_.gain_ > 1.0


def test_wrappers_forward_what_they_wrap_needs():
    assert DynamicSGD(batch_size=RadaDamp(initial=4)).needs_grad_stats
    assert not DynamicSGD(batch_size=32).needs_grad_stats
    assert DynamicSGD(batch_size=RadaDamp(initial=4)).reset(100).needs_grad_stats


def test_dynamic_sgd_around_radadamp_grows_the_batch(client):
    X, y = make_regression(n_samples=256, n_features=6, noise=1.0, random_state=0)
    schedule = DynamicSGD(batch_size=RadaDamp(initial=4, form="fudge", wait=1, fudge=0.0, rho=0.0))
    est = DaskRegressor(batch_size=schedule, optimizer=torch.optim.SGD, optimizer__lr=1e-2, max_epochs=2,
                        random_state=0).fit(X.astype(np.float32), (y / y.std()).astype(np.float32))
    sizes = [u["batch_size"] for row in est.history_ for u in row["updates"]]
    assert max(sizes) > 4, sizes[:20]  # it stayed at [4, 4, 4, ...]


def test_elastic_dynamic_sgd_follows_the_workers_instead_of_driving_them():
    """B = per_worker_batch x W; sizing W from B / grads_per_worker ran away to max_workers."""
    import logging

    from distributed import Client, LocalCluster

    X, y = make_regression(n_samples=2048, n_features=6, noise=1.0, random_state=0)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        est = DaskRegressor(batch_size=DynamicSGD(per_worker_batch=256), grads_per_worker=128, max_workers=4,
                            scale_cluster=True, scale_wait=2, client=client, max_epochs=2, random_state=0)
        est.fit(X.astype(np.float32), (y / y.std()).astype(np.float32))
        updates = [u for row in est.history_ for u in row["updates"]]
        assert {u["n_workers"] for u in updates} == {2}
        assert {u["batch_size"] for u in updates} == {512}
        assert len(client.scheduler_info()["workers"]) == 2


@pytest.mark.parametrize("criterion__ignore_index", [-100, 1])
def test_a_class_weighted_loss_is_the_criterions_weighted_mean(client, criterion__ignore_index):
    """Gradients were made sums by multiplying the mean by the example count: wrong for class
    weights and ignore_index. One update on the whole data set equals one full-batch step."""
    from sklearn.datasets import make_classification

    from adadamp import DaskClassifier

    X, y = make_classification(n_samples=96, n_features=6, n_informative=4, n_classes=3, random_state=0)
    X = X.astype(np.float32)
    weights = torch.tensor([1.0, 5.0, 0.2])
    est = DaskClassifier(criterion=nn.CrossEntropyLoss, criterion__weight=weights,
                         criterion__ignore_index=criterion__ignore_index, optimizer=torch.optim.SGD,
                         optimizer__lr=0.5, batch_size=96, max_epochs=1, random_state=0).fit(X, y)
    initial = DaskClassifier(criterion=nn.CrossEntropyLoss, criterion__weight=weights,
                             criterion__ignore_index=criterion__ignore_index, random_state=0)
    module = building.build_module(initial.get_params(deep=False), 6, 3, est.loop_.seed)
    loss = nn.CrossEntropyLoss(weight=weights, ignore_index=criterion__ignore_index)(
        module(torch.from_numpy(X)), torch.from_numpy(y))
    loss.backward()
    with torch.no_grad():
        for p in module.parameters():
            p -= 0.5 * p.grad
    assert est.history_[0]["train_loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for got, want in zip(est.module_.parameters(), module.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_a_rebuilt_adascale_continues_its_lr_schedule(client):
    """A warm start with a changed batch_size__* builds AdaScale again; its lr schedule restarted at
    tau = 0 while the wrapped schedule's epoch clock went on."""
    from adadamp.dampers import GeoDamp

    X, y = make_regression(n_samples=128, n_features=6, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), (y / y.std()).astype(np.float32)
    est = DaskRegressor(batch_size=AdaScale(batch_size=GeoDamp(initial=8, delay=1), base_batch_size=8,
                                            lr_schedule=_halving),
                        optimizer=torch.optim.SGD, optimizer__lr=1e-3, max_epochs=2, random_state=0,
                        warm_start=True).fit(X, y)
    tau = est.damper_.tau_
    est.set_params(batch_size__batch_size__factor=4, max_epochs=1).fit(X, y)
    assert est.damper_.batch_size.factor == 4  # it was rebuilt
    per_epoch = 128 / 8  # scale-invariant iterations per epoch
    assert est.damper_.tau_ == pytest.approx(tau + per_epoch, abs=2)  # went on from where the clock stood


def _halving(t):
    return 0.5 ** (t // 16)


def test_radadamp_gets_the_norm_without_the_workers_extra_backward(client, monkeypatch):
    """RadaDamp reads only ||g||^2, which the client computes from the summed gradient: the workers
    are asked for no chunk statistics (no second backward pass); AdaScale's per-chunk sums get two
    per share on one shard, and one per shard (no second backward either) on several."""
    from adadamp.engine.transport import Transport

    asked = []
    original = Transport.round
    monkeypatch.setattr(Transport, "round", lambda self, req, n_chunks, *a, **k: asked.append(n_chunks)
                        or original(self, req, n_chunks, *a, **k))
    X, y = make_regression(n_samples=128, n_features=6, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), (y / y.std()).astype(np.float32)
    est = DaskRegressor(batch_size=RadaDamp(initial=8, wait=2), optimizer=torch.optim.SGD, max_epochs=2,
                        random_state=0).fit(X, y)
    assert set(asked) == {0} and est.damper_.initial_loss_ is not None  # statistics arrived all the same
    asked.clear()
    DaskRegressor(batch_size=AdaScale(batch_size=32, base_batch_size=8), optimizer=torch.optim.SGD, max_epochs=1,
                  random_state=0).fit(X, y)
    assert set(asked) == {2}
    asked.clear()
    est = DaskRegressor(batch_size=AdaScale(batch_size=32, base_batch_size=8), optimizer=torch.optim.SGD, max_epochs=1,
                        random_state=0, grads_per_worker=16).fit(X, y)
    assert set(asked) == {1} and {u["n_workers"] for row in est.history_ for u in row["updates"]} == {2}
    assert est.damper_.n_estimates_ == len(asked) and est.damper_.gain_ > 1  # every update was a sample
