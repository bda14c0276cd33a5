"""skorch-style parameter routing: ``module__hidden=8`` goes to the module, ``optimizer__lr=...`` to
the optimizer (as skorch routes them), with errors that name the routed key and the likely fix."""

from __future__ import annotations

import difflib
import inspect

from . import porting

#: The prefixes whose ``prefix__name`` parameters go to the object built from ``prefix``.
ROUTED = ("module", "criterion", "optimizer", "batch_size", "callbacks")


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
