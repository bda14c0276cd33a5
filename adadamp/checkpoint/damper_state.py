"""A damper's fitted state in a checkpoint: plain data out, and back only onto what the damper holds.

Parameters are not saved: the estimator rebuilds the damper from its own parameters, and
:func:`restore_damper` sets only the fitted attributes (names ending in ``_``) the rebuilt damper
has itself, each with a value of the kind it holds now, so a file cannot reach a class, a function
or a parameter through an attribute name.
"""

from __future__ import annotations

import numpy as np
import torch

from .checks import kind
from .files import CorruptCheckpointError


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
            other_kind = current is not None and value is not None and kind(current) != kind(value)
            if not _is_plain(current) or not _is_plain(value) or other_kind:
                raise refuse(f"{name} holds {type(current).__name__}, the file gives {type(value).__name__}")
            setattr(damper, attr, value)
        else:
            raise refuse(f"{name} is neither a value nor a nested schedule")


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
