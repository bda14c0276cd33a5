"""Checkpoints of the client's training state: plain data, written atomically, loaded safely.

The client is the only stateful process (workers hold caches), so a
checkpoint is everything ``fit`` needs to go on as if it had never stopped:
weights, optimizer state, the damper's fitted state, the epoch clock and
sampler position (the data order is a function of the seed and the data
epoch), and the history (docs/guide/checkpoints.rst).

A checkpoint file is not trusted (docs/guide/security.rst): it holds tensors and plain
Python data only and is read with ``torch.load(weights_only=True)``, so a planted file cannot
run code, and only a regular file of this user that only it may write is read.  What the file
declares is checked before anything is built from it (:class:`CorruptCheckpointError`): its
tensors take no more memory than the file, ``classes_`` has a dtype of plain labels and, loaded
for an estimator, every tensor and count matches what its module, optimizer and data need.
Writes go to a fresh temporary file in the same directory (``mkstemp``: never a fixed name,
never through a symbolic link), synced and renamed over the target, with the directory synced
too, so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from .dampers.clock import LoopState
from .data.digest import data_digest
from .records import TrainingState

FORMAT = 2
_MAX_DEPTH = 32  # nesting of containers; adadamp writes fewer than 10 levels
_MAX_LABEL_BYTES = 4096  # one class label: 1024 characters
#: The dtype kinds ``classes_`` may have, and the Python types of their saved values (objects: plain scalars only).
_LABEL_TYPES = {"b": bool, "i": int, "u": int, "f": (int, float), "c": (int, float, complex), "U": str, "S": bytes,
                "O": (bool, int, float, str, bytes)}
_FIELDS = {"module": dict, "optimizer": dict, "damper": dict, "loop": dict, "history": list, "epoch_updates": list,
           "targets": dict, "fingerprint": dict}


class UnsafeCheckpointError(PermissionError):
    """A checkpoint file that others could have written; it is not read.

    Examples
    --------
    >>> issubclass(UnsafeCheckpointError, PermissionError)
    True
    """


class CorruptCheckpointError(ValueError):
    """A checkpoint file that is not as adadamp writes it, or not for this estimator; nothing of it is used.

    Raised while loading, before any array is built from the file and before any cluster work or
    training step, so a crafted file costs neither memory nor a fitted state.

    Examples
    --------
    >>> issubclass(CorruptCheckpointError, ValueError)
    True
    """


def _corrupt(path, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Refusing the checkpoint {path}: {why}. adadamp writes checkpoints of format {FORMAT} for the estimator "
        "that reads them; this file was changed, written by another program or for another estimator. Delete it, "
        "or pass another checkpoint path, to start afresh."
    )


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
    with _open_private(path) as f:
        payload = _read(f, path)
    _check_payload(payload, path)
    classes = payload["targets"].get("classes_")
    dtype = None if classes is None else _label_dtype(classes, path)
    if fingerprint is not None:
        check_fingerprint(path, payload["fingerprint"], fingerprint)
    if like is not None:
        _check_fits(payload, like, path)
    payload["damper"]["file"] = str(path)  # for restore_damper's messages
    if classes is not None:
        try:
            payload["targets"]["classes_"] = np.asarray(classes["values"], dtype=dtype)
        except (OverflowError, ValueError) as err:
            raise _corrupt(path, f"classes_ does not fit its dtype {dtype} ({err})") from err
    return payload


def _open_private(path):
    """``path`` opened for reading if it is a regular file of this user that only it may write.

    Opened with ``O_NONBLOCK`` so that a FIFO planted at the path is refused instead of blocking
    ``open``; the checks are on the file opened (``fstat``), not on what the name points to later.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: it is not a regular file (mode {stat.filemode(info.st_mode)})."
            )
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
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read(f, path):
    """``torch.load(weights_only=True)`` of a zip archive whose parts are stored as they are (as
    ``torch.save`` writes them), so no tensor's data takes more memory than the file."""
    not_ours = (f"it is not an adadamp checkpoint of format {FORMAT} (it holds something other than tensors and "
                "plain data, or was written by an older adadamp)")
    try:
        with zipfile.ZipFile(f) as archive:
            packed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
        f.seek(0)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise _corrupt(path, not_ours) from err
    if packed:
        raise _corrupt(path, f"its part {packed[0]} is compressed (torch.save stores every part as it is)")
    try:
        return torch.load(f, weights_only=True)
    except Exception as err:
        raise _corrupt(path, f"{not_ours}: {err}") from err


