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
    """Write the training ``state`` (the estimator's fitted attributes) to ``path``.

    The estimators call this themselves when ``checkpoint=path`` is set
    (after every epoch and every ``checkpoint_every`` updates) and from
    ``save_params(f_checkpoint=...)``.  The file is written under a
    temporary name and renamed, so it is always complete.

    Parameters
    ----------
    path : str or path-like
        Destination file.
    state : dict
        ``module_``, ``optimizer_``, ``damper_``, ``loop_``, ``history_``
        and, if present, ``classes_``/``_y_1d``.
    epoch_updates : list of dict
        The per-update records of the unfinished epoch (empty at an epoch
        boundary).

    Examples
    --------
    >>> est.save_params(f_checkpoint="fit.ckpt")  # doctest: +SKIP
    """
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
    """Read a checkpoint written by :func:`save`.

    The file is a pickle (``torch.save``); load only files you trust.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    dict
        ``module`` and ``optimizer`` (state dicts), ``damper`` (the damper
        with its training state), ``loop`` (the epoch clock and sampler
        position), ``history``, ``epoch_updates`` and ``targets``.

    Raises
    ------
    ValueError
        The file is not an adadamp checkpoint of this format.

    Examples
    --------
    >>> from adadamp import checkpoint
    >>> DaskClassifier(checkpoint="fit.ckpt", max_epochs=5).fit(X, y)  # doctest: +SKIP
    >>> saved = checkpoint.load("fit.ckpt")  # doctest: +SKIP
    >>> len(saved["history"])  # doctest: +SKIP
    5
    """
    payload = torch.load(path, weights_only=False)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an adadamp checkpoint of format {FORMAT}.")
    return payload
