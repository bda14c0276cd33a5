"""What a checkpoint file declares, checked before anything is built from it.

A file is not trusted (docs/guide/security.rst): ``torch.load(weights_only=True)`` runs no code, but
what it returns may still declare more than the file holds -- a tensor whose shape outgrows its
data, a dtype of 2 GB a label, or one container referenced many times over (pickle's shared
references: 24 levels of a list holding its child twice is a 6.5 KB file that a copy expands to
gigabytes).  So every value is counted as often as it is reached, against the file's size, before
anything copies it; each field must be of the kind adadamp writes; and, read for an estimator, the
module's tensors, the optimizer's groups and the classes must be what that estimator has.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import torch

from ..dampers.clock import LoopState
from ..records import TrainingState
from .files import FORMAT, corrupt

_MAX_DEPTH = 32  # nesting of containers; adadamp writes fewer than 10 levels
_MAX_LABEL_BYTES = 4096  # one class label: 1024 characters
_MAX_TEXT = 4096  # characters of one text value of a history record
_RECORD_DEPTH = 3  # containers below a history record (a row's updates, an update's shares)
#: The dtype kinds ``classes_`` may have, and the Python types of their saved values (objects: plain scalars only).
_LABEL_TYPES = {"b": bool, "i": int, "u": int, "f": (int, float), "c": (int, float, complex), "U": str, "S": bytes,
                "O": (bool, int, float, str, bytes)}
_FIELDS = {"module": dict, "optimizer": dict, "damper": dict, "loop": dict, "history": list, "epoch_updates": list,
           "targets": dict, "fingerprint": dict}


def budget_for(size: int) -> int:
    """How many values a file of ``size`` bytes may expand to: pickle spends at least a byte on each
    value it writes out, so only references to a container written once can exceed it."""
    return size + 1024


def check_tensors(value, path, budget: int) -> None:
    """Every value below ``value`` counted as often as it is reached (what a copy builds; text by its
    length), at most ``budget``; no nesting deeper than ``_MAX_DEPTH`` (nor a cycle); and every
    tensor declaring no more data than the file holds for it."""
    stack, spent = [(value, 0)], 0
    while stack:
        value, depth = stack.pop()
        spent += 1 + (len(value) // 8 if isinstance(value, str | bytes) else 0)
        if spent > budget:
            raise corrupt(path, f"it expands to more than {budget} values (a container referenced many times over)")
        if isinstance(value, torch.Tensor):
            if (value.layout != torch.strided or value.is_meta
                    or value.numel() * value.element_size() > value.untyped_storage().nbytes()):
                raise corrupt(path, f"a tensor of shape {tuple(value.shape)} declares more data than the file holds "
                                    "for it")
        elif isinstance(value, dict | list | tuple):
            if depth > _MAX_DEPTH:
                raise corrupt(path, f"it nests containers more than {_MAX_DEPTH} deep, or in a cycle")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def check_records(records: list, path, key: str) -> None:
    """History rows as adadamp writes them: records of named numbers, text, tensors, and lists or
    records of those, at most ``_RECORD_DEPTH`` containers deep."""
    def plain(value, depth: int) -> bool:
        if value is None or isinstance(value, bool | int | float | torch.Tensor):
            return True
        if isinstance(value, str):
            return len(value) <= _MAX_TEXT
        if depth >= _RECORD_DEPTH:
            return False
        if isinstance(value, list | tuple):
            return all(plain(v, depth + 1) for v in value)
        return isinstance(value, dict) and all(isinstance(k, str) and plain(v, depth + 1) for k, v in value.items())

    for i, record in enumerate(records):
        if not (isinstance(record, dict) and all(isinstance(k, str) and plain(v, 0) for k, v in record.items())):
            raise corrupt(path, f"its {key}[{i}] is not a record of numbers, text and lists of them")


def _check_named_tensors(saved: dict, path) -> None:
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in saved.items()):
        raise corrupt(path, "its module is not a state dict of named tensors")


def check_module(saved: dict, module, path) -> None:
    """Named tensors with ``module``'s names, shapes and dtypes."""
    _check_named_tensors(saved, path)
    mine = module.state_dict()
    if saved.keys() != mine.keys():
        differ = sorted(set(saved) ^ set(mine))[:4]
        raise corrupt(path, f"its module has other tensors than this estimator's ({differ})")
    for name, t in saved.items():
        if (t.shape, t.dtype) != (mine[name].shape, mine[name].dtype):
            raise corrupt(path, f"its module tensor {name!r} is {tuple(t.shape)} {t.dtype}; this estimator's module "
                                f"has {tuple(mine[name].shape)} {mine[name].dtype}")


