"""The objects a fit trains, built from an estimator's parameters (as skorch's ``initialize_*``).

Each function takes the estimator's parameters (``get_params(deep=False)``, routed
``prefix__name`` keys included) and builds one object, with errors that name the parameter and
the fix; none touches the cluster.  The parameters' checks that build something (the callbacks,
the optimizer on a stand-in) are here too, as are the fit's seed and its resumption from a
``checkpoint`` file.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Mapping

import numpy as np
import torch
from sklearn.base import clone
from sklearn.utils import check_random_state
from torch import nn

from . import checkpoint, porting, routing
from .callbacks import resolve as resolve_callbacks
from .dampers import BaseDamper, Constant
from .dampers.clock import LoopState
from .data import FitData, Targets
from .modules import MLP
from .records import TrainingState
from .sample_weight import SampleWeightedLoss
from .wire import optimizer_plan
from .wire.seeding import seeded

__all__ = ["apply_optimizer_params", "build_criterion", "build_damper", "build_module", "build_optimizer",
           "check_output_shape", "check_params", "continued_state", "damper_spec", "draw_seed", "fingerprint",
           "initial_state", "ready", "resume", "routed", "weighted_criterion"]


def routed(params: Mapping, prefix: str) -> dict:
    """The ``prefix__name`` parameters, keyed by ``name``."""
    n = len(prefix) + 2
    return {k[n:]: v for k, v in params.items() if k.startswith(prefix + "__")}


def build_module(params: Mapping, n_features: int, n_outputs: int, seed: int) -> nn.Module:
    """``module`` (None: an :class:`~adadamp.modules.MLP`), its initial weights drawn from ``seed``."""
    spec, kwargs = params["module"], routed(params, "module")
    with seeded(seed):  # the lock keeps other threads' seeding out of these draws
        if spec is None:
            return routing.construct(MLP, {"n_features": n_features, "n_outputs": n_outputs, **kwargs}, "module")
        if isinstance(spec, nn.Module):
            return routing.construct(type(spec), kwargs, "module") if kwargs else copy.deepcopy(spec)
        if isinstance(spec, type) and issubclass(spec, nn.Module):
            return routing.construct(spec, kwargs, "module")
    raise ValueError(f"module must be None, a torch.nn.Module class or instance; got {spec!r}.")


def build_criterion(params: Mapping, default: type[nn.Module]) -> nn.Module:
    """``criterion`` (None: the estimator's ``default``)."""
    spec = params["criterion"] if params["criterion"] is not None else default
    kwargs = routed(params, "criterion")
    if isinstance(spec, nn.Module):
        return routing.construct(type(spec), kwargs, "criterion") if kwargs else copy.deepcopy(spec)
    if isinstance(spec, type) and issubclass(spec, nn.Module):
        return routing.construct(spec, kwargs, "criterion")
    raise ValueError(f"criterion must be a torch.nn.Module class or instance; got {spec!r}.")


def build_optimizer(params: Mapping, module: nn.Module) -> torch.optim.Optimizer:
    """``optimizer`` over the module's parameters."""
    return routing.construct(params["optimizer"], routed(params, "optimizer"), "optimizer", module.parameters())


def build_damper(params: Mapping, n_data: int) -> BaseDamper:
    """``batch_size``: an int (a :class:`~adadamp.dampers.Constant`), a damper class or instance."""
    spec, kwargs = params["batch_size"], routed(params, "batch_size")
    if isinstance(spec, BaseDamper):
        damper = clone(spec)
        try:
            damper.set_params(**kwargs)
        except ValueError as err:
            hint = porting.damper_hint(type(damper), (), kwargs)
            raise ValueError(f"batch_size__*: {hint or err}") from err
    elif isinstance(spec, type):
        damper = routing.construct(spec, kwargs, "batch_size")
    else:
        if kwargs:
            keys = ", ".join(f"batch_size__{k}" for k in kwargs)
            raise ValueError(f"{keys} given but batch_size={spec!r} is not a damper; pass e.g. batch_size=GeoDamp.")
        damper = Constant(batch_size=int(spec))
    damper.reset(n_data)
    return damper


def damper_spec(params: Mapping) -> str:
    """What the damper is built from, to notice a changed ``batch_size`` on a warm start."""
    return repr((params["batch_size"], sorted(routed(params, "batch_size").items())))


def apply_optimizer_params(state: TrainingState, params: Mapping) -> None:
    """``set_params(optimizer=..., optimizer__*=...)`` since the last fit takes effect now (as in skorch)."""
    if type(state.optimizer) is not params["optimizer"]:
        state.optimizer = build_optimizer(params, state.module)
        return
    for group in state.optimizer.param_groups:
        for key, value in routed(params, "optimizer").items():
            group[key] = value
            if key == "lr":
                group["adadamp_base_lr"] = value  # what the schedules' lr factor multiplies


def check_output_shape(
    module: nn.Module, criterion: nn.Module, X: np.ndarray, y: np.ndarray, expected: tuple | None, params: Mapping
) -> None:
    """A forward pass on two examples on the client, so a misfit module fails here, clearly.

    ``expected``: the output shape the criterion needs for ``y[:2]`` (None: any shape it takes).
    The pass is seeded (a training-mode dropout draws): it holds the generator lock, so another
    fit's thread drawing its initial weights meanwhile gets the same weights, and the caller's
    random stream is left where it was.
    """
    try:
        with torch.no_grad(), seeded(0):
            out = module(torch.tensor(X[:2]))
    except Exception as err:
        keys = sorted(routed(params, "module")) or ["..."]
        raise ValueError(
            f"The module {type(module).__name__} cannot take X's examples of shape {tuple(X.shape[1:])}: "
            f"{type(err).__name__}: {err}. Change its input size (module__{keys[0]}=...) or reshape X."
        ) from err
    target = torch.from_numpy(y[:2])
    if expected is not None and tuple(out.shape) != expected:
        raise ValueError(
            f"The module's output shape {tuple(out.shape)} does not fit the criterion "
            f"{type(criterion).__name__}: expected {expected} for targets of shape "
            f"{tuple(target.shape)}. Change the module's output size."
        )
    try:
        criterion(out, target)
    except Exception as err:
        raise ValueError(
            f"The criterion {type(criterion).__name__} cannot compare the module's output of "
            f"shape {tuple(out.shape)} with targets of shape {tuple(target.shape)}: {err}"
        ) from err


def check_params(params: Mapping) -> list:
    """The checks of the parameters that their constraint table (:mod:`adadamp.constraints`) does
    not express; returns the fit's callbacks, resolved (:func:`adadamp.callbacks.resolve`: clones)."""
    if params["checkpoint_every"] is not None and params["checkpoint"] is None:
        raise ValueError(f"checkpoint_every={params['checkpoint_every']} needs a checkpoint file: pass checkpoint='fit.ckpt'.")
    resolved = resolve_callbacks(params["callbacks"], routed(params, "callbacks"))
    optimizer = params["optimizer"]
    closure = inspect.signature(optimizer.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ValueError(
            f"optimizer={optimizer.__name__} needs a closure in step() (it evaluates the loss again within "
            "an update), which data-parallel updates on the workers cannot give. Use a first-order optimizer "
            "such as torch.optim.SGD or torch.optim.Adam."
        )
    # the optimizer's own checks (lr >= 0, ...) now, on one stand-in parameter, naming optimizer__*
    routing.construct(optimizer, routed(params, "optimizer"), "optimizer", [torch.zeros(1, requires_grad=True)])
    client = params["client"]
    if client is not None and getattr(client, "status", "running") in ("closing", "closed"):
        raise ValueError(
            f"client= is closed (status {client.status!r}): pass a running distributed.Client, or "
            "client=None to use the current one or the embedded cluster."
        )
    return resolved


def draw_seed(random_state) -> int:
    """A fresh fit's seed: from ``random_state``, or (None) from torch's global generator, so that
    ``torch.manual_seed`` makes fits reproducible as it makes a PyTorch script (and skorch)."""
    if random_state is None:
        return int(torch.randint(2**31 - 1, ()).item())
    return int(check_random_state(random_state).randint(2**31 - 1))


def fingerprint(params: Mapping, data) -> dict:
    """What decides a fit's trajectory (:func:`adadamp.checkpoint.fingerprint`): the training data
    and the parameters that shape it (not ``max_epochs``, nor the callbacks)."""
    keys = ("module", "criterion", "optimizer", "batch_size", "random_state", "validation_fraction")
    params = {k: v for k, v in params.items() if k in keys or routing.routed_prefix(k)}
    params = {k: v for k, v in params.items() if not k.startswith("callbacks__")}
    return checkpoint.fingerprint(data.X, data.y, params)


def resume(state: TrainingState, params: Mapping, source, fresh: bool) -> list:
    """With a ``checkpoint`` file: mark ``state`` with the fit's fingerprint and, on a fresh fit whose
    file exists, restore the saved state over it (refused if the file is another fit's).  Returns
    the updates the saved epoch had taken (none without a file)."""
    path = params["checkpoint"]
    if path is None:
        return []
    current = fingerprint(params, source)
    epoch_updates = []
    if fresh and os.path.exists(path):
        saved = checkpoint.load(path, like=state, fingerprint=current)
        epoch_updates = checkpoint.restore(state, saved, len(source))
    state.fingerprint = current
    return epoch_updates


def ready(state: TrainingState, made: FitData) -> tuple[SampleWeightedLoss | None, tuple | None]:
    """Check that the damper can drive the optimizer and bind them; returns the workers' criterion
    (None: the state's, unweighted) and the held-out examples as the loop scores them."""
    optimizer_plan.check_supported(state.optimizer, state.damper)
    state.damper.bind_optimizer(optimizer_plan.lr_family(state.optimizer))
    weighted = weighted_criterion(state.criterion, made.head[1]) if made.weighted else None
    return weighted, made.valid if weighted is None or made.valid is None else (*made.valid, weighted)


def initial_state(params: Mapping, made: FitData, targets: Targets) -> TrainingState:
    """A fresh fit's state: everything built from the parameters, checked on the data's first examples
    (``targets``: the default criterion and the output shape a criterion needs)."""
    X, y = made.head
    module = build_module(params, int(np.prod(X.shape[1:])), made.n_outputs, made.seed)
    criterion = build_criterion(params, targets.default_criterion)
    check_output_shape(module, criterion, X, y, targets.output_shape(criterion, y[:2], made.n_outputs), params)
    return TrainingState(
        module=module,
        criterion=criterion,
        optimizer=build_optimizer(params, module),
        damper=build_damper(params, len(made.source)),
        loop=LoopState(seed=made.seed, n_data=len(made.source)),
        targets=made.attrs,
    )


def continued_state(state: TrainingState, params: Mapping, made: FitData, built_from: str) -> TrainingState:
    """A warm call's ``state`` (a copy of the fitted one) updated to the parameters and data of this call.

    ``built_from``: :func:`damper_spec` of the fitted damper; a changed ``batch_size`` builds a new
    damper on the run's continuing clock.
    """
    state.targets.update(made.attrs)
    apply_optimizer_params(state, params)
    if damper_spec(params) != built_from:
        state.damper = build_damper(params, len(made.source)).continue_from(state.loop.progress)
    if state.loop.n_data != len(made.source):
        state.loop = state.loop.resized(len(made.source))
    return state


def weighted_criterion(criterion: nn.Module, y_packed: np.ndarray) -> SampleWeightedLoss:
    """The workers' criterion when the targets carry sample weights (:mod:`adadamp.sample_weight`)."""
    return SampleWeightedLoss(criterion, torch.from_numpy(y_packed[:0]).dtype, y_packed.ndim)