def _check_payload(payload, path) -> None:
    """The fields :func:`save` writes, of the types it writes them, and tensors no larger than their data."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise _corrupt(path, f"it is not an adadamp checkpoint of format {FORMAT}")
    for key, kind in _FIELDS.items():
        if not isinstance(payload.get(key), kind):
            found = f"{type(payload[key]).__name__}, not a {kind.__name__}" if key in payload else "missing"
            raise _corrupt(path, f"its field {key!r} is {found}")
    for t in _tensors(payload, path):
        if t.layout != torch.strided or t.is_meta or t.numel() * t.element_size() > t.untyped_storage().nbytes():
            raise _corrupt(path, f"a tensor of shape {tuple(t.shape)} declares more data than the file holds for it")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in payload["module"].items()):
        raise _corrupt(path, "its module is not a state dict of named tensors")
    _check_optimizer_dict(payload["optimizer"], path)
    _check_loop(payload["loop"], path)
    for key in ("history", "epoch_updates"):
        if not all(isinstance(r, dict) and all(isinstance(k, str) for k in r) for r in payload[key]):
            raise _corrupt(path, f"its {key} is not a list of records")
    targets = payload["targets"]
    if not set(targets) <= {"classes_", "_y_1d"} or not isinstance(targets.get("_y_1d", False), bool):
        raise _corrupt(path, f"its targets {sorted(map(str, targets))} are not classes_ or _y_1d (a bool)")


def _tensors(payload, path):
    """Every tensor in ``payload``; a cycle, or nesting deeper than ``_MAX_DEPTH``, is refused."""
    done, stack = set(), [(payload, 0)]
    while stack:
        value, depth = stack.pop()
        if depth is None:  # all below ``value`` seen
            done.add(id(value))
        elif isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict | list | tuple) and id(value) not in done:
            if depth > _MAX_DEPTH:
                raise _corrupt(path, f"it nests containers more than {_MAX_DEPTH} deep, or in a cycle")
            stack.append((value, None))
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def _check_optimizer_dict(saved: dict, path) -> None:
    groups, state = saved.get("param_groups"), saved.get("state")
    if not (isinstance(groups, list) and isinstance(state, dict) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and all(type(i) is int for i in g["params"])
            for g in groups)):
        raise _corrupt(path, "its optimizer is not an optimizer state dict")
    for i, entry in state.items():
        if not (type(i) is int and isinstance(entry, dict) and all(
                isinstance(k, str) and (v is None or isinstance(v, torch.Tensor | bool | int | float))
                for k, v in entry.items())):
            raise _corrupt(path, f"its optimizer state {i!r} is not named tensors and numbers")


def _check_loop(loop: dict, path) -> None:
    """The fields of :class:`LoopState`: counts are integers >= 0, the others numbers or None."""
    names = {f.name for f in dataclasses.fields(LoopState)}
    if not set(loop) <= names:
        raise _corrupt(path, f"its loop has fields LoopState has not: {sorted(map(str, set(loop) - names))}")
    for f in dataclasses.fields(LoopState):
        value = loop.get(f.name, f.default)
        if f.type == "int":
            ok = type(value) is int and value >= 0
        else:
            ok = value is None or isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            raise _corrupt(path, f"its loop.{f.name} is {repr(value)[:40] if f.name in loop else 'missing'}")


def _label_dtype(saved, path) -> np.dtype:
    """The dtype of saved ``classes_``: of plain labels of at most ``_MAX_LABEL_BYTES`` each, with
    values of its kind (``np.dtype('V2000000000')`` would take 2 GB a label)."""
    if not (isinstance(saved, dict) and isinstance(saved.get("values"), list) and isinstance(saved.get("dtype"), str)):
        raise _corrupt(path, "its classes_ is not a list of labels and a dtype")
    try:  # only the strings ``dtype.str`` gives for these kinds: numpy parses others with ``ast``
        dtype = np.dtype(saved["dtype"]) if re.fullmatch(r"[<>|=]?[biufcUSO]\d{0,4}", saved["dtype"]) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _LABEL_TYPES or not 0 < dtype.itemsize <= _MAX_LABEL_BYTES:
        raise _corrupt(path, f"its classes_ dtype {saved['dtype'][:40]!r} is not one of plain labels")
    if not all(isinstance(v, _LABEL_TYPES[dtype.kind]) for v in saved["values"]):
        raise _corrupt(path, f"its classes_ values are not all of its dtype {dtype}")
    return dtype


def _check_fits(payload: dict, like: TrainingState, path) -> None:
    """What ``like`` can take: its module's tensor names, shapes and dtypes, its optimizer's
    parameter groups and state shapes, and its targets (the same number of classes)."""
    mine, theirs = like.module.state_dict(), payload["module"]
    if theirs.keys() != mine.keys():
        differ = sorted(set(theirs) ^ set(mine))[:4]
        raise _corrupt(path, f"its module has other tensors than this estimator's ({differ})")
    for name, t in theirs.items():
        if (t.shape, t.dtype) != (mine[name].shape, mine[name].dtype):
            raise _corrupt(path, f"its module tensor {name!r} is {tuple(t.shape)} {t.dtype}; this estimator's module "
                                 f"has {tuple(mine[name].shape)} {mine[name].dtype}")
    _check_optimizer(payload["optimizer"], like.optimizer, path)
    targets, expected = payload["targets"], {k: like.targets[k] for k in ("classes_", "_y_1d") if k in like.targets}
    if targets.keys() != expected.keys():
        raise _corrupt(path, f"it holds the targets {sorted(targets)}; this estimator has {sorted(expected)}")
    if "classes_" in targets and len(targets["classes_"]["values"]) != len(expected["classes_"]):
        raise _corrupt(path, f"it holds {len(targets['classes_']['values'])} classes; this estimator's data and "
                             f"module have {len(expected['classes_'])}")


def _check_optimizer(saved: dict, optimizer, path) -> None:
    """Groups of the same sizes and settings of the same kinds as ``optimizer``'s; each state
    tensor floating point and a scalar or of its parameter's shape, where dimensions of 1 are
    taken for Adafactor's factored moments: never more elements than the parameter."""
    current = optimizer.state_dict()["param_groups"]
    groups = saved["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in current]:
        raise _corrupt(path, "its optimizer has other parameter groups than this estimator's")
    ids = [i for g in groups for i in g["params"]]
    params = dict(zip(ids, [p for g in optimizer.param_groups for p in g["params"]]))
    if len(params) != len(ids):
        raise _corrupt(path, "its optimizer names a parameter twice")
    for group, mine in zip(groups, current):
        odd = [k for k, v in group.items() if k != "params" and not _same_kind(v, mine.get(k))]
        odd += sorted(set(optimizer.defaults) - set(group))
        if odd:
            raise _corrupt(path, f"its optimizer setting {odd[0]!r} is {repr(group.get(odd[0], 'missing'))[:40]}")
    for i, entry in saved["state"].items():
        if i not in params:
            raise _corrupt(path, f"its optimizer has state for a parameter {i} it does not have")
        shape = params[i].shape
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                continue
            same_rank = value.dim() == len(shape) and all(a in (1, b) for a, b in zip(value.shape, shape))
            if not (value.is_floating_point() and (value.dim() == 0 or same_rank)):
                raise _corrupt(path, f"its optimizer state {key!r} is {tuple(value.shape)} {value.dtype}, for a "
                                     f"parameter of shape {tuple(shape)}")


def _same_kind(value, current) -> bool:
    """Whether an optimizer setting from the file is of the kind this optimizer's is (where it has
    none, or None: a plain scalar)."""
    if isinstance(current, list | tuple):
        return isinstance(value, list | tuple) and len(value) == len(current) and all(map(_same_kind, value, current))
    if current is None:
        return value is None or isinstance(value, bool | int | float | str)
    return _kind(value) == _kind(current)


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
        The state is for another schedule.
    CorruptCheckpointError
        The state names or values something else (the message names the file when it came
        from :func:`load`).
    """
    source = saved.get("file", "the checkpoint") if isinstance(saved, dict) else "the checkpoint"
    _restore_fitted(damper, saved, source, type(damper).__name__)


def _restore_fitted(damper, saved, source: str, where: str) -> None:
    def refuse(why: str):
        return CorruptCheckpointError(
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
        restore(state, load(f_checkpoint, like=state), n_data)
    if f_params is not None:
        state.module.load_state_dict(torch.load(f_params, weights_only=True))
    if f_optimizer is not None:
        state.optimizer.load_state_dict(torch.load(f_optimizer, weights_only=True))
    if f_history is not None:
        with open(f_history) as f:
            state.history = json.load(f)
