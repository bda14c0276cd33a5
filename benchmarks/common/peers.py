"""The runners: one function per peer, each ``run_<peer>(workload, X, y) -> dict``.

Each returns ``fit_s`` (the whole training call as its user times it, in a process or on a cluster
that trained once already), ``train_s`` (its epochs only: the steady state), ``first_fit_s`` (the
first call in a fresh process or on a fresh cluster), ``n_updates``, the trained ``module`` (its
final loss is measured by the caller, the same way for every peer) and extras.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from distributed import Client, LocalCluster, WorkerPlugin
from distributed.protocol import to_serialize
from torch import nn

from .workloads import WORKLOADS, Workload, batches, epoch_order

# ------------------------------------------------------------------ (a) plain PyTorch


def _plain_fit(wl: Workload, X, y) -> dict:
    """One training run as a script's user times it: model, optimizer and tensors built, then the loop."""
    start = time.perf_counter()
    model = wl.module()
    opt = wl.optimizer(model.parameters())
    crit = nn.CrossEntropyLoss()
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    updates = 0
    loop_start = time.perf_counter()
    for epoch in range(wl.epochs):
        for idx in batches(len(X), wl.batch_size, epoch):
            idx = torch.from_numpy(idx)
            opt.zero_grad()
            crit(model(Xt[idx]), yt[idx]).backward()
            opt.step()
            updates += 1
    end = time.perf_counter()
    return {"fit_s": end - start, "train_s": end - loop_start, "n_updates": updates, "module": model}


def run_plain(wl: Workload, X, y) -> dict:
    """Two runs in one process: the first (torch's first optimizer imports ``torch._dynamo``) and
    the timed one."""
    torch.set_num_threads(2)
    first = _plain_fit(wl, X, y)
    return {**_plain_fit(wl, X, y), "first_fit_s": first["fit_s"]}


# ------------------------------------------------------------------ (b) torch DDP, gloo


def _ddp_fit(wl: Workload, Xt, yt, rank: int, world: int) -> dict:
    """One DDP training run inside a started process group: the model wrapped (its weights broadcast),
    then the loop between two barriers."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    start = time.perf_counter()
    model = DistributedDataParallel(wl.module())
    opt = wl.optimizer(model.parameters())
    crit = nn.CrossEntropyLoss()
    updates = 0
    dist.barrier()
    loop_start = time.perf_counter()
    for epoch in range(wl.epochs):
        for idx in batches(len(Xt), wl.batch_size, epoch):
            # Rank r takes part r of the global batch: the same batches as the other peers.
            idx = torch.from_numpy(np.array_split(idx, world)[rank])
            opt.zero_grad()
            crit(model(Xt[idx]), yt[idx]).backward()
            opt.step()
            updates += 1
    dist.barrier()
    end = time.perf_counter()
    return {"fit_s": end - start, "train_s": end - loop_start, "n_updates": updates, "model": model}


def _ddp_rank(rank: int, world: int, port: int, name: str, quick: bool, out: str) -> None:
    """A whole DDP script: process start (measured by the parent), group init, data load, then two
    training runs (the first in fresh processes, and the timed one)."""
    import torch.distributed as dist

    entered = time.time()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    initialized = time.time()
    wl = WORKLOADS[name]
    X, y = wl.data(quick)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    loaded = time.time()
    first = _ddp_fit(wl, Xt, yt, rank, world)
    res = _ddp_fit(wl, Xt, yt, rank, world)
    if rank == 0:
        torch.save({"fit_s": res["fit_s"], "train_s": res["train_s"], "n_updates": res["n_updates"],
                    "first_fit_s": first["fit_s"], "entered": entered, "init_s": initialized - entered,
                    "data_s": loaded - initialized, "state": res["model"].module.state_dict()}, out)
    dist.destroy_process_group()


def run_ddp(wl: Workload, X, y, quick: bool, world: int = 2) -> dict:
    """``script_s``: the whole script as its user waits for it, from ``mp.spawn`` to the ranks'
    exit; ``start_s`` (to rank 0's first line), ``init_s`` (the gloo group) and ``data_s`` (the
    data made) are its parts before the first training run."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        spawned = time.time()
        mp.spawn(_ddp_rank, args=(world, port, wl.name, quick, out), nprocs=world, join=True)
        script_s = time.time() - spawned
        res = torch.load(out)
    model = wl.module()
    model.load_state_dict(res.pop("state"))
    return {**res, "start_s": res.pop("entered") - spawned, "script_s": script_s, "module": model}


