"""Worker side: a warm model per fit and the gradient over resident data.

This module runs inside Dask worker processes and never imports the client
side.  A :class:`TrainerPlugin` installs a few RPC handlers on each worker; the
client calls them directly (``client.rpc(address)``), which costs one network
round trip instead of a scheduler-mediated task (DESIGN.md §3).  Compute runs
on one dedicated thread per worker process, off the worker's event loop, so
heartbeats continue while a gradient is computed.

Per fit the worker keeps (keyed by a fit id, so several fits can share a
worker): the module on its device with its parameters and gradients viewing
two flat buffers, the criterion, and the data blocks the client placed on it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import cloudpickle
import numpy as np
import torch
from distributed import WorkerPlugin
from distributed.protocol import to_serialize

__all__ = ["TrainerPlugin", "flatten_parameters"]

HANDLERS = ("adadamp_setup", "adadamp_data", "adadamp_gradient", "adadamp_release")

# One compute thread per worker process: gradients of concurrent fits queue
# here instead of competing for the worker's cores.
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adadamp-compute")
_FITS: dict[str, _FitState] = {}


def flatten_parameters(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter and its gradient a view into two flat buffers.

    Returns ``(flat_params, flat_grads)``.  Gradients accumulate in place into
    the views as long as ``.grad`` is never set to None, so the flat gradient
    buffer is the gradient sum without any copy (DESIGN.md §3).
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("The module has no trainable parameters.")
    dtype = params[0].dtype
    device = params[0].device
    flat = torch.cat([p.detach().reshape(-1).to(dtype) for p in params]).to(device)
    grads = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = grads[offset : offset + n].view_as(p)
        offset += n
    return flat, grads


@dataclass
class _FitState:
    module: torch.nn.Module
    criterion: torch.nn.Module
    device: torch.device
    flat: torch.Tensor
    grads: torch.Tensor
    n_total: int
    blocks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    X: torch.Tensor | None = None
    y: torch.Tensor | None = None
    local_row: np.ndarray | None = None  # global index -> row in X / y, -1 if absent

    def rebuild(self) -> None:
        """Concatenate the resident blocks into one tensor pair."""
        self.local_row = np.full(self.n_total, -1, dtype=np.int64)
        if not self.blocks:
            self.X = self.y = None
            return
        ids = sorted(self.blocks)
        idx = np.concatenate([self.blocks[b][0] for b in ids])
        self.local_row[idx] = np.arange(len(idx))
        X = np.concatenate([self.blocks[b][1] for b in ids])
        y = np.concatenate([self.blocks[b][2] for b in ids])
        self.X = torch.from_numpy(X).to(self.device)
        self.y = torch.from_numpy(y).to(self.device)


def _set_native_malloc() -> None:
    """Undo Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` inside this process.

    That setting pins glibc's mmap threshold at 128 KiB, so every tensor is a
    fresh mmap/munmap and PyTorch runs 1.5-2x slower (dask-engine.md §1).
    ``mallopt`` restores large thresholds at run time.
    """
    path = ctypes.util.find_library("c")
    if not path:
        return
    try:
        libc = ctypes.CDLL(path)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 2**20)
        libc.mallopt(m_trim_threshold, 128 * 2**20)
    except (OSError, AttributeError):  # not glibc
        pass


class TrainerPlugin(WorkerPlugin):
    """Installs adadamp's RPC handlers and sets PyTorch up for this worker.

    Registered by the client once per cluster (``client.register_plugin``);
    Dask hands it to workers that join later, so new workers are ready too.
    """

    name = "adadamp-trainer"

    def setup(self, worker) -> None:
        _set_native_malloc()
        nthreads = max(1, int(getattr(worker.state, "nthreads", 1)))
        _EXECUTOR.submit(torch.set_num_threads, nthreads).result()
        for op in HANDLERS:
            worker.handlers[op] = globals()["_" + op]

    def teardown(self, worker) -> None:
        for op in HANDLERS:
            worker.handlers.pop(op, None)


async def _run(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, fn, *args)


async def _adadamp_setup(fit_id: str, payload, n_total: int) -> dict:
    def build():
        module, criterion, device = cloudpickle.loads(payload)
        device = torch.device(device)
        module = module.to(device)
        module.train()
        flat, grads = flatten_parameters(module)
        _FITS[fit_id] = _FitState(module, criterion, device, flat, grads, int(n_total))

    await _run(build)
    return {"status": "OK"}


async def _adadamp_data(fit_id: str, add, drop) -> dict:
    """Add blocks ``[(block_id, global_idx, X, y), ...]`` and drop block ids."""

    def update():
        state = _FITS[fit_id]
        for block_id in drop:
            state.blocks.pop(block_id, None)
        for block_id, idx, X, y in add:
            state.blocks[block_id] = (idx, X, y)
        state.rebuild()
        return sorted(state.blocks)

    blocks = await _run(update)
    return {"status": "OK", "blocks": blocks}


async def _adadamp_release(fit_id: str) -> dict:
    _FITS.pop(fit_id, None)
    return {"status": "OK"}


async def _adadamp_gradient(fit_id: str, weights, indices, n_chunks: int, seed: int) -> dict:
    def compute():
        start = time.perf_counter()
        state = _FITS[fit_id]
        rows = state.local_row[indices]
        if (rows < 0).any():
            missing = np.asarray(indices)[rows < 0][:5]
            raise KeyError(f"examples {missing.tolist()} are not resident on this worker")
        if state.device.type == "cpu":
            state.flat.numpy()[:] = weights
        else:
            state.flat.copy_(torch.from_numpy(np.asarray(weights)), non_blocking=True)
        rows_t = torch.from_numpy(rows).to(state.device)
        X = state.X.index_select(0, rows_t)
        y = state.y.index_select(0, rows_t)
        n = len(rows)
        chunks = [slice(0, n)]
        if n_chunks > 1 and n > 1:
            bounds = np.linspace(0, n, min(n_chunks, n) + 1).astype(int)
            chunks = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        total = torch.zeros_like(state.grads) if len(chunks) > 1 else state.grads
        loss_sum = 0.0
        sq_sum = 0.0
        # Criteria averaging over the batch are turned back into sums.
        mean = getattr(state.criterion, "reduction", "mean") == "mean"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for part in chunks:
                n_part = part.stop - part.start
                state.grads.zero_()
                out = state.module(X[part])
                loss = state.criterion(out, y[part]) * (n_part if mean else 1)
                loss.backward()
                loss_sum += float(loss.detach())
                if len(chunks) > 1:
                    sq_sum += float(state.grads.double().square().sum()) / n_part
                    total += state.grads
        grad = total.detach().to("cpu", copy=True).numpy()
        return {
            "grad": to_serialize(grad),
            "n": n,
            "loss_sum": loss_sum,
            "chunk_sq_norm_sum": sq_sum,
            "n_chunks": len(chunks) if len(chunks) > 1 else 0,
            "compute_time": time.perf_counter() - start,
        }

    return await _run(compute)