def check_payload(payload, path, budget: int) -> None:
    """The fields :func:`~adadamp.checkpoint.save` writes, of the types it writes them, no more values
    than ``budget`` (:func:`check_tensors`) and tensors no larger than their data."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise corrupt(path, f"it is not an adadamp checkpoint of format {FORMAT}")
    for key, expected in _FIELDS.items():
        if not isinstance(payload.get(key), expected):
            found = f"{type(payload[key]).__name__}, not a {expected.__name__}" if key in payload else "missing"
            raise corrupt(path, f"its field {key!r} is {found}")
    check_tensors(payload, path, budget)
    _check_named_tensors(payload["module"], path)
    check_optimizer_dict(payload["optimizer"], path)
    check_loop(payload["loop"], path)
    for key in ("history", "epoch_updates"):
        check_records(payload[key], path, key)
    targets = payload["targets"]
    if not set(targets) <= {"classes_", "_y_1d"} or not isinstance(targets.get("_y_1d", False), bool):
        raise corrupt(path, f"its targets {sorted(map(str, targets))} are not classes_ or _y_1d (a bool)")


def check_optimizer_dict(saved: dict, path) -> None:
    groups, state = saved.get("param_groups"), saved.get("state")
    if not (isinstance(groups, list) and isinstance(state, dict) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and all(type(i) is int for i in g["params"])
            for g in groups)):
        raise corrupt(path, "its optimizer is not an optimizer state dict")
    for i, entry in state.items():
        if not (type(i) is int and isinstance(entry, dict) and all(
                isinstance(k, str) and (v is None or isinstance(v, torch.Tensor | bool | int | float))
                for k, v in entry.items())):
            raise corrupt(path, f"its optimizer state {i!r} is not named tensors and numbers")


def check_loop(loop: dict, path) -> None:
    """The fields of :class:`LoopState`: counts are integers >= 0, the others numbers or None."""
    names = {f.name for f in dataclasses.fields(LoopState)}
    if not set(loop) <= names:
        raise corrupt(path, f"its loop has fields LoopState has not: {sorted(map(str, set(loop) - names))}")
    for f in dataclasses.fields(LoopState):
        value = loop.get(f.name, f.default)
        if f.type == "int":
            ok = type(value) is int and value >= 0
        else:
            ok = value is None or isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            raise corrupt(path, f"its loop.{f.name} is {repr(value)[:40] if f.name in loop else 'missing'}")


def label_dtype(saved, path) -> np.dtype:
    """The dtype of saved ``classes_``: of plain labels of at most ``_MAX_LABEL_BYTES`` each, with
    values of its kind (``np.dtype('V2000000000')`` would take 2 GB a label)."""
    if not (isinstance(saved, dict) and isinstance(saved.get("values"), list) and isinstance(saved.get("dtype"), str)):
        raise corrupt(path, "its classes_ is not a list of labels and a dtype")
    try:  # only the strings ``dtype.str`` gives for these kinds: numpy parses others with ``ast``
        dtype = np.dtype(saved["dtype"]) if re.fullmatch(r"[<>|=]?[biufcUSO]\d{0,4}", saved["dtype"]) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _LABEL_TYPES or not 0 < dtype.itemsize <= _MAX_LABEL_BYTES:
        raise corrupt(path, f"its classes_ dtype {saved['dtype'][:40]!r} is not one of plain labels")
    if not all(isinstance(v, _LABEL_TYPES[dtype.kind]) for v in saved["values"]):
        raise corrupt(path, f"its classes_ values are not all of its dtype {dtype}")
    return dtype


def check_fits(payload: dict, like: TrainingState, path) -> None:
    """What ``like`` can take: its module's tensor names, shapes and dtypes, its optimizer's
    parameter groups and state shapes, and its targets (the same number of classes)."""
    check_module(payload["module"], like.module, path)
    check_optimizer(payload["optimizer"], like.optimizer, path)
    targets, expected = payload["targets"], {k: like.targets[k] for k in ("classes_", "_y_1d") if k in like.targets}
    if targets.keys() != expected.keys():
        raise corrupt(path, f"it holds the targets {sorted(targets)}; this estimator has {sorted(expected)}")
    if "classes_" in targets and len(targets["classes_"]["values"]) != len(expected["classes_"]):
        raise corrupt(path, f"it holds {len(targets['classes_']['values'])} classes; this estimator's data and "
                             f"module have {len(expected['classes_'])}")


def check_optimizer(saved: dict, optimizer, path) -> None:
    """Groups of the same sizes and settings of the same kinds as ``optimizer``'s; each state
    tensor floating point and a scalar or of its parameter's shape, where dimensions of 1 are
    taken for Adafactor's factored moments: never more elements than the parameter."""
    current = optimizer.state_dict()["param_groups"]
    groups = saved["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in current]:
        raise corrupt(path, "its optimizer has other parameter groups than this estimator's")
    ids = [i for g in groups for i in g["params"]]
    params = dict(zip(ids, [p for g in optimizer.param_groups for p in g["params"]]))
    if len(params) != len(ids):
        raise corrupt(path, "its optimizer names a parameter twice")
    for group, mine in zip(groups, current):
        odd = [k for k, v in group.items() if k != "params" and not same_kind(v, mine.get(k))]
        odd += sorted(set(optimizer.defaults) - set(group))
        if odd:
            raise corrupt(path, f"its optimizer setting {odd[0]!r} is {repr(group.get(odd[0], 'missing'))[:40]}")
    for i, entry in saved["state"].items():
        if i not in params:
            raise corrupt(path, f"its optimizer has state for a parameter {i} it does not have")
        shape = params[i].shape
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                continue
            same_rank = value.dim() == len(shape) and all(a in (1, b) for a, b in zip(value.shape, shape))
            if not (value.is_floating_point() and (value.dim() == 0 or same_rank)):
                raise corrupt(path, f"its optimizer state {key!r} is {tuple(value.shape)} {value.dtype}, for a "
                                     f"parameter of shape {tuple(shape)}")


def same_kind(value, current) -> bool:
    """Whether an optimizer setting from the file is of the kind this optimizer's is (where it has
    none, or None: a plain scalar)."""
    if isinstance(current, list | tuple):
        return isinstance(value, list | tuple) and len(value) == len(current) and all(map(same_kind, value, current))
    if current is None:
        return value is None or isinstance(value, bool | int | float | str)
    return kind(value) == kind(current)


def kind(value) -> str:
    """The kind of a plain value, as far as a damper attribute may change between a fresh and a fitted damper."""
    if isinstance(value, bool | int | float | np.number):
        return "number"
    if isinstance(value, np.ndarray | torch.Tensor):
        return "array"
    if isinstance(value, list | tuple):
        return "sequence"
    return type(value).__name__
