"""Emulated accelerators for benchmarks: a worker-side time model on top of the real computation.

This machine has no GPU and 2 cores, so a cluster of many workers cannot show the time of an
update falling as the workers grow with the batch.  :class:`Emulated` wraps any module; each of its
*training* forward passes sleeps ``fixed + per_example * len(X)`` seconds (divided by the worker's
speed) before the real forward.  A sleep does not use the CPU, so 8 emulated workers on 2 cores
behave as 8 devices whose compute time dominates.  Evaluation forwards (``predict``, ``score``,
validation) do not sleep.

Model (stated in ``benchmarks/README.md``): the defaults are scaled from a V100's published
ResNet-50 training throughput (about 1,000 images/s at batch 256, i.e. ~1 ms per example, with a
fixed ~5 ms per step of kernel launches and optimizer work), divided by 10 so that a benchmark
runs in minutes here: ``fixed = 0.5 ms``, ``per_example = 0.1 ms``.

Worker speeds: ``speeds`` names a JSON file mapping a worker's name (or address) to a speed factor
(1.0 = nominal, 0.5 = half speed); it is re-read when it changes, so a benchmark slows a worker
mid-fit by rewriting the file.  Workers it does not name run at speed 1.  A process that is not a
Dask worker (a PyTorch DDP rank) is named by its ``ADADAMP_EMULATED_NAME`` environment variable.
"""

from __future__ import annotations

import json
import os
import time

import torch
from torch import nn

#: Seconds per training forward and per example (see the module docstring).
FIXED_S = 0.5e-3
PER_EXAMPLE_S = 0.1e-3


def _worker_keys() -> tuple[str, ...]:
    """This process's names in a speeds file: the Dask worker's name and address, if in one."""
    from distributed import Worker, get_worker

    try:
        w = get_worker()
    except ValueError:  # not in a task: adadamp's channel thread, or not in a worker (plain PyTorch peers)
        workers = list(Worker._instances)  # the worker of this process, if it is one
        if len(workers) != 1:  # a process of another system (a DDP rank) may name itself
            return (os.environ.get("ADADAMP_EMULATED_NAME", "client"),)
        w = workers[0]
    return (str(w.name), w.address)


class _Speeds:
    """A speeds file, re-read when its modification time changes (a stat per forward)."""

    def __init__(self, path: str | None):
        self.path, self.mtime, self.speed = path, None, 1.0

    def current(self) -> float:
        if self.path is None:
            return 1.0
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return 1.0
        if mtime != self.mtime:
            with open(self.path) as f:
                table = json.load(f)
            self.mtime = mtime
            self.speed = next((float(table[k]) for k in _worker_keys() if k in table), 1.0)
        return self.speed


class Emulated(nn.Module):
    """``inner(**inner_kwargs)`` whose training forwards also sleep the emulated device's time.

    Parameters
    ----------
    inner : type of nn.Module
        The real model (built here, so ``module__*`` parameters route to it).
    fixed, per_example : float
        Seconds slept per training forward and per example in it, at speed 1.
    speeds : str or None
        A JSON file ``{worker name or address: speed factor}``, re-read when it changes.
    """

    def __init__(self, inner: type[nn.Module], fixed: float = FIXED_S, per_example: float = PER_EXAMPLE_S,
                 speeds: str | None = None, **inner_kwargs):
        super().__init__()
        self.inner = inner(**inner_kwargs)
        self.fixed, self.per_example = fixed, per_example
        self._speeds = _Speeds(speeds)

    def device_time(self, n: int) -> float:
        """Seconds one training forward of ``n`` examples sleeps on this worker now."""
        return (self.fixed + self.per_example * n) / self._speeds.current()

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            time.sleep(self.device_time(len(X)))
        return self.inner(X)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_speeds"] = _Speeds(self._speeds.path)  # re-read on the other side
        return state


class EmulatedSGD(torch.optim.SGD):
    """SGD whose every step also sleeps ``step_time`` seconds: the emulated device's optimizer
    kernels, off the CPU, so that a benchmark on this machine's shared cores can show what
    overlaps the step (the all-reduce members' step beside the client's round trip)."""

    def __init__(self, params, step_time: float = 0.0, **kwargs):
        super().__init__(params, **kwargs)
        self.step_time = step_time

    def __getstate__(self):  # torch's Optimizer pickles only its defaults, state and groups
        return {**super().__getstate__(), "step_time": self.step_time}

    def step(self, closure=None):
        if self.step_time:
            time.sleep(self.step_time)
        return super().step(closure)