# ------------------------------------------------------------------ (c) skorch


class EpochOrder(torch.utils.data.Sampler):
    """Yields the same example order per epoch as the other peers."""

    def __init__(self, n: int):
        self.n, self.epoch = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = epoch_order(self.n, self.epoch)
        self.epoch += 1
        return iter(order.tolist())


def _skorch_fit(wl: Workload, X, y) -> dict:
    from skorch import NeuralNetClassifier

    start = time.perf_counter()
    net = NeuralNetClassifier(
        module=wl.module(),
        criterion=nn.CrossEntropyLoss,
        optimizer=torch.optim.SGD,
        lr=wl.lr,
        optimizer__momentum=wl.momentum,
        batch_size=wl.batch_size,
        max_epochs=wl.epochs,
        train_split=None,
        iterator_train__sampler=EpochOrder(len(X)),
        iterator_train__shuffle=False,
        verbose=0,
    )
    net.fit(X, y)
    fit_s = time.perf_counter() - start
    updates = sum(len(row["batches"]) for row in net.history)
    train_s = sum(row["dur"] for row in net.history)  # the epochs, as skorch times them
    return {"fit_s": fit_s, "train_s": train_s, "n_updates": updates, "module": net.module_}


def run_skorch(wl: Workload, X, y) -> dict:
    """Two fits in one process: the first, and the timed one."""
    torch.set_num_threads(2)
    first = _skorch_fit(wl, X, y)
    return {**_skorch_fit(wl, X, y), "first_fit_s": first["fit_s"]}


# ------------------------------------------------------------------ (d) adadamp


def local_cluster(n_workers: int = 2):
    """The cluster a user would start: LocalCluster of single-threaded worker processes."""
    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )
    return cluster, Client(cluster, set_as_default=False)


BREAKDOWN = ("compute_time", "comm_time", "aggregate_time", "step_time", "update_time")


def breakdown(history: list[dict]) -> dict:
    """Median per-update times (s) from ``history_``; ``other`` is what the named parts leave."""
    ups = [u for row in history for u in row["updates"]]
    out = {k.removesuffix("_time"): statistics.median(u[k] for u in ups) for k in BREAKDOWN}
    out["overhead"] = statistics.median(u["update_time"] - u["compute_time"] for u in ups)
    out["other"] = statistics.median(u["update_time"] - sum(u[k] for k in BREAKDOWN[:4]) for u in ups)
    return out


def run_allreduce(wl: Workload, X, y) -> dict:
    """adadamp with ``backend="allreduce"``: replicas on the two workers, gloo all-reduce."""
    return run_adadamp(wl, X, y, backend="allreduce")


def run_adadamp(wl: Workload, X, y, backend: str = "parameter-server") -> dict:
    """A user's session: the cluster started (``cluster_s``), a first fit on it (``first_fit_s``),
    then the timed fit on the warm cluster (``fit_s``: the whole call; ``train_s``: its epochs)."""
    from adadamp import DaskClassifier

    torch.set_num_threads(1)  # the client only aggregates and steps
    started = time.perf_counter()
    cluster, client = local_cluster(2)

    def fit():
        est = DaskClassifier(
            module=wl.module(),
            optimizer=torch.optim.SGD,
            optimizer__lr=wl.lr,
            optimizer__momentum=wl.momentum,
            batch_size=wl.batch_size,
            max_epochs=wl.epochs,
            random_state=0,
            client=client,
            backend=backend,
            grads_per_worker=1,  # every batch on both workers, as DDP's
        )
        start = time.perf_counter()
        est.fit(X, y)
        return est, time.perf_counter() - start

    try:
        client.wait_for_workers(2)
        cluster_s = time.perf_counter() - started
        _, first_fit_s = fit()
        est, fit_s = fit()
    finally:
        client.close()
        cluster.close()
    train_s = sum(row["dur"] for row in est.history_)
    return {
        "fit_s": fit_s,
        "train_s": train_s,
        "first_fit_s": first_fit_s,
        "cluster_s": cluster_s,
        "setup_s": fit_s - train_s,  # validation, worker set-up, data placement, release
        "n_updates": est.loop_.n_updates,
        "module": est.module_,
        "breakdown": breakdown(est.history_),
        **{key: statistics.median(u[key] for row in est.history_ for u in row["updates"])
           for key in ("sent_bytes", "received_bytes")},
        "worker_peak_mb": max(row.get("peak_memory", 0) for row in est.history_) / 2**20,  # any worker, any update
    }


