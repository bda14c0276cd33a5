"""Checkpoints of the client's training state: plain data, written atomically, loaded safely.

The client is the only stateful process (workers hold caches), so a
checkpoint is everything ``fit`` needs to go on as if it had never stopped:
weights, optimizer state, the damper's fitted state, the epoch clock and
sampler position (the data order is a function of the seed and the data
epoch), and the history (docs/guide/checkpoints.rst).

A checkpoint file is not trusted (docs/guide/security.rst): it holds tensors and plain
Python data only and is read with ``torch.load(weights_only=True)``, so a
planted file cannot run code; a file owned by another user or writable by
group or others is refused before it is read.  Writes go to a fresh
temporary file in the same directory (``mkstemp``: never a fixed name, never
through a symbolic link), which is synced and renamed over the target, and
the directory is synced too, so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import torch

from .dampers.clock import LoopState
from .data.digest import data_digest
from .records import TrainingState

FORMAT = 2


class UnsafeCheckpointError(PermissionError):
    """A checkpoint file that others could have written; it is not read.

    Examples
    --------
    >>> issubclass(UnsafeCheckpointError, PermissionError)
    True
    """


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


def save(path: str | os.PathLike, state: TrainingState, epoch_updates: list) -> None:
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

    Examples
    --------
    >>> est.save_params(f_checkpoint="fit.ckpt")  # doctest: +SKIP
    """
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
        "history": plain(state.history),
        "epoch_updates": plain(list(epoch_updates)),
        "targets": plain(targets),
        "fingerprint": state.fingerprint or {},
    }
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _sync_directory(path.parent)


def load(path: str | os.PathLike) -> dict:
    """Read a checkpoint written by :func:`save`, without running any code it holds.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    dict
        ``module`` and ``optimizer`` (state dicts), ``damper`` (the damper's
        fitted state and this file's name, for :func:`restore_damper`), ``loop`` (the epoch clock
        and sampler position), ``history``, ``epoch_updates`` and ``targets``.

    Raises
    ------
    UnsafeCheckpointError
        The file belongs to another user or group/others may write it.
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
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())  # of the file opened, not of what the name points to later
        if info.st_uid != os.geteuid():
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: it belongs to user id {info.st_uid}, not to this user "
                f"({os.geteuid()}). Copy it if you trust it, or pass another checkpoint path."
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: group or others may write it (mode "
                f"{stat.filemode(info.st_mode)}). Check it, then `chmod go-w {path}`."
            )
        try:
            payload = torch.load(f, weights_only=True)
        except Exception as err:
            raise ValueError(
                f"{path} is not an adadamp checkpoint of format {FORMAT} (it holds something other than tensors "
                f"and plain data, or was written by an older adadamp): {err}"
            ) from err
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an adadamp checkpoint of format {FORMAT}.")
    if isinstance(payload.get("damper"), dict):
        payload["damper"]["file"] = str(path)  # for restore_damper's messages
    targets = payload["targets"]
    if "classes_" in targets:
        targets["classes_"] = np.asarray(targets["classes_"]["values"], dtype=np.dtype(targets["classes_"]["dtype"]))
    return payload


def plain(value):
    """``value`` as data ``torch.load(weights_only=True)`` reads: numpy becomes Python or tensors."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    return value


def damper_state(damper) -> dict:
    """The fitted attributes of a damper (names ending in ``_``), nested dampers included.

    Parameters are not saved: the estimator rebuilds the damper from its own
    parameters and :func:`restore_damper` puts this state on it.
    """
    fitted = {}
    for name, value in vars(damper).items():
        if not name.endswith("_") or name.startswith("_"):
            continue
        if hasattr(value, "next_batch_size"):  # a nested schedule (AdaScale, DynamicSGD)
            fitted[name] = {"damper": damper_state(value)}
        elif _is_plain(value):
            fitted[name] = {"value": plain(value)}
    return {"classes": _class_names(damper), "fitted": fitted}


def restore_damper(damper, saved: dict) -> None:
    """Put a fitted state from :func:`damper_state` on a damper built from the same parameters.

    Only the fitted attributes the rebuilt damper has itself are set, on the damper (or on
    its nested schedules), each with a value of the kind it holds now: a file cannot reach a
    class, a function or a parameter through an attribute name.

    Raises
    ------
    ValueError
        The state is for another schedule, or names or values something else (the message
        names the file when it came from :func:`load`).
    """
    source = saved.get("file", "the checkpoint") if isinstance(saved, dict) else "the checkpoint"
    _restore_fitted(damper, saved, source, type(damper).__name__)


