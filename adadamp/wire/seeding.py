"""Seeded draws from PyTorch's process-wide random generator, one thread at a time.

PyTorch has one CPU generator per process, shared by every thread, and
``torch.random.fork_rng`` saves and restores its state around a block.  Two
threads doing this at once interleave: one reseeds (or restores) the
generator between the other's draws.  That happens whenever a fit's client
runs inside a Dask worker task (joblib's ``"dask"`` backend, a fit submitted
as a task) while the same process computes another fit's gradients: the
module's initial weights then came from the other fit's dropout seed.  Every
seeded use of the generator in adadamp goes through :func:`seeded`, which
holds one process-wide lock, so the same seed always gives the same draws.
The threads that read a lazy Dataset's examples (:mod:`adadamp.worker.loading`)
take it in the background: they wait while a gradient waits for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["generator_state", "seeded"]

_GLOBAL_GENERATOR = threading.RLock()  # guards torch's process-wide generators
_GATE = threading.Condition()  # background blocks wait here while a foreground one waits for the lock
_foreground_waiting = 0


@contextlib.contextmanager
def seeded(seed: int, device: torch.device | str = "cpu", background: bool = False) -> Iterator[None]:
    """Run the block with torch's generators seeded by ``seed``; restore them after.

    Holds a process-wide lock for the whole block, so draws inside it are not
    disturbed by other threads seeding through this function.  Only the
    generators of ``device`` (and the CPU's) are touched: ``torch.manual_seed``
    would also queue a CUDA seed with a captured stack trace on every call
    when CUDA is not in use (0.1-0.2 ms per update on a worker).

    Parameters
    ----------
    seed : int
        The seed of the block's draws.
    device : torch.device or str, default="cpu"
        The device whose generator the block uses besides the CPU's.
    background : bool, default=False
        Give way to other blocks: wait while one that is not in the background waits for the
        lock (a lock re-taken in a loop by example loaders would otherwise starve a gradient).
    """
    with _turn(background):
        device = torch.device(device)
        cuda = device.type == "cuda"
        with torch.random.fork_rng(devices=[device] if cuda else []):
            torch.default_generator.manual_seed(seed)
            if cuda:
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(seed)
            elif device.type != "cpu":
                torch.manual_seed(seed)
            yield


def generator_state() -> torch.Tensor:
    """The CPU generator's state, read while no seeded block is running (their draws restore it)."""
    with _turn(background=False):
        return torch.default_generator.get_state()


@contextlib.contextmanager
def _turn(background: bool) -> Iterator[None]:
    """Hold the process's generator lock, foreground blocks first."""
    global _foreground_waiting
    if background:
        with _GATE:
            _GATE.wait_for(lambda: _foreground_waiting == 0)
        with _GLOBAL_GENERATOR:
            yield
        return
    with _GATE:
        _foreground_waiting += 1
    try:
        _GLOBAL_GENERATOR.acquire()
    finally:
        with _GATE:
            _foreground_waiting -= 1
            _GATE.notify_all()
    try:
        yield
    finally:
        _GLOBAL_GENERATOR.release()

