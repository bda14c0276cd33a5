"""The original adadamp's spellings (stsievert/adadamp, 0.x) and what each is called here.

Every old name gets an error that names its replacement, raised before any
cluster work.  None is an alias: an alias would give ``get_params`` two names
for one parameter, and a grid search over either would miss the other.  The
table is also the "Coming from adadamp 0.x" page of the user guide.
"""

from __future__ import annotations

import inspect
import types

from .exceptions import OldSpellingError  # noqa: F401 -- defined with the others, importable from here too

#: Estimator parameters of the original ``DaskBaseDamper`` (and routing prefixes, ``loss__*``).
ESTIMATOR_PARAMS: dict[str, str] = {
    "loss": (
        "`loss` is called `criterion` here (as in skorch); use criterion=..., criterion__*=... "
        "(the criterion keeps its default mean reduction: the workers sum it themselves)"
    ),
    "max_batch_size": (
        "`max_batch_size` is a parameter of the damper here: batch_size=GeoDamp, "
        "batch_size__max_batch_size=... (or GeoDamp(..., max_batch_size=...))"
    ),
    "cluster": (
        "`cluster` is not a parameter here: pass client=Client(cluster) (or make a client current); "
        "the estimator scales client.cluster when the batch grows (scale_cluster=...)"
    ),
    "metrics": "`metrics` has no equivalent here: use score(X, y), history_ or a callback (adadamp.callbacks)",
}

#: Fitted attributes and methods of the original estimator.
ESTIMATOR_ATTRIBUTES: dict[str, str] = {
    "loss_": "`loss_` is called `criterion_` here (as in skorch)",
    "initialized_": "`initialized_` is gone: an estimator is fitted when `history_` exists (sklearn's check_is_fitted)",
    "n_workers_": "`n_workers_` is gone: the workers of the last update are meta_['n_workers'] (per update: history_)",
    "batch_size_": "`batch_size_()` is gone: the last batch size is meta_['batch_size'], the fitted damper damper_",
    "initialize": "`initialize()` is gone: fit builds the module, optimizer and damper (partial_fit on first call)",
    "run_single_epoch": "`run_single_epoch(X, y)` is partial_fit(X, y) here (one epoch per call)",
    "train_step": "`train_step` is gone: one model update is one record of history_[-1]['updates']",
}

#: Keys of the original ``meta_``.
META_KEYS: dict[str, str] = {
    "n_data": "meta_['n_data'] is called meta_['n_samples_seen'] here",
    "n_weight_changes": "meta_['n_weight_changes'] is gone: every update changes the weights; see meta_['n_updates']",
    "partial_fit__calls": "meta_['partial_fit__calls'] is gone: len(history_) counts the epochs trained",
    "score__calls": "meta_['score__calls'] is gone: score() does not record itself",
    "score__acc": "meta_['score__acc'] is gone: call est.score(X, y) (accuracy for DaskClassifier)",
    "score__loss": "meta_['score__loss'] is gone: history_ has train_loss (and valid_loss with validation_fraction)",
}

#: Why ``DaskBaseDamper`` (the original adadamp's estimator, the base class here) is not fitted itself.
BASE_CLASS = (
    "BaseDaskEstimator (DaskBaseDamper) is the base class of DaskClassifier and DaskRegressor "
    "and is not fitted itself: use DaskClassifier for labels, DaskRegressor for real-valued "
    "targets (with criterion=... for the loss the original adadamp's DaskBaseDamper scored with)."
)


def missing_attribute(owner: str, name: str) -> AttributeError:
    """The error for an attribute ``owner`` lacks: a name of the original adadamp gets its new spelling.

    Examples
    --------
    >>> missing_attribute("DaskClassifier", "loss_")
    AttributeError("DaskClassifier has no attribute 'loss_': `loss_` is called `criterion_` here (as in skorch).")
    """
    hint = ESTIMATOR_ATTRIBUTES.get(name)
    if hint is not None:
        return AttributeError(f"{owner} has no attribute {name!r}: {hint}.")
    return AttributeError(f"{owner!r} object has no attribute {name!r}")


class Meta(dict):
    """``meta_``'s mapping: a key of the original adadamp's ``meta_`` gets its new spelling."""

    def __missing__(self, key):
        hint = META_KEYS.get(key)
        raise KeyError(hint if hint is not None else key)