def _restore_fitted(damper, saved, source: str, where: str) -> None:
    def refuse(why: str):
        return ValueError(
            f"Refusing the damper state in {source}: {why}. adadamp writes only the damper's own fitted "
            "attributes; the file was changed or written by another program. Delete it to start afresh."
        )

    if not (isinstance(saved, dict) and isinstance(saved.get("classes"), list) and isinstance(saved.get("fitted"), dict)):
        raise refuse(f"{where} is not a damper state")
    mine, theirs = _class_names(damper), saved["classes"]
    if mine[0] not in theirs and (not theirs or theirs[0] not in mine):  # the same schedule, or one derived
        raise ValueError(
            f"The checkpoint {source} was written for the batch-size schedule {theirs[0] if theirs else '?'}; "
            f"this estimator has {mine[0]}. Pass the batch_size it was trained with, or another checkpoint path."
        )
    declared = {k: v for k, v in vars(damper).items() if k.endswith("_") and not k.startswith("_")}
    for attr, entry in saved["fitted"].items():
        name = f"{where}.{attr}"
        if attr not in declared:
            raise refuse(f"{name} is not a fitted attribute of {type(damper).__name__}")
        current = declared[attr]
        if isinstance(entry, dict) and entry.keys() == {"damper"}:
            if not hasattr(current, "next_batch_size") or isinstance(current, type):
                raise refuse(f"{name} is not a nested schedule")
            _restore_fitted(current, entry["damper"], source, name)
        elif isinstance(entry, dict) and entry.keys() == {"value"}:
            value = _numpy(entry["value"])
            other_kind = current is not None and value is not None and _kind(current) != _kind(value)
            if not _is_plain(current) or not _is_plain(value) or other_kind:
                raise refuse(f"{name} holds {type(current).__name__}, the file gives {type(value).__name__}")
            setattr(damper, attr, value)
        else:
            raise refuse(f"{name} is neither a value nor a nested schedule")


def _kind(value) -> str:
    """The kind of a plain value, as far as a damper attribute may change between a fresh and a fitted damper."""
    if isinstance(value, bool | int | float | np.number):
        return "number"
    if isinstance(value, np.ndarray | torch.Tensor):
        return "array"
    if isinstance(value, list | tuple):
        return "sequence"
    return type(value).__name__


def _class_names(damper) -> list[str]:
    """The damper's class and its bases, most derived first, as importable names."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(damper).__mro__]


def _is_plain(value) -> bool:
    if value is None or isinstance(value, bool | int | float | str | np.generic | np.ndarray | torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _numpy(value):
    """Undo :func:`plain` for a damper attribute: tensors become numpy arrays again."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, list | tuple):
        return type(value)(_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return value


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def restore(state: TrainingState, saved: dict, n_data: int) -> list:
    """Overlay a loaded checkpoint on freshly built ``state``; returns the epoch's updates so far."""
    loop = LoopState(**saved["loop"])
    if loop.n_data != n_data:
        raise ValueError(f"The checkpoint was written for {loop.n_data} examples; X has {n_data}.")
    state.module.load_state_dict(saved["module"])
    state.optimizer.load_state_dict(saved["optimizer"])
    restore_damper(state.damper, saved["damper"])
    state.targets.update(saved["targets"])
    state.loop, state.history = loop, list(saved["history"])
    return saved["epoch_updates"]


def save_parts(state: TrainingState, *, f_params=None, f_optimizer=None, f_history=None, f_checkpoint=None) -> None:
    """What ``save_params`` writes: each part named to its own file (skorch's names)."""
    if f_params is not None:
        torch.save(state.module.state_dict(), f_params)
    if f_optimizer is not None:
        torch.save(state.optimizer.state_dict(), f_optimizer)
    if f_history is not None:
        with open(f_history, "w") as f:
            json.dump(state.history, f)
    if f_checkpoint is not None:
        save(f_checkpoint, state, [])


def load_parts(state: TrainingState, n_data: int, *, f_params=None, f_optimizer=None, f_history=None,
               f_checkpoint=None) -> None:
    """What ``load_params`` reads into ``state`` (the checkpoint first, then the named parts over it);
    ``n_data``: the examples the state was fitted on (a checkpoint must match)."""
    if f_checkpoint is not None:
        restore(state, load(f_checkpoint), n_data)
    if f_params is not None:
        state.module.load_state_dict(torch.load(f_params, weights_only=True))
    if f_optimizer is not None:
        state.optimizer.load_state_dict(torch.load(f_optimizer, weights_only=True))
    if f_history is not None:
        with open(f_history) as f:
            state.history = json.load(f)
