"""Checkpoints of the client's training state: plain data, written atomically, loaded safely.

The client is the only stateful process (workers hold caches), so a
checkpoint is everything ``fit`` needs to go on as if it had never stopped:
weights, optimizer state, the damper's fitted state, the epoch clock and
sampler position (the data order is a function of the seed and the data
epoch), and the history (docs/guide/checkpoints.rst).

A checkpoint file is not trusted (docs/guide/security.rst): it holds tensors and plain Python data
only, read with ``torch.load(weights_only=True)`` from a private regular file of this user
(:mod:`~adadamp.checkpoint.files`), and what it declares is checked before anything is built
from it (:mod:`~adadamp.checkpoint.checks`).  ``save_params``'s parts are written and read
(``load_params``) through the same private files and the same checks.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from ..dampers.clock import LoopState
from ..data.digest import data_digest
from ..records import TrainingState
from . import journal
from .checks import (
    budget_for,
    check_fits,
    check_module,
    check_optimizer,
    check_optimizer_dict,
    check_payload,
    check_records,
    check_tensors,
    label_dtype,
)
from .damper_state import damper_state, plain, restore_damper
from .files import (
    FORMAT,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    corrupt,
    open_private,
    read_archive,
    size_of,
    write_private,
)

__all__ = [
    "FORMAT",
    "CorruptCheckpointError",
    "UnsafeCheckpointError",
    "Writer",
    "check_fingerprint",
    "damper_state",
    "fingerprint",
    "load",
    "load_parts",
    "plain",
    "restore",
    "restore_damper",
    "save",
    "save_parts",
]


def fingerprint(X: np.ndarray, y: np.ndarray, params: dict) -> dict:
    """What a checkpoint was trained on, to refuse resuming another fit from it.

    ``data``: the arrays' shapes and types and a hash of up to 4096 evenly
    spaced examples (cheap for any size, and different for another data set
    or another cross-validation fold); ``params``: a hash of the parameters
    that decide the trajectory, written stably (classes and functions by
    name, never by address).
    """
    return {
        "data": data_digest(X, y),
        "params": hashlib.blake2b(_stable(params).encode(), digest_size=16).hexdigest(),
    }


def check_fingerprint(path, saved: dict, current: dict) -> None:
    """Raise ``ValueError`` if the checkpoint at ``path`` was written by a fit of other data or parameters."""
    differ = [k for k in ("data", "params") if saved.get(k) != current[k]]
    if differ:
        what = " and ".join({"data": "other training data", "params": "other parameters"}[k] for k in differ)
        raise ValueError(
            f"The checkpoint {path} was written by a fit with {what}, so this fit cannot resume from it. "
            "Give each fit its own checkpoint path (e.g. one per GridSearchCV candidate and fold), or delete "
            "the file to start afresh."
        )


def _stable(value) -> str:
    """A repr that is the same in every process for equal parameters."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_stable(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list | tuple):
        return type(value).__name__ + "(" + ", ".join(_stable(v) for v in value) + ")"
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    if hasattr(value, "get_params"):  # scikit-learn style objects (dampers): class and parameters
        return _stable(type(value)) + _stable(value.get_params(deep=False))
    return repr(value)



def save(path: str | os.PathLike, state: TrainingState, epoch_updates: list, history: dict | None = None) -> None:
    """Write the training ``state`` (the estimator's fitted attributes) to ``path``.

    The estimators call this themselves when ``checkpoint=path`` is set
    (after every epoch and every ``checkpoint_every`` updates) and from
    ``save_params(f_checkpoint=...)``.  The file is private to its owner
    (mode 0600) and always complete.

    Parameters
    ----------
    path : str or path-like
        Destination file.
    state : TrainingState
        The module, optimizer, damper, clock and history, the class labels
        and what the fit trains on (``state.fingerprint``, :func:`fingerprint`;
        a fit resuming from the file must match it).
    epoch_updates : list of dict
        The per-update records of the unfinished epoch (empty at an epoch
        boundary).
    history : dict, optional
        Where the finished epochs' rows are instead of in the file (a
        :class:`Writer`'s journal); None writes them in the file.

    Examples
    --------
    >>> est.save_params(f_checkpoint="fit.ckpt")  # doctest: +SKIP
    """
    data = _serialized(state, epoch_updates, history)
    write_private(path, lambda f: f.write(data))