# ------------------------------------------------------------------ (e) the round-trip floor

_ECHO_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-echo")


async def _noop() -> dict:
    return {}


async def _echo(weights) -> dict:
    """A gradient call without the gradient: weights in, through one compute thread, same size out."""

    def work():
        return to_serialize(np.array(weights, dtype=np.float32, copy=True))

    return {"grad": await asyncio.get_running_loop().run_in_executor(_ECHO_POOL, work)}


class FloorPlugin(WorkerPlugin):
    """Installs the ``bench_noop`` and ``bench_echo`` RPC handlers, as adadamp's TrainerPlugin does."""

    name = "bench-floor"

    def setup(self, worker) -> None:
        worker.handlers["bench_noop"] = _noop
        worker.handlers["bench_echo"] = _echo


def round_times(client, op: str, rounds: int, warmup: int = 10, **kwargs) -> list[float]:
    """Seconds per synchronous round of ``op`` to every worker, by the engine's path:
    ``client.rpc(address).<op>(...)`` fanned out with ``asyncio.gather`` inside ``client.sync``."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])

    async def fan_out():
        async def one(address):
            return await asyncio.wait_for(getattr(client.rpc(address), op)(**kwargs), 60)

        return await asyncio.gather(*(one(a) for a in workers))

    times = []
    for k in range(warmup + rounds):
        start = time.perf_counter()
        client.sync(fan_out)
        if k >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _empty_gradient(request):
    from adadamp.records import GradientReply

    return GradientReply(n=0, loss_sum=0.0, chunk_sq_norm_sum=0.0, n_chunks=0, compute_time=0.0, grad=None,
                         buffers=None)


def _start_channel(dask_worker) -> tuple[int, bytes]:
    """A :class:`adadamp.wire.channel.ChannelServer` on this worker that answers without computing."""
    from adadamp.wire.channel import ChannelServer, channel_host

    server = ChannelServer(channel_host(dask_worker.address), _empty_gradient, n_weights=1, on_start=lambda: None)
    dask_worker.bench_channel = server
    return server.port, server.token


def channel_round_times(client, rounds: int, warmup: int = 10) -> list[float]:
    """Seconds per synchronous empty round over the engine's data plane (one channel per worker)."""
    from adadamp.records import GradientRequest, ShareRequest
    from adadamp.wire.channel import Channel, channel_host

    offers = client.run(_start_channel)
    channels = [Channel(channel_host(a), port, token, 1, timeout=60) for a, (port, token) in sorted(offers.items())]
    empty = GradientRequest(ShareRequest("", 0, np.empty(0, dtype=np.int64)), 1)
    times = []
    try:
        for k in range(warmup + rounds):
            start = time.perf_counter()
            for ch in channels:
                ch.send(empty)
            for ch in channels:
                ch.receive(time.monotonic() + 60)
            if k >= warmup:
                times.append(time.perf_counter() - start)
    finally:
        for ch in channels:
            ch.close()
    return times


def run_floor(wl: Workload, quick: bool) -> dict:
    """Median empty round (Dask RPC, and the engine's channel), and an RPC round carrying the weights."""
    rounds = 30 if quick else 300
    n_params = sum(p.numel() for p in wl.module().parameters())
    weights = np.zeros(n_params, dtype=np.float32)
    cluster, client = local_cluster(2)
    try:
        client.wait_for_workers(2)
        client.register_plugin(FloorPlugin(), name=FloorPlugin.name)
        empty = round_times(client, "bench_noop", rounds)
        echo = round_times(client, "bench_echo", rounds, weights=to_serialize(weights))
        channel = channel_round_times(client, rounds)
    finally:
        client.close()
        cluster.close()
    return {
        "floor_ms": 1e3 * statistics.median(empty),
        "floor_weights_ms": 1e3 * statistics.median(echo),
        "channel_floor_ms": 1e3 * statistics.median(channel),
        "n_params": n_params,
        "rounds": rounds,
    }
