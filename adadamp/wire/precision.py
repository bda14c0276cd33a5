"""Mixed precision, as the workers compute and the client steps (``precision=``, Lightning's names).

"Mixed" keeps the weights, the optimizer and the gradient sums in float32 and runs the forward pass
(and so the backward's activations) under :func:`torch.autocast` for the fit's device.  float16
needs loss scaling as :class:`torch.amp.GradScaler` does it: the workers multiply the loss by the
scale before the backward pass, the client divides the summed gradient by it, skips the step and
halves the scale when any gradient is not finite, and doubles it after ``growth_interval`` clean
steps.  One decision per update, from the whole batch's gradient, whatever the workers.

The scale is part of the optimizer's state (two keys of its first param group), so a checkpoint,
``partial_fit`` and a warm start carry it as they carry the momentum buffers.
"""

from __future__ import annotations

import contextlib

import torch

#: The values of ``precision`` (Lightning's names) and the autocast dtype of each (None: none).
PRECISIONS = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}

SCALE_KEY = "adadamp_loss_scale"  #: the optimizer's first param group: the current loss scale
CLEAN_KEY = "adadamp_clean_steps"  #: ... and the steps since the scale last changed or a step was skipped

#: Below this scale a float16 fit stops with ConvergenceError: ~40 skipped steps in a row from the
#: initial scale, a loss that is not finite at any scale (GradScaler would skip forever).
MIN_SCALE = 2.0**-24


def autocast(device: torch.device, precision: str):
    """The context a worker's forward pass and loss run in: :func:`torch.autocast` for
    ``device``'s type and ``precision``'s dtype, or nothing at 32 bits."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class LossScale:
    """Dynamic loss scaling (:class:`torch.amp.GradScaler`'s rule and defaults) with its state in
    ``optimizer.param_groups[0]``: read with :attr:`value`, moved with :meth:`update`."""

    def __init__(self, optimizer: torch.optim.Optimizer, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.optimizer = optimizer
        self.group.setdefault(SCALE_KEY, float(init_scale))
        self.group.setdefault(CLEAN_KEY, 0)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval

    @property
    def group(self) -> dict:
        """Where the state is: read each time (``load_state_dict`` replaces the param groups' dicts)."""
        return self.optimizer.param_groups[0]

    @property
    def value(self) -> float:
        return float(self.group[SCALE_KEY])

    def update(self, found_inf: bool) -> None:
        """After an update: halve the scale when its gradient was not finite (its step skipped),
        double it after ``growth_interval`` clean steps in a row."""
        if found_inf:
            self.group[SCALE_KEY] = self.value * self.backoff_factor
            self.group[CLEAN_KEY] = 0
            return
        clean = int(self.group[CLEAN_KEY]) + 1
        if clean == self.growth_interval:
            self.group[SCALE_KEY] = self.value * self.growth_factor
            clean = 0
        self.group[CLEAN_KEY] = clean
