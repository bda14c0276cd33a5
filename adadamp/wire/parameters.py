"""A module's parameters and gradients as two flat float buffers (client and workers).

The weights travel, are summed and are stepped as one contiguous buffer: the module's parameters
are views into it, so copying weights in or gradients out is one ``memcpy``.
"""

from __future__ import annotations

import copy
import math

import torch

__all__ = ["attributes", "bind_parameters", "compact_copy", "examples_independent", "flatten_parameters", "float_buffers", "squared_norm", "trainable", "with_attributes"]


def flatten_parameters(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter and its gradient a view into two flat buffers.

    Returns ``(flat_params, flat_grads)``.  Gradients accumulate in place into
    the views as long as ``.grad`` is never set to None, so the flat gradient
    buffer is the gradient sum without any copy.
    """
    params = trainable(module)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    return bind_parameters(module, flat, torch.zeros_like(flat))


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("The module has no trainable parameters.")
    return params


def bind_parameters(
    module, flat: torch.Tensor, grads: torch.Tensor, copy_values: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Point the parameters (and gradients) of ``module`` into ``flat`` (and ``grads``).

    With ``copy_values`` the parameters keep their values (written into
    ``flat``); without, they take the values ``flat`` holds (a worker mapping
    the client's shared weights must not overwrite them).
    """
    offset = 0
    for p in trainable(module):
        n = p.numel()
        view = flat[offset : offset + n].view_as(p)
        if copy_values and view.data_ptr() != p.data_ptr():
            view.copy_(p.detach())
        p.data = view
        p.grad = grads[offset : offset + n].view_as(p)
        offset += n
    return flat, grads


def compact_copy(module: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """A copy of ``module`` and ``optimizer`` (the copy's optimizer on the copy's parameters) whose
    tensors own their data (and, like any optimizer copied or pickled, not its :func:`attributes`).

    A parameter bound to the flat buffers (:func:`bind_parameters`) is a view, and pickling a view
    writes its whole storage: a module of 62 tensors over 11M parameters pickled to 6 GB (every
    parameter and gradient carrying both buffers).  The copy pickles to the state's own size.
    """
    module, optimizer = copy.deepcopy((module, optimizer))  # one copy of each shared buffer
    for p in module.parameters():
        p.data = _own(p.data)
        if p.grad is not None:
            p.grad = _own(p.grad)
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = _own(value)
    return module, optimizer


def attributes(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's own public attributes, which pickling drops: torch's ``Optimizer`` pickles
    only ``defaults``, ``state`` and ``param_groups``, and an optimizer that keeps settings in
    attributes (pytorch-optimizer's LAMB and LARS: ``pre_norm``, ``maximize``) fails unpickled."""
    kept = ("defaults", "state", "param_groups")
    return {k: v for k, v in vars(optimizer).items() if k not in kept and not k.startswith("_")}


def with_attributes(optimizer: torch.optim.Optimizer, values: dict) -> torch.optim.Optimizer:
    """``optimizer`` (unpickled) with the :func:`attributes` its original had."""
    for key, value in values.items():
        setattr(optimizer, key, value)
    return optimizer


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, cloned where it is a view into a larger storage."""
    return tensor.clone() if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size() else tensor


def float_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    """Floating-point buffers (BatchNorm running statistics) that training updates."""
    return [b for b in module.buffers() if b.is_floating_point()]


#: The BatchNorm layers (their training forward normalizes by the pass's statistics).
BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)

#: Layers whose training forward couples the examples of a pass (batch statistics) or draws random
#: numbers (dropout, RReLU's slopes): a pass over two shards is not the two shards' passes.
_COUPLING = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd, torch.nn.RReLU)


def examples_independent(module: torch.nn.Module) -> bool:
    """Whether the module's training forward treats each example on its own, as far as its layers
    show: no floating-point buffers (running statistics), no batch or instance normalization, no
    dropout.  Then one forward and backward pass over several shards gives the sum of their
    gradients (up to float summation order); a worker also checks that its first pass draws no
    random numbers (a functional dropout) before it takes shards together.

    >>> examples_independent(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    True
    >>> examples_independent(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout()))
    False
    """
    return not float_buffers(module) and not any(isinstance(m, _COUPLING) for m in module.modules())


def squared_norm(t: torch.Tensor) -> float:
    """``||t||^2`` as a Python float: inf or nan when ``t`` holds one.

    Accumulated in ``t``'s own precision (torch's reductions sum in blocks: about 1e-7 relative
    for float32), and in float64 only when that overflowed.  Casting to float64 first costs a
    copy: 36 ms against 1 ms for 10M float32 values on one core, on every all-reduce update.

    >>> squared_norm(torch.tensor([3.0, 4.0])), f"{squared_norm(torch.tensor([3e30, 4e30])):.6g}"
    (25.0, '2.5e+61')
    >>> squared_norm(torch.tensor([1.0, float("nan")]))
    nan
    """
    norm = float(torch.linalg.vector_norm(t))
    if math.isinf(norm):  # overflowed, or an inf in t: float64 tells
        norm = float(torch.linalg.vector_norm(t, dtype=torch.float64))
    return norm * norm


#: values per block of :func:`exact_squared_norm` on the CPU (a 512 KB float64 buffer: stays in cache)
SQUARED_NORM_BLOCK = 1 << 16


def exact_squared_norm(t: torch.Tensor, *minus: torch.Tensor) -> torch.Tensor:
    """``||t - minus[0] - minus[1] - ...||^2`` summed in float64: a 0-dim tensor on ``t``'s device
    (``float()`` of it waits for a GPU; sums of several stay there until then).

    AdaScale's statistics subtract two such norms of nearly equal size, so they are summed in
    float64; on the CPU a block at a time through a small float64 buffer rather than a float64
    copy of ``t``: 7 ms against 90 ms for 10M float32 values on one core, on every update that
    asks.  On a GPU in one pass (a block per kernel launch would cost more than the copy).

    >>> float(exact_squared_norm(torch.tensor([3.0, 4.0]))), float(exact_squared_norm(torch.tensor([3.0, 4.0]), torch.ones(2)))
    (25.0, 13.0)
    """
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    if t.numel() == 0:
        return total
    step = SQUARED_NORM_BLOCK if t.device.type == "cpu" else t.numel()
    buffer = torch.empty(min(t.numel(), step), dtype=torch.float64, device=t.device)
    for lo in range(0, t.numel(), step):
        hi = min(lo + step, t.numel())
        block = buffer[: hi - lo]
        block.copy_(t[lo:hi])
        for m in minus:
            block.sub_(m[lo:hi])
        total += torch.dot(block, block)
    return total
