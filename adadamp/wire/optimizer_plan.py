"""What a damper's plan means for each family of PyTorch optimizers.

A plan (:class:`adadamp.dampers.UpdatePlan`) carries a learning-rate factor,
a momentum and a momentum-buffer scale.  The learning-rate factor multiplies
every param group's base ``lr`` (``adadamp_base_lr``), or the learning rate an
:class:`~adadamp.callbacks.LRScheduler` callback scheduled from it
(``adadamp_scheduled_lr``), times a :class:`~adadamp.callbacks.Warmup` callback's factor
(``adadamp_warmup``).  Momentum and the buffer are defined per
family, by the keys the optimizer's param groups have:

========================  ==========================  ===========================
family (keys)             momentum rule sets          velocity compensation scales
========================  ==========================  ===========================
SGD, RMSprop (momentum)   ``momentum``                ``momentum_buffer``
Adam, AdamW, NAdam, ...   ``beta1`` of ``betas``      ``exp_avg`` (first moment)
others (Adadelta, ...)    -- (ValueError)             -- (ValueError)
========================  ==========================  ===========================

For Adam the update is ``lr * m / sqrt(v)``, linear in the first moment ``m``
as SGD's is in its buffer, so rescaling ``m`` by ``B_old / B_new`` when the
learning rate grows by ``B_new / B_old`` keeps the first update after a
batch jump continuous, as Lin et al. 2019 App. B.4 does for SGD.
"""

from __future__ import annotations

import math
import warnings

import torch

__all__ = ["WARMUP_KEY", "apply_plan", "apply_settings", "check_supported", "group_settings", "lr_family"]

#: A param group's key for the learning-rate warmup's factor (:class:`adadamp.callbacks.Warmup`).
WARMUP_KEY = "adadamp_warmup"


def _family(defaults: dict) -> str | None:
    if "betas" in defaults:
        return "adam"
    if "momentum" in defaults:
        return "momentum"
    return None


def lr_family(optimizer: torch.optim.Optimizer) -> str:
    """``"sgd"`` for ``torch.optim.SGD`` (its step is the gradient times the learning rate),
    ``"adaptive"`` for any other (Adam, RMSprop, ...: the step is normalized by the gradient's
    magnitude), as a damper's :meth:`~adadamp.dampers.BaseDamper.bind_optimizer` is told."""
    return "sgd" if isinstance(optimizer, torch.optim.SGD) else "adaptive"


def check_supported(optimizer: torch.optim.Optimizer, damper) -> None:
    """Raise ``ValueError`` if the damper asks for momentum changes the optimizer has no meaning for.

    Warns where a learning-rate rule was derived for another optimizer family:
    AdaScale's linear gain for SGD, AdamScale's square-root gain and Seesaw's
    square-root cut for adaptive optimizers (Adam, AdamW, RMSprop, ...).
    """
    family = _family(optimizer.defaults)
    name = type(optimizer).__name__
    sgd = isinstance(optimizer, torch.optim.SGD)
    for d in _dampers(damper):
        rule = type(d).__name__
        if rule == "AdaScale" and not sgd:
            _warn(f"AdaScale scales the learning rate of SGD linearly with its gain (Johnson et al. 2020, Alg. 2); "
                  f"with optimizer={name} use AdamScale (square root of the gain), or optimizer=torch.optim.SGD.")
        elif rule in ("AdamScale", "Seesaw") and sgd:
            other = "AdaScale" if rule == "AdamScale" else "GeoDamp (growing the batch alone matches SGD's decay)"
            _warn(f"{rule}'s square-root learning-rate rule is for adaptive optimizers such as Adam; with "
                  f"optimizer=SGD use {other}.")
    if family is not None:
        return
    for d in _dampers(damper):
        if getattr(d, "momentum", None) is not None:
            raise ValueError(
                f"{type(d).__name__}(momentum={d.momentum!r}) sets a momentum, but {name} has none. Use "
                "optimizer=torch.optim.SGD (momentum) or an Adam variant (beta1), or leave momentum=None."
            )
        if getattr(d, "compensation", None) == "velocity":
            raise ValueError(
                f"{type(d).__name__}(compensation='velocity') rescales a momentum buffer, but {name} has none. "
                "Use compensation='ramp', or an optimizer with momentum (SGD) or a first moment (Adam)."
            )


def apply_plan(optimizer: torch.optim.Optimizer, plan, scale_buffers: bool = True) -> float:
    """Set the param groups' learning rate and momentum and scale the buffers; returns the first group's lr.

    ``scale_buffers=False``: leave the buffers (an all-reduce fit's replicas scale their own).
    """
    adam = _family(optimizer.defaults) == "adam"
    if scale_buffers:
        _scale_buffers(optimizer, plan.momentum_buffer_scale)
    for group in optimizer.param_groups:
        group["lr"] = group.get("adadamp_scheduled_lr", group["adadamp_base_lr"]) * group.get(WARMUP_KEY, 1.0) * plan.lr_factor
        if plan.momentum is not None:
            if adam:
                group["betas"] = (plan.momentum, group["betas"][1])
            elif "momentum" in group:
                group["momentum"] = plan.momentum
    return float(optimizer.param_groups[0]["lr"])


def group_settings(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each param group's learning rate and momentum (Adam's ``beta1``; NaN: none), flat.

    What an all-reduce fit's replicas need to take the step the client planned: the client
    applies the plan (and any learning-rate schedule) to its own optimizer and sends these.
    """
    adam = _family(optimizer.defaults) == "adam"
    out = []
    for group in optimizer.param_groups:
        momentum = group["betas"][0] if adam else group.get("momentum", float("nan"))
        out += [float(group["lr"]), float(momentum)]
    return out


def apply_settings(optimizer: torch.optim.Optimizer, settings, momentum_buffer_scale: float) -> None:
    """Set what :func:`group_settings` read on another copy of the optimizer, and scale its
    momentum buffers as the plan did (a replica's side of :func:`apply_plan`)."""
    adam = _family(optimizer.defaults) == "adam"
    _scale_buffers(optimizer, momentum_buffer_scale)
    for group, lr, momentum in zip(optimizer.param_groups, settings[0::2], settings[1::2]):
        group["lr"] = float(lr)
        if not math.isnan(momentum):
            if adam:
                group["betas"] = (float(momentum), group["betas"][1])
            elif "momentum" in group:
                group["momentum"] = float(momentum)


def _scale_buffers(optimizer: torch.optim.Optimizer, scale: float) -> None:
    """Velocity compensation: scale SGD's momentum buffers or Adam's first moments."""
    if scale == 1.0:
        return
    key = "exp_avg" if _family(optimizer.defaults) == "adam" else "momentum_buffer"
    for st in optimizer.state.values():
        buf = st.get(key)
        if buf is not None:
            buf.mul_(scale)


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=4)


def _dampers(damper):
    """The damper and the schedules it wraps."""
    yield damper
    for attr in ("schedule_", "batch_size"):
        inner = getattr(damper, attr, None)
        if hasattr(inner, "next_batch_size"):
            yield from _dampers(inner)
            return