def _serialized(state: TrainingState, epoch_updates: list, history: dict | None) -> bytes:
    """The file :func:`save` writes, as bytes: a snapshot of ``state`` taken now."""
    targets = {k: state.targets[k] for k in ("classes_", "_y_1d") if k in state.targets}
    if "classes_" in targets:
        classes = np.asarray(targets["classes_"])
        targets["classes_"] = {"values": classes.tolist(), "dtype": classes.dtype.str}
    payload = {
        "format": FORMAT,
        "module": state.module.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "damper": damper_state(state.damper),
        "loop": plain(dataclasses.asdict(state.loop)),
        "history": plain(state.history) if history is None else history,
        "epoch_updates": plain(list(epoch_updates)),
        "targets": plain(targets),
        "fingerprint": state.fingerprint or {},
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()



def load(path: str | os.PathLike, like: TrainingState | None = None, fingerprint: dict | None = None) -> dict:
    """Read a checkpoint written by :func:`save`, without running any code it holds.

    Parameters
    ----------
    path : str or path-like
    like : TrainingState, optional
        The state the checkpoint will be restored on (:func:`restore`); its module's tensors, its
        optimizer's parameters and its ``classes_`` bound what the file may hold, checked before
        ``classes_`` is built.  The estimators pass it.
    fingerprint : dict, optional
        What the fit that reads the file trains on (:func:`fingerprint`); a file of another fit is
        refused with :func:`check_fingerprint`'s message before it is compared with ``like``.

    Returns
    -------
    dict
        ``module`` and ``optimizer`` (state dicts), ``damper`` (the damper's
        fitted state and this file's name, for :func:`restore_damper`), ``loop`` (the epoch clock
        and sampler position), ``history``, ``epoch_updates`` and ``targets``.

    Raises
    ------
    UnsafeCheckpointError
        The file is not a regular file, belongs to another user or group/others may write it.
    CorruptCheckpointError
        The file is not an adadamp checkpoint of this format, or holds something it does not
        write (or, with ``like``, something that estimator cannot take).

    Examples
    --------
    >>> from adadamp import checkpoint
    >>> DaskClassifier(checkpoint="fit.ckpt", max_epochs=5).fit(X, y)  # doctest: +SKIP
    >>> saved = checkpoint.load("fit.ckpt")  # doctest: +SKIP
    >>> len(saved["history"])  # doctest: +SKIP
    5
    """
    with open_private(path) as f:
        budget = budget_for(size_of(f))
        payload = read_archive(f, path)
    reference = payload.get("history") if isinstance(payload, dict) else None
    if isinstance(reference, dict):  # the rows are in the journal beside the file (a fit loop's checkpoint)
        payload["history"] = []
    check_payload(payload, path, budget)
    if isinstance(reference, dict):
        payload["history"] = journal.read(path, reference)
    classes = payload["targets"].get("classes_")
    dtype = None if classes is None else label_dtype(classes, path)
    if fingerprint is not None:
        check_fingerprint(path, payload["fingerprint"], fingerprint)
    if like is not None:
        check_fits(payload, like, path)
    payload["damper"]["file"] = str(path)  # for restore_damper's messages
    if classes is not None:
        try:
            payload["targets"]["classes_"] = np.asarray(classes["values"], dtype=dtype)
        except (OverflowError, ValueError) as err:
            raise corrupt(path, f"classes_ does not fit its dtype {dtype} ({err})") from err
    return payload



def restore(state: TrainingState, saved: dict, n_data: int) -> list:
    """Overlay a checkpoint from ``load(path, like=state)`` on ``state``; returns the epoch's updates so far.

    What can still be refused (the example count, the damper state, restored on a copy) is before
    ``state`` changes, so a refused file leaves a fitted estimator's state as it was.
    """
    loop = LoopState(**saved["loop"])
    if loop.n_data != n_data:
        raise ValueError(f"The checkpoint was written for {loop.n_data} examples; X has {n_data}.")
    damper = copy.deepcopy(state.damper)
    restore_damper(damper, saved["damper"])
    state.module.load_state_dict(saved["module"])
    state.optimizer.load_state_dict(saved["optimizer"])
    state.damper = damper
    state.targets.update(saved["targets"])
    state.loop, state.history = loop, list(saved["history"])
    return saved["epoch_updates"]



class Writer:
    """The fit loop's checkpoints at ``path``: the state at every write, the finished epochs' rows
    appended to the journal beside it (:mod:`~adadamp.checkpoint.journal`), so that a write costs the
    same at any length of the fit.

    Examples
    --------
    >>> writer = Writer("fit.ckpt", state)  # doctest: +SKIP
    >>> writer.save(state, epoch_updates)  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, state: TrainingState):
        self.path = path
        self.journal = journal.Journal(path, state.history)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="adadamp-checkpoint")
        self._pending: Future | None = None

    def save(self, state: TrainingState, epoch_updates: list) -> None:
        """Take a snapshot of ``state`` now and write it while training goes on (the disk's sync off
        the fit's path); the previous write finishes first, and its error is raised here."""
        rows = self.journal.take(state.history)
        data = _serialized(state, epoch_updates, self.journal.reference())
        self.wait()
        self._pending = self._pool.submit(self._write, rows, data)

    def _write(self, rows: bytes, data: bytes) -> None:
        self.journal.write(rows)  # before the checkpoint that counts them
        write_private(self.path, lambda f: f.write(data))

    def wait(self) -> None:
        """Until the last snapshot is on disk."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


def save_parts(state: TrainingState, *, f_params=None, f_optimizer=None, f_history=None, f_checkpoint=None) -> None:
    """What ``save_params`` writes: each part named to its own file (skorch's names), private to this
    user (mode 0600) and complete, as checkpoints are written."""
    if f_params is not None:
        write_private(f_params, lambda f: torch.save(state.module.state_dict(), f))
    if f_optimizer is not None:
        write_private(f_optimizer, lambda f: torch.save(state.optimizer.state_dict(), f))
    if f_history is not None:
        text = json.dumps(state.history)
        write_private(f_history, lambda f: f.write(text if isinstance(f, io.TextIOBase) else text.encode()))
    if f_checkpoint is not None:
        save(f_checkpoint, state, [])


def load_parts(state: TrainingState, n_data: int, *, f_params=None, f_optimizer=None, f_history=None,
               f_checkpoint=None) -> None:
    """What ``load_params`` reads into ``state`` (the checkpoint first, then the named parts over it);
    ``n_data``: the examples the state was fitted on (a checkpoint must match).

    Each part is read and checked as a checkpoint is (a private regular file of this user, nothing
    expanding beyond its size, tensors of the module's and optimizer's shapes, history records of
    plain values) before ``state`` changes, so a refused part leaves it as it was.
    """
    module = optimizer = history = None
    if f_params is not None:
        module = _read_part(f_params, "module")
        check_module(module, state.module, f_params)
    if f_optimizer is not None:
        optimizer = _read_part(f_optimizer, "optimizer")
        check_optimizer_dict(optimizer, f_optimizer)
        check_optimizer(optimizer, state.optimizer, f_optimizer)
    if f_history is not None:
        history = _read_history(f_history)
    if f_checkpoint is not None:
        restore(state, load(f_checkpoint, like=state), n_data)
    if module is not None:
        state.module.load_state_dict(module)
    if optimizer is not None:
        state.optimizer.load_state_dict(optimizer)
    if history is not None:
        state.history = history




def _opened(source):
    """``source`` opened privately (a path), or as given (a file object of the caller's)."""
    if hasattr(source, "read"):
        return contextlib.nullcontext(source)
    return open_private(source)


def _read_part(source, what: str) -> dict:
    """A ``torch.save`` part of ``save_params`` (``what``: module or optimizer), checked to be a dict
    that expands to no more than its file and holds no tensor larger than its data."""
    with _opened(source) as f:
        budget = budget_for(size_of(f))
        value = read_archive(f, source)
    if not isinstance(value, dict):
        raise CorruptCheckpointError(f"Refusing {source}: it is not a {what} state dict (save_params writes one).")
    check_tensors(value, source, budget)
    return value


def _read_history(source) -> list:
    """``save_params(f_history=...)``'s JSON, as history records of plain values."""
    with _opened(source) as f:
        text = f.read()
    try:
        history = json.loads(text)
    except ValueError as err:
        raise CorruptCheckpointError(f"Refusing {source}: it is not the JSON save_params writes ({err}).") from err
    if not isinstance(history, list):
        raise CorruptCheckpointError(f"Refusing {source}: it is not a list of history records.")
    check_records(history, source, "history")
    return history
