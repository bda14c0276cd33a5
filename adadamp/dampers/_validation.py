"""Argument checks shared by the dampers (errors name the parameter)."""

from __future__ import annotations

import math
import numbers


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_real(value, name: str, ok, must: str, owner: str, hint: str = "") -> None:
    """Raise ``ValueError`` ("<owner>: <name> must be <must>; got <value>.<hint>") unless ``value``
    is a real number (not a bool) for which ``ok(value)`` holds."""
    if not _is_real(value) or not ok(value):
        raise ValueError(f"{owner}: {name} must be {must}; got {value!r}.{hint}")


def _ceil(x: float) -> int:
    """``ceil`` that ignores float noise (``4.000000000001`` -> 4)."""
    return math.ceil(round(float(x), 9))


def _check_int(value, name: str, low: int, owner: str = "") -> None:
    prefix = f"{owner}: " if owner else ""
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        hasattr(value, "__index__")
    ):
        raise ValueError(
            f"{prefix}{name} must be an integer >= {low}; got {value!r}."
        )
    if int(value) < low:
        raise ValueError(f"{prefix}{name} must be >= {low}; got {value!r}.")

