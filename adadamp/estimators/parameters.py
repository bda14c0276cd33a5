"""The estimators' parameters: what each accepts, and where a routed ``prefix__name`` goes.

Routing is skorch's: ``module__hidden=8`` goes to the module, ``optimizer__lr=...`` to the
optimizer, with errors that name the routed key and the likely fix.  The constraints are in the
spirit of scikit-learn's ``_parameter_constraints``: an estimator lists, per parameter, the kinds
of value it takes (:data:`None` or constraint objects); :func:`check` accepts a value that any of
them accepts and otherwise raises :class:`~adadamp.exceptions.InvalidParameterError` naming the
parameter, what it takes and the value it got.  Checks that relate several parameters or need to
build an object (the optimizer's own checks, callbacks) stay in the estimator.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from .. import porting
from ..dampers import BaseDamper
from ..exceptions import InvalidParameterError

#: The prefixes whose ``prefix__name`` parameters go to the object built from ``prefix``.
ROUTED = ("module", "criterion", "optimizer", "batch_size", "callbacks", "compile", "weight_averaging")


def routed_prefix(key: str) -> str | None:
    """The prefix ``key`` is routed to, or None.

    Examples
    --------
    >>> routed_prefix("optimizer__lr"), routed_prefix("max_epochs")
    ('optimizer', None)
    """
    for prefix in ROUTED:
        if key.startswith(prefix + "__"):
            return prefix
    return None


def routed(params: Mapping, prefix: str) -> dict:
    """The ``prefix__name`` parameters, keyed by ``name``."""
    n = len(prefix) + 2
    return {k[n:]: v for k, v in params.items() if k.startswith(prefix + "__")}


def check_names(owner: str, names, known) -> None:
    """Refuse a parameter of ``owner`` that is neither one of ``known`` (its constructor's) nor routed:
    a name of the original adadamp gets its new spelling, a typo the closest name.

    Examples
    --------
    >>> check_names("DaskRegressor", ["max_epochs", "optimizer__lr"], {"max_epochs"})
    >>> check_names("DaskRegressor", ["max_epoch"], {"max_epochs"})
    Traceback (most recent call last):
    ValueError: Unknown parameter 'max_epoch' for DaskRegressor. Did you mean 'max_epochs'?
    """
    known = set(known)
    for key in names:
        if key in known or routed_prefix(key):
            continue
        hint = porting.estimator_hint(key)
        if hint is not None:
            raise ValueError(f"Unknown parameter {key!r} for {owner}: {hint}.")
        raise ValueError(f"Unknown parameter {key!r} for {owner}.{did_you_mean(key, known)}")


def construct(factory, params: dict, prefix: str, *args):
    """Call ``factory(*args, **params)``, naming the routed key on a bad name."""
    try:
        return factory(*args, **params)
    except porting.OldSpellingError as err:
        raise ValueError(f"{prefix}__*: {err}") from err
    except TypeError as err:
        accepted = accepted_names(factory)
        bad = [k for k in params if accepted is not None and k not in accepted]
        if bad:
            hint = did_you_mean(bad[0], accepted)
            raise ValueError(
                f"{prefix}__{bad[0]} is not a parameter of {getattr(factory, '__name__', factory)}.{hint}"
            ) from err
        raise ValueError(f"Could not build {prefix} {getattr(factory, '__name__', factory)}: {err}") from err
    except ValueError as err:
        if not params:
            raise
        # name the user's words: the routed values the message quotes, else all of them
        named = [k for k, v in params.items() if isinstance(v, int | float | str) and str(v) in str(err)]
        given = ", ".join(f"{prefix}__{k}={params[k]!r}" for k in named or params)
        raise ValueError(f"{given}: {getattr(factory, '__name__', factory)} refused it: {err}") from err


def accepted_names(factory) -> set[str] | None:
    """The keyword arguments ``factory`` takes (None: any, or unknown)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def did_you_mean(key: str, known) -> str:
    """A hint for a misspelled ``key``: a missing double underscore, or the closest known name.

    Examples
    --------
    >>> did_you_mean("optimizer_lr", {"max_epochs"})
    " Did you mean 'optimizer__lr'?"
    """
    for prefix in ROUTED:
        if key.startswith(prefix + "_") and not key.startswith(prefix + "__"):
            return f" Did you mean {prefix + '__' + key[len(prefix) + 1 :]!r}?"
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""



def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


@dataclass(frozen=True)
class Integer:
    """An integer ``>= low``; ``low`` may name another parameter (``max_workers >= min_workers``)."""

    low: int | str = 1

    def accepts(self, value, params: Mapping) -> bool:
        return _is_int(value) and value >= self._low(params)

    def describe(self, params: Mapping) -> str:
        low = f"{self.low}={params[self.low]}" if isinstance(self.low, str) else self.low
        return f"an integer >= {low}"

    def _low(self, params: Mapping) -> int:
        return params[self.low] if isinstance(self.low, str) else self.low


@dataclass(frozen=True)
class Seconds:
    """A finite number of seconds, ``> 0`` (``strict``) or ``>= 0``."""

    strict: bool = True

    def accepts(self, value, params: Mapping) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        return value > 0 if self.strict else value >= 0

    def describe(self, params: Mapping) -> str:
        return f"a finite number of seconds {'>' if self.strict else '>='} 0"


class Positive:
    """A finite number ``> 0``."""

    def accepts(self, value, params: Mapping) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0

    def describe(self, params: Mapping) -> str:
        return "a finite number > 0"


class Unit:
    """A fraction strictly between 0 and 1."""

    def accepts(self, value, params: Mapping) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < 1

    def describe(self, params: Mapping) -> str:
        return "a number in (0, 1)"


class Boolean:
    """``True`` or ``False`` (numpy's booleans too)."""

    def accepts(self, value, params: Mapping) -> bool:
        return isinstance(value, bool | np.bool_)

    def describe(self, params: Mapping) -> str:
        return "True or False"


@dataclass(frozen=True)
class OneOf:
    """One of a set of names; ``options`` is called each time, so a registry can grow."""

    options: Callable[[], Iterable[str]]

    def accepts(self, value, params: Mapping) -> bool:
        return isinstance(value, str) and value in set(self.options())

    def describe(self, params: Mapping) -> str:
        return f"one of {sorted(self.options())}"


class Damper:
    """A damper class or instance (:mod:`adadamp.dampers`)."""

    def accepts(self, value, params: Mapping) -> bool:
        return isinstance(value, BaseDamper) or (isinstance(value, type) and issubclass(value, BaseDamper))

    def describe(self, params: Mapping) -> str:
        return "a damper class or a damper instance (see adadamp.dampers)"


class OptimizerClass:
    """A subclass of ``torch.optim.Optimizer`` (the class, not an instance)."""

    def accepts(self, value, params: Mapping) -> bool:
        return isinstance(value, type) and issubclass(value, torch.optim.Optimizer)

    def describe(self, params: Mapping) -> str:
        return "a torch.optim.Optimizer class such as torch.optim.SGD"


class TorchDevice:
    """Anything ``torch.device`` accepts as a string or device."""

    def accepts(self, value, params: Mapping) -> bool:
        if not isinstance(value, str | torch.device):
            return False
        try:
            torch.device(value)
        except (RuntimeError, ValueError):
            return False
        return True

    def describe(self, params: Mapping) -> str:
        return "a torch device such as 'cpu', 'cuda' or 'cuda:1'"


def check(constraints: Mapping[str, tuple], params: Mapping, hints: Mapping[str, str] | None = None) -> None:
    """Raise :class:`InvalidParameterError` for the first parameter no constraint of its own accepts.

    Parameters
    ----------
    constraints : mapping
        Parameter name to a tuple of accepted kinds: ``None`` (the value None) or objects with
        ``accepts(value, params)`` and ``describe(params)``.
    params : mapping
        The estimator's parameters (``get_params(deep=False)``).
    hints : mapping, optional
        Parameter name to a sentence added to its error (what to pass instead).

    Examples
    --------
    >>> check({"max_epochs": (Integer(1),)}, {"max_epochs": 0})
    Traceback (most recent call last):
    ...
    adadamp.exceptions.InvalidParameterError: max_epochs must be an integer >= 1; got 0.
    """
    for name, kinds in constraints.items():
        value = params[name]
        if any(value is None if kind is None else kind.accepts(value, params) for kind in kinds):
            continue
        described = [("None" if kind is None else kind.describe(params)) for kind in kinds]
        hint = (hints or {}).get(name)
        raise InvalidParameterError(
            f"{name} must be {', '.join(described[:-1]) + ' or ' if len(described) > 1 else ''}{described[-1]}; "
            f"got {value!r}." + (f" {hint}" if hint else "")
        )
