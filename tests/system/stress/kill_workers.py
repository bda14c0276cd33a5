"""Kill workers at many different moments of a fit; each run must end where the undisturbed one does.

    .venv/bin/python tests/system/stress/kill_workers.py [--trials 40] [--epochs 4] [--workloads sgd-momentum,adam,...]
        [--backends ps,allreduce] [--workers 2,3] [--moments setup,placement,...] [--seed 0]

A worker that dies costs only its share of one update, recomputed on the others at the same
weights (docs: elasticity).  The parameter server cuts every batch into the same shards whoever
computes them and adds their gradient sums in shard order, so a disturbed fit must equal the
undisturbed one bit for bit (tolerance 0.0).  The all-reduce backend recomputes the update in a
new group generation of fewer replicas (one shard per replica), so only equality up to float
summation order is expected: max |w - w_undisturbed| <= 1e-5 (``TOLERANCES``).  Compared are the
module's parameters and its float buffers (BatchNorm's running statistics).

Each trial draws a backend (``ps``, ``allreduce``), a workload, a cluster size (``--workers``) and
a moment; every value of each comes round once in every few trials (a shuffled bag per option),
the combinations are random.  Trials run grouped by cluster size, each on a LocalCluster of that
many single-threaded worker processes (replaced when a nanny did not restart its worker), against
the undisturbed fit of the same backend, workload and cluster size (fitted twice: the two must be
bitwise equal, and the second, on warm workers, times the ``random`` moment).

Workloads (all regression on 16 features):

* ``sgd-momentum``: the default MLP (64 hidden units), SGD lr 0.01, momentum 0.9;
* ``adam``: the same MLP, Adam lr 1e-3;
* ``batchnorm``: :class:`BatchNormNet` (Linear, BatchNorm1d, ReLU, Linear), SGD with momentum;
* ``dask-array``: the sgd-momentum fit of ``X, y`` as dask arrays of several chunks (persisted on
  the workers: a killed worker's partitions are recomputed by Dask);
* ``lazy-dataset``: the sgd-momentum fit of a torch Dataset (:class:`ArrayDataset`) that the
  workers read example by example (``fit(dataset)``).

Moments:

* ``setup``: a timer 0-0.3 s after the fit starts (set-up, placement or the first updates);
* ``placement``: as the fit's first data placement starts (``Sizing._place``, which both
  backends inherit, is wrapped for the trial: a worker of the list being placed on is
  SIGKILLed before any block moves, so the placement itself meets the dead worker; with dask-array
  input that placement waits ``max(60, update_timeout)`` s, 120 by default, for the blocks pinned
  to the dead worker before it places again: such trials take about two minutes);
* ``after-update``: right after a random update (``on_update_end``);
* ``epoch-end``: right after a random epoch but the last (``on_epoch_end``);
* ``checkpoint``: ``checkpoint=<tmp file>, checkpoint_every=2..5``; at a random one of the
  ``checkpoint_every`` checkpoints (``FitLoop._on_update`` wrapped for the trial) either just before the
  backend's ``sync`` that precedes the write (an all-reduce replica dies while the client gathers
  the state) or right after the file was written;
* ``replacement-joins``: kill, wait for the nanny's new worker to join the Dask cluster, kill again
  at once (the fit has not taken the new worker in yet);
* ``rejoin``: kill, wait for the fit to train without it and for the nanny's new worker, then slow
  the fit down (0.2 s per update) until the update records show every worker holding shards again,
  and kill again, right after that first update with the restarted worker back (the restarted one
  or, by the seed, any);
* ``random``: a timer anywhere in the undisturbed fit's duration (mid-update, during a rebalance).

Each trial prints its backend, workload, cluster size, moment, max |dw| and the range of workers
that held shards; the end prints the failures and the worst difference per backend.  The exit
status is 1 when any trial exceeded its tolerance (or failed).  tests/engine/test_elastic.py runs a short
version in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback

import cloudpickle
import numpy as np
import torch
from distributed import Client, LocalCluster
from sklearn.datasets import make_regression
from torch import nn

from adadamp import DaskRegressor
from adadamp.callbacks import Callback
from adadamp.engine.backends.sizing import Sizing
from adadamp.engine.loop import FitLoop

if __name__ != "__main__":  # imported (tests/engine/test_elastic.py): workers unpickle this module's classes by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

BACKENDS = {"ps": "parameter-server", "allreduce": "allreduce"}
TOLERANCES = {"ps": 0.0, "allreduce": 1e-5}
TOLERANCE = TOLERANCES["ps"]
WORKLOADS = ("sgd-momentum", "adam", "batchnorm", "dask-array", "lazy-dataset")
MOMENTS = ("setup", "after-update", "epoch-end", "replacement-joins", "random", "placement", "checkpoint", "rejoin")
BATCH_SIZE = 128
CHUNK_ROWS = 256  # rows per dask chunk (8 chunks of the script's 2048 examples)

KILLS: list[int] = []  # the pids killed in this process's current trial


class BatchNormNet(nn.Module):
    """Linear, BatchNorm1d, ReLU, Linear: batch statistics per shard, running statistics as buffers."""

    def __init__(self, n_features: int = 16, n_outputs: int = 1, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, n_outputs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ArrayDataset(torch.utils.data.Dataset):
    """A map-style Dataset of ``(x, y)`` pairs over two arrays (read on the workers)."""

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.X)

    def __getitem__(self, i):
        return torch.from_numpy(self.X[i]), self.y[i]


def data(n: int = 2048):
    X, y = make_regression(n_samples=n, n_features=16, noise=1.0, random_state=0)
    return X.astype(np.float32), (y / y.std()).astype(np.float32)


def params(epochs: int, workload: str = "sgd-momentum", backend: str = "ps") -> dict:
    """The estimator's parameters for ``workload`` on ``backend`` (``ps`` or ``allreduce``)."""
    p = {"module__hidden": (64,), "optimizer": torch.optim.SGD, "optimizer__lr": 0.01, "optimizer__momentum": 0.9,
         "batch_size": BATCH_SIZE, "max_epochs": epochs, "random_state": 0, "scale_cluster": False,
         "grads_per_worker": 1, "backend": BACKENDS[backend]}  # grads_per_worker=1: the batch on every worker there is
    if workload == "adam":
        del p["optimizer__momentum"]
        p.update(optimizer=torch.optim.Adam, optimizer__lr=1e-3)
    elif workload == "batchnorm":
        p.update(module=BatchNormNet, module__hidden=32)
    elif workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; one of {WORKLOADS}")
    return p


