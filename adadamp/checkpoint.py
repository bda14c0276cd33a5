"""Checkpoints of the client's training state, written atomically.

The client is the only stateful process (workers hold caches), so a
checkpoint is everything ``fit`` needs to go on as if it had never stopped:
weights, optimizer state, damper state, the epoch clock and sampler position
(the data order is a function of the seed and the data epoch), and the
history (dask-engine.md §4.4).  Files are written to a temporary name and
renamed, so a crash never leaves a half-written checkpoint.

Checkpoints are pickles (``torch.save``): load only files you trust.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

FORMAT = 1


def save(path: str | os.PathLike, state: dict, epoch_updates: list) -> None:
    """Write the training ``state`` (the estimator's fitted attributes) to ``path``."""
    payload = {
        "format": FORMAT,
        "module": state["module_"].state_dict(),
        "optimizer": state["optimizer_"].state_dict(),
        "damper": state["damper_"],
        "loop": dataclasses.asdict(state["loop_"]),
        "history": state["history_"],
        "epoch_updates": list(epoch_updates),
        "targets": {k: state[k] for k in ("classes_", "_y_1d") if k in state},
    }
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> dict:
    """Read a checkpoint written by :func:`save`."""
    payload = torch.load(path, weights_only=False)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an adadamp checkpoint of format {FORMAT}.")
    return payload
