"""What each constructor parameter accepts, declared as a table and checked in one place.

In the spirit of scikit-learn's ``_parameter_constraints``: an estimator lists, per parameter, the
kinds of value it takes (:data:`None` or constraint objects); :func:`check` accepts a value that
any of them accepts and otherwise raises :class:`~adadamp.exceptions.InvalidParameterError`
naming the parameter, what it takes and the value it got.  Checks that relate several parameters
or need to build an object (the optimizer's own checks, callbacks) stay in the estimator.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from .dampers import BaseDamper
from .exceptions import InvalidParameterError

__all__ = ["Boolean", "Damper", "Integer", "OneOf", "OptimizerClass", "Seconds", "TorchDevice", "Unit", "check"]


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