def fit_args(workload: str, X: np.ndarray, y: np.ndarray) -> tuple:
    """What ``fit`` takes for ``workload``: the arrays, dask arrays of them, or a Dataset over them."""
    if workload == "dask-array":
        import dask.array as da

        return da.from_array(X, chunks=(CHUNK_ROWS, X.shape[1])), da.from_array(y, chunks=CHUNK_ROWS)
    if workload == "lazy-dataset":
        return (ArrayDataset(X, y),)
    return X, y


def fit(client: Client, X, y, epochs: int, workload: str = "sgd-momentum", backend: str = "ps", **extra):
    """One fit of ``workload`` on ``backend``; ``extra``: more estimator parameters."""
    return DaskRegressor(client=client, **params(epochs, workload, backend), **extra).fit(*fit_args(workload, X, y))


def weights(est) -> np.ndarray:
    """The module's parameters, then its float buffers (BatchNorm's running statistics), flat."""
    parts = [p.detach().reshape(-1) for p in est.module_.parameters()]
    parts += [b.detach().reshape(-1) for b in est.module_.buffers() if b.is_floating_point()]
    return torch.cat(parts).numpy()


def update_digests(est) -> list:
    """Each update's ``weights_digest`` (None where digests were off)."""
    return [u.get("weights_digest") for row in est.history_ for u in row["updates"]]


def first_difference(disturbed: list, calm: list) -> str:
    """Where two fits' update digests first differ, to say which update a mismatch started at."""
    if all(d is None for d in disturbed + calm):
        return "no update digests (the all-reduce backend's client holds no weights between syncs)"
    k = next((i for i, (a, b) in enumerate(zip(disturbed, calm)) if a != b), None)
    return "no update digest differs" if k is None else f"update {k} is the first whose weights differ"


def n_parameters(est) -> int:
    """How many of :func:`weights` are parameters (the rest are buffers)."""
    return sum(p.numel() for p in est.module_.parameters())


def n_updates(n_data: int, epochs: int) -> int:
    return epochs * math.ceil(n_data / BATCH_SIZE)


def _pids(client: Client) -> list[int]:
    return sorted(client.run(os.getpid).values())


def _kill(pid: int) -> int:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    KILLS.append(pid)
    return pid


def _kill_one(client: Client, rng: random.Random) -> int:
    return _kill(rng.choice(_pids(client)))