def meta(loop, history: list[dict], data: str | None = None) -> types.MappingProxyType:
    """A fitted estimator's ``meta_`` (read-only): ``n_updates``, ``n_samples_seen`` and ``epochs``
    from its epoch clock ``loop``, and ``batch_size``, ``lr``, ``n_workers`` and ``train_loss``
    from the last row of ``history``.

    Examples
    --------
    >>> from adadamp.dampers.clock import LoopState
    >>> m = meta(LoopState(seed=0, n_data=10), [{"batch_size": 4, "train_loss": 0.5}])
    >>> m["batch_size"], m["n_updates"]
    (4, 0)
    >>> m["n_data"]
    Traceback (most recent call last):
    KeyError: "meta_['n_data'] is called meta_['n_samples_seen'] here"
    """
    last = history[-1] if history else {}
    return types.MappingProxyType(Meta(
        n_updates=loop.n_updates, n_samples_seen=loop.n_samples_seen, epochs=loop.epoch,
        **{key: last.get(key) for key in ("batch_size", "lr", "n_workers", "train_loss")}, data=data,
    ))


_NO_DWELL = "`dwell` has no equivalent: the batch size is evaluated at every model update"
_NOT_AN_OPTIMIZER = (
    "dampers here are schedules, not optimizers: they take no model, dataset, optimizer, loss or device; "
    "pass the damper to the estimator, e.g. DaskClassifier(module=..., optimizer=..., batch_size=GeoDamp(initial=32))"
)

#: Damper parameters of the original, for every damper (the class's own table is checked first).
DAMPER_PARAMS: dict[str, str] = {
    "initial_batch_size": "`initial_batch_size` is called `initial` here",
    "dwell": _NO_DWELL,
    "model": _NOT_AN_OPTIMIZER,
    "dataset": _NOT_AN_OPTIMIZER,
    "opt": _NOT_AN_OPTIMIZER,
    "loss": _NOT_AN_OPTIMIZER,
    "device": _NOT_AN_OPTIMIZER,
    "random_state": "dampers take no random_state here: the estimator's random_state seeds the data order",
}

#: Per-class damper parameters of the original.
DAMPER_CLASS_PARAMS: dict[str, dict[str, str]] = {
    "GeoDamp": {
        "dampingdelay": "`dampingdelay` is called `delay` here (epochs between increases)",
        "dampingfactor": "`dampingfactor` is called `factor` here",
    },
    "GeoDampLR": {
        "dampingdelay": "`dampingdelay` is called `delay` here (epochs between decays)",
        "dampingfactor": "`dampingfactor` is called `factor` here",
    },
    "PadaDamp": {
        "growth_rate": "`growth_rate` is called `rate` here",
        "batch_growth_rate": "`batch_growth_rate` is called `rate` here",
    },
    "CntsDampLR": {"dampingfactor": "`dampingfactor` is called `rate` here"},
    "RadaDamp": {
        "reduction": "`reduction` has no equivalent: its damping is RadaDamp's formula (see its docstring)",
        "fn_class": "`fn_class` has no equivalent: the gradient norm is always used",
    },
    "AdaDamp": {
        "approx_loss": (
            "`approx_loss` has no equivalent: the loss is always the moving average of the batch "
            "losses the workers return (no pass over the data)"
        ),
    },
}


def damper_hint(cls: type, args: tuple, kwargs: dict) -> str | None:
    """The message for an old spelling in ``cls(*args, **kwargs)``, or None if there is none.

    Examples
    --------
    >>> from adadamp.dampers import GeoDamp
    >>> damper_hint(GeoDamp, (), {"dampingdelay": 5})
    '`dampingdelay` is called `delay` here (epochs between increases)'
    """
    own: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        own.update(DAMPER_CLASS_PARAMS.get(klass.__name__, {}))
    accepted = set(inspect.signature(cls.__init__).parameters)  # a user's damper may use these names
    for key in kwargs:
        if key not in accepted and key in own:
            return own[key]
        if key not in accepted and key in DAMPER_PARAMS:
            return DAMPER_PARAMS[key]
    if cls.__module__.startswith("adadamp.") and any(_is_training_object(a) for a in args):
        return _NOT_AN_OPTIMIZER
    return None


def estimator_hint(key: str) -> str | None:
    """The message for an old estimator parameter (``loss``, ``loss__reduction``, ...), or None.

    Examples
    --------
    >>> estimator_hint("loss__weight")
    '`loss__weight` is called `criterion__weight` here (as in skorch)'
    """
    if key in ESTIMATOR_PARAMS:
        return ESTIMATOR_PARAMS[key]
    prefix, sep, rest = key.partition("__")
    if sep and prefix == "loss":
        return f"`{key}` is called `criterion__{rest}` here (as in skorch)"
    return None


def _is_training_object(value) -> bool:
    import torch

    return isinstance(value, (torch.nn.Module, torch.utils.data.Dataset, torch.optim.Optimizer))
