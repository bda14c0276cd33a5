"""The training kit's parameters (``precision``, ``clip_grad_norm``, ``micro_batch_size``, ``compile``
with ``compile__*``, ``weight_averaging`` with ``weight_averaging__*``): checked beyond their constraint
table, and made the :class:`~adadamp.records.TrainingKit` the backends and workers read."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping

import torch

from ..records import TrainingKit
from ..wire.averaging import KINDS
from .parameters import routed


def training_kit(params: Mapping) -> TrainingKit:
    """The fit's :class:`~adadamp.records.TrainingKit` from the estimator's parameters, checked (a
    ``ValueError`` naming the parameter, before any cluster work)."""
    _check_compile(params)
    clip, micro = params["clip_grad_norm"], params["micro_batch_size"]
    return TrainingKit(params["precision"], None if clip is None else float(clip), None if micro is None else int(micro),
                       routed(params, "compile") if params["compile"] else None, averaging(params))


def averaging(params: Mapping) -> dict | None:
    """``weight_averaging``'s settings (:mod:`adadamp.wire.averaging`), checked; None without it."""
    kind = params["weight_averaging"]
    given = routed(params, "weight_averaging")
    if kind is None:
        if given:
            raise ValueError(f"weight_averaging__{min(given)} is set but weight_averaging=None: pass "
                             "weight_averaging='ema' or 'swa'.")
        return None
    known = KINDS[kind]
    unknown = set(given) - set(known)
    if unknown:
        raise ValueError(f"weight_averaging__{min(unknown)}: weight_averaging={kind!r} takes {sorted(known)}.")
    settings = {"kind": kind, **known, **given}
    decay = settings.get("decay")  # (EMA's)
    if decay is not None and (isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0 < decay < 1):
        raise ValueError(f"weight_averaging__decay must be a number in (0, 1); got {decay!r}.")
    start = settings["start_epoch"]
    if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
        raise ValueError(f"weight_averaging__start_epoch must be an integer >= 0; got {start!r}.")
    return settings


def _check_compile(params: Mapping) -> None:
    """``compile__*`` names parameters of :func:`torch.compile`."""
    known = set(inspect.signature(torch.compile).parameters) - {"model"}
    unknown = set(routed(params, "compile")) - known
    if unknown:
        name = min(unknown)
        raise ValueError(f"compile__{name}: torch.compile has no parameter {name!r}; it takes {sorted(known)}.")