def _back_to(client: Client, n: int, timeout: float = 60) -> bool:
    """Wait for the scheduler to notice a death, then for the nanny's new worker; False if it did not come."""
    deadline = time.monotonic() + 30
    while len(client.scheduler_info()["workers"]) >= n and time.monotonic() < deadline:
        time.sleep(0.05)  # the scheduler notices the death ...
    try:
        client.wait_for_workers(n, timeout=timeout)  # ... and the nanny's new worker joins
    except TimeoutError:  # the nanny may not restart a killed worker (Dask): no second kill
        return False
    return True


def heal(client: Client, n: int) -> None:
    """Bring the cluster of ``client`` back to ``n`` workers where Dask closed a killed worker's
    nanny for good: a removal schedules a check ``distributed.deploy.lost-worker-timeout`` later
    that closes the nanny of a worker not back by then, and a check left by an earlier kill can
    run while the nanny restarts the worker of a later one (1 kill in 5-30 here).  The next trial
    would start with fewer workers, so fewer shards than the undisturbed fit: not bit for bit.
    The cluster object starts the missing worker again; with none (a scheduler address), nothing."""
    if len(client.scheduler_info()["workers"]) >= n or client.cluster is None:
        return
    client.cluster.scale(n)  # the spec still names n workers: the missing one is started again
    client.wait_for_workers(n, timeout=60)


class Killer(Callback):
    """Kills a worker at the chosen update (``after-update``), epoch (``epoch-end``), right after a
    replacement joined the cluster (``replacement-joins``: kill, wait for the nanny's new worker,
    kill again), or right after a restarted worker is back in the fit (``rejoin``)."""

    def __init__(self, moment="after-update", at=3, address=None, seed=0):
        self.moment, self.at, self.address, self.seed = moment, at, address, seed

    def _client(self):
        if not hasattr(self, "client_"):
            self.client_ = Client(self.address, set_as_default=False)
        return self.client_

    def on_train_begin(self, estimator, **info):
        self.updates_, self.phase_, self.rng_ = 0, None, random.Random(self.seed)

    def on_update_end(self, estimator, record=None, **info):
        self.updates_ += 1
        if self.moment == "rejoin":
            self._rejoin(record)
            return
        if self.updates_ != self.at or self.moment not in ("after-update", "replacement-joins"):
            return
        client = self._client()
        n = len(client.scheduler_info()["workers"])
        _kill_one(client, self.rng_)
        if self.moment == "replacement-joins" and _back_to(client, n):
            _kill_one(client, self.rng_)

    def _rejoin(self, record):
        if self.phase_ is None and self.updates_ == self.at:
            client = self._client()
            self.full_, self.before_ = record["n_workers"], set(_pids(client))
            _kill_one(client, self.rng_)
            self.phase_ = "killed"
        elif self.phase_ == "killed" and record["n_workers"] < self.full_:  # the fit trains without it ...
            self.phase_ = "joining" if _back_to(self._client(), self.full_) else "done"
        elif self.phase_ == "joining":
            if record["n_workers"] < self.full_:
                time.sleep(0.2)  # ... while the new worker is set up and given its shards
                return
            pids = _pids(self._client())  # it is back: kill the restarted worker, or (by the seed) any
            new = sorted(set(pids) - self.before_)
            _kill(new[0] if new and self.rng_.random() < 0.5 else self.rng_.choice(pids))
            self.phase_ = "done"

    def on_epoch_end(self, estimator, row=None, **info):
        if self.moment == "epoch-end" and row["epoch"] == self.at:
            _kill_one(self._client(), self.rng_)

    def on_train_end(self, estimator, **info):
        if hasattr(self, "client_"):
            self.client_.close()
            del self.client_


@contextlib.contextmanager
def _wrapped(cls, name: str, make):
    """``cls.name`` replaced by ``make(original)`` for the block (the client process only)."""
    original = cls.__dict__[name]
    setattr(cls, name, make(original))
    try:
        yield
    finally:
        setattr(cls, name, original)


def _kill_at_placement(pids: list[int], rng: random.Random):
    """Kill a worker as the fit's first data placement starts."""
    def make(original):
        def place(self, new_workers):
            if not KILLS:
                _kill(rng.choice(pids))
            return original(self, new_workers)
        return place
    return _wrapped(Sizing, "_place", make)


