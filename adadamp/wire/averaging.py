"""Weight averaging (``weight_averaging="ema"`` or ``"swa"``), taken where the step is taken.

After each step (the client's on the parameter server, every replica's on the all-reduce backend)
the average moves as :class:`torch.optim.swa_utils.AveragedModel` moves it: the first averaged step
copies the weights; then an exponential moving average (``get_ema_multi_avg_fn(decay)``: ``lerp``
toward the weights by ``1 - decay``) or the running mean of every step's weights (SWA, Izmailov et
al. 2018).  Averaging starts with the first update of data epoch ``start_epoch``.

The average lives in the optimizer's per-parameter state (keys :data:`AVERAGE_KEY` and
:data:`COUNT_KEY`), so checkpoints, ``partial_fit``, warm starts and the all-reduce replicas'
state carry it as they carry momentum buffers.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import torch

from .parameters import BATCH_NORMS

logger = logging.getLogger(__name__)

AVERAGE_KEY = "adadamp_average"  #: a parameter's averaged value
COUNT_KEY = "adadamp_n_averaged"  #: the steps averaged so far (a 0-d float64 tensor, per parameter)

#: The values of ``weight_averaging`` and the ``weight_averaging__*`` keys each takes, with defaults.
KINDS = {"ema": {"decay": 0.999, "start_epoch": 0}, "swa": {"start_epoch": 0}}


def update_average(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], settings: dict,
                   data_epoch: int) -> None:
    """Move the average of ``params`` after a step of an update drawn in ``data_epoch``;
    ``settings``: ``kind`` and the keys :data:`KINDS` lists."""
    if data_epoch < settings["start_epoch"]:
        return
    with torch.no_grad():
        for p in params:
            state = optimizer.state[p]
            n = int(state[COUNT_KEY]) if COUNT_KEY in state else 0
            if n == 0:
                state[AVERAGE_KEY] = p.detach().clone()
            elif settings["kind"] == "ema":
                state[AVERAGE_KEY].lerp_(p.detach(), 1.0 - settings["decay"])
            else:
                state[AVERAGE_KEY].add_((p.detach() - state[AVERAGE_KEY]) / (n + 1))
            state[COUNT_KEY] = torch.tensor(n + 1, dtype=torch.float64)  # (a checkpoint holds float state)


def averaged_copy(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """A copy of ``module`` with the averaged weights (its buffers, BatchNorm's statistics, as they
    are), or None before the first averaged step."""
    params = [p for p in module.parameters() if p.requires_grad]
    averages = [optimizer.state.get(p, {}).get(AVERAGE_KEY) for p in params]
    if any(a is None for a in averages):
        return None
    copied = copy.deepcopy(module)
    with torch.no_grad():
        for p, a in zip((p for p in copied.parameters() if p.requires_grad), averages):
            p.copy_(a)
    return copied


def refresh_batch_norm(module: torch.nn.Module, X: np.ndarray | None, batch_size: int) -> None:
    """The averaged ``module``'s BatchNorm statistics recomputed for its weights over the training
    inputs ``X`` in batches of ``batch_size`` (:func:`torch.optim.swa_utils.update_bn`, as SWA's
    recipe ends); without BatchNorm nothing, and where the inputs are not in the client's memory
    (``X`` None: dask data, a torch Dataset) a warning: the statistics stay the trained module's."""
    if not any(isinstance(m, BATCH_NORMS) for m in module.modules()):
        return
    if X is None:
        logger.warning("weight_averaging: averaged_module_ keeps the trained module's BatchNorm statistics (the "
                       "training data is not in the client's memory); recompute them with "
                       "torch.optim.swa_utils.update_bn(loader, est.averaged_module_)")
        return
    batches = (torch.from_numpy(np.ascontiguousarray(X[i:i + batch_size])) for i in range(0, len(X), batch_size))
    torch.optim.swa_utils.update_bn(batches, module)