def _kill_at_checkpoint(client: Client, rng: random.Random, at: int, before: bool):
    """Kill a worker at the ``at``-th ``checkpoint_every`` checkpoint: before its sync, or after the write."""

    def make(original):
        count = [0]

        def on_update(self, updates):
            every = self.checkpoint_every
            hit = self.checkpoint is not None and every and self.state.loop.n_updates % every == 0
            count[0] += bool(hit)
            hit = hit and count[0] == at
            if hit and before:
                _kill_one(client, rng)
            original(self, updates)
            if hit and not before:
                _kill_one(client, rng)
        return on_update
    return _wrapped(FitLoop, "_on_update", make)


@dataclasses.dataclass
class Result:
    weights: np.ndarray
    workers: list[int]  # the workers holding shards, per update
    kills: int  # the workers killed (0: the moment was missed, e.g. a timer after the fit's end)
    detail: str  # when exactly (the draw), to reproduce a trial
    n_parameters: int  # weights[:n_parameters] are the parameters, the rest float buffers
    digests: list  # each update's weights digest (with dask config ``adadamp.debug.digests``; else None each)


def trial(
    client: Client, X, y, epochs: int, moment: str, seed: int, duration: float, strict: bool = True,
    workload: str = "sgd-momentum", backend: str = "ps",
) -> Result:
    """One disturbed fit of ``workload`` on ``backend`` (an undisturbed one takes ``duration`` s)
    on the workers of ``client``, which it waits for again at the end (``strict``: or raises
    ``TimeoutError``; else, after 15 s, has the cluster start a missing one again: :func:`heal`)."""
    rng = random.Random(seed)
    pids = _pids(client)
    n = len(pids)
    total = n_updates(len(X), epochs)
    KILLS.clear()
    timer, callbacks, extra, patch = None, None, {}, contextlib.nullcontext()
    tmp = tempfile.TemporaryDirectory(prefix="kill-workers-")
    if moment in ("setup", "random"):  # random: mid-update, during a rebalance...
        delay = rng.uniform(0.0, 0.3 if moment == "setup" else duration)
        timer, detail = threading.Timer(delay, _kill_one, (client, rng)), f"{delay:.2f} s after the start"
    elif moment == "placement":
        patch, detail = _kill_at_placement(pids, rng), "first placement"
    elif moment == "checkpoint":
        every = rng.randint(2, 5)
        at, before = rng.randint(1, max(1, (total - 2) // every)), rng.random() < 0.5
        extra = {"checkpoint": os.path.join(tmp.name, "fit.ckpt"), "checkpoint_every": every}
        patch = _kill_at_checkpoint(client, rng, at, before)
        detail = f"update {at * every} (every {every}), {'before its sync' if before else 'written'}"
    else:
        if moment == "epoch-end":
            at = rng.randint(1, max(1, epochs - 1))
        elif moment == "rejoin":
            at = rng.randint(1, max(1, total // 3))
        else:
            at = rng.randint(2, max(2, min(40, total - 2)))
        callbacks = [("kill", Killer(moment=moment, at=at, address=client.scheduler.address, seed=seed))]
        detail = f"{'epoch' if moment == 'epoch-end' else 'update'} {at}"
    if timer is not None:
        timer.start()
    try:
        with patch:
            est = fit(client, X, y, epochs, workload, backend, callbacks=callbacks, **extra)
    finally:
        if timer is not None:
            timer.cancel()
        tmp.cleanup()
    if strict:
        client.wait_for_workers(n, timeout=60)
    else:  # the nanny may not restart a killed worker (Dask): start it again where the cluster can
        with contextlib.suppress(TimeoutError):
            client.wait_for_workers(n, timeout=15)
        heal(client, n)
    time.sleep(0.5)
    workers = [u["n_workers"] for row in est.history_ for u in row["updates"]]
    return Result(weights(est), workers, len(KILLS), detail, n_parameters(est), update_digests(est))


@dataclasses.dataclass
class Spec:
    k: int
    backend: str
    workload: str
    workers: int
    moment: str


def draw(n: int, seed: int, backends, workloads, workers, moments) -> list[Spec]:
    """``n`` trials; each option's values come from a shuffled bag refilled when empty (so every value
    comes round once in every ``len(values)`` trials), the combinations at random."""
    rng = random.Random(seed)
    bags: dict[str, list] = {}

    def pick(name, values):
        bag = bags.setdefault(name, [])
        if not bag:
            bag.extend(rng.sample(list(values), len(values)))
        return bag.pop()

    return [Spec(k, pick("backend", backends), pick("workload", workloads), pick("workers", workers),
                 pick("moment", moments)) for k in range(n)]


def _cluster(n: int) -> LocalCluster:
    return LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None, silence_logs=logging.CRITICAL)


def _choices(text: str, allowed, name: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise SystemExit(f"--{name}: unknown {bad or text!r}; choose from {', '.join(allowed)}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--workers", default="2,3")
    parser.add_argument("--moments", default=",".join(MOMENTS))
    parser.add_argument("--seed", type=int, default=0, help="draws the trials (and seeds each: seed + trial)")
    args = parser.parse_args()
    workloads = _choices(args.workloads, WORKLOADS, "workloads")
    backends = _choices(args.backends, tuple(BACKENDS), "backends")
    moments = _choices(args.moments, MOMENTS, "moments")
    workers = [int(w) for w in args.workers.split(",")]
    torch.set_num_threads(1)
    X, y = data()
    specs = draw(args.trials, args.seed, backends, workloads, workers, moments)
    calm: dict[tuple, tuple[np.ndarray, float]] = {}  # (workers, backend, workload): weights, seconds
    worst = dict.fromkeys(backends, 0.0)
    failed: list[str] = []
    started = time.perf_counter()
    for n in dict.fromkeys(s.workers for s in specs):
        todo = [s for s in specs if s.workers == n]
        while todo:
            with _cluster(n) as c, Client(c) as client:
                while todo:
                    s = todo.pop(0)
                    key = (n, s.backend, s.workload)
                    if key not in calm:  # twice: alike within the backend's tolerance, and the second's time
                        first = weights(fit(client, X, y, args.epochs, s.workload, s.backend))
                        t0 = time.perf_counter()
                        w = weights(fit(client, X, y, args.epochs, s.workload, s.backend))
                        calm[key] = w, time.perf_counter() - t0
                        label = f"undisturbed {s.backend:9s} {s.workload:12s} workers {n}"
                        # the all-reduce group adds in rank order, and where Dask put a dask array's
                        # partitions decides which worker holds which shard: alike up to summation order
                        diff = float(np.abs(first - w).max())
                        same = diff <= TOLERANCES[s.backend]
                        print(f"{label}: {calm[key][1]:.1f} s" + (f" (max|dw| {diff:.2e} between two)" if diff else "")
                              + ("" if same else "  NOT REPRODUCIBLE  FAIL"), flush=True)
                        if not same:
                            failed.append(label)
                    label = f"trial {s.k + 1:3d} {s.backend:9s} {s.workload:12s} workers {n} {s.moment:17s}"
                    t0 = time.perf_counter()
                    try:
                        r = trial(client, X, y, args.epochs, s.moment, seed=args.seed + s.k,
                                  duration=calm[key][1], strict=False, workload=s.workload, backend=s.backend)
                    except Exception as err:  # noqa: BLE001 -- a fit that failed is a finding: report, go on
                        traceback.print_exc()
                        failed.append(label)
                        print(f"{label} ERROR {type(err).__name__}: {err}  FAIL", flush=True)
                        break  # a new cluster for the next trials
                    dw = np.abs(r.weights - calm[key][0])
                    diff = float(dw.max())
                    split = ""
                    if len(dw) > r.n_parameters:  # BatchNorm: parameters and running statistics apart
                        split = f" (params {dw[:r.n_parameters].max():.2e}, buffers {dw[r.n_parameters:].max():.2e})"
                    worst[s.backend] = max(worst[s.backend], diff)
                    bad = diff > TOLERANCES[s.backend]
                    if bad:
                        failed.append(label)
                    print(f"{label} max|dw| {diff:.2e}{split} n_workers {min(r.workers)}..{max(r.workers)} kills {r.kills}"
                          f" {time.perf_counter() - t0:5.1f} s ({r.detail}){'  FAIL' if bad else ''}"
                          f"{'  (moment missed)' if not r.kills else ''}", flush=True)
                    if len(client.scheduler_info()["workers"]) < n:  # a nanny did not restart its worker
                        print(f"cluster of {n} replaced (a killed worker was not restarted)", flush=True)
                        break
    print(f"{len(specs)} trials, {len(failed)} failed, {time.perf_counter() - started:.0f} s; worst max|dw|: "
          + ", ".join(f"{b} {worst[b]:.2e} (tolerance {TOLERANCES[b]:g})" for b in backends))
    for label in failed:
        print(f"FAILED: {label}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
