"""Momentum rules (Tang et al., "Increasing momentum-like factors", §4)."""

from __future__ import annotations

from ._validation import _check_real, _is_real


def tang_momentum(n_workers: int, batch_size: int | None = None) -> float:
    """Momentum that rises with the number of workers (the ``"tang"`` preset).

    A step function of the worker count ``P`` interpolating the data points
    of Tang et al. ("Increasing momentum-like factors", §4.3-4.4, Tables 1-4): 0.9 for ``P <= 4``, 0.95 for ``5 <= P <= 16``,
    0.975 for ``17 <= P <= 31`` and 0.99 for ``P >= 32``.  The paper gives
    data points, not a formula; this preset is a heuristic and opt-in.

    Parameters
    ----------
    n_workers : int
        Live workers at this update.
    batch_size : int, optional
        Unused; present so the function has the signature of a momentum rule.

    Returns
    -------
    float

    Examples
    --------
    >>> tang_momentum(1), tang_momentum(8), tang_momentum(20), tang_momentum(64)
    (0.9, 0.95, 0.975, 0.99)
    """
    p = int(n_workers)
    if p <= 4:
        return 0.9
    if p <= 16:
        return 0.95
    if p <= 31:
        return 0.975
    return 0.99


_MOMENTUM_PRESETS = {"tang": tang_momentum}


def _check_momentum(momentum, owner: str) -> None:
    if momentum is None:
        return
    if isinstance(momentum, str):
        if momentum not in _MOMENTUM_PRESETS:
            raise ValueError(
                f"{owner}: momentum={momentum!r} is not a known preset; use one "
                f"of {sorted(_MOMENTUM_PRESETS)}, a float in [0, 1), a callable "
                "momentum(n_workers, batch_size) or None."
            )
        return
    if callable(momentum):
        return
    _check_real(momentum, "momentum", lambda m: 0 <= m < 1,
                "None, a float in [0, 1), a callable momentum(n_workers, batch_size) or 'tang'", owner)


def _resolve_momentum(momentum, n_workers: int, batch_size: int) -> float | None:
    """The momentum of this update from a momentum rule (or None)."""
    if momentum is None:
        return None
    if isinstance(momentum, str):
        value = _MOMENTUM_PRESETS[momentum](n_workers, batch_size)
    elif callable(momentum):
        value = momentum(n_workers, batch_size)
    else:
        return float(momentum)
    if not _is_real(value) or not 0 <= value < 1:
        raise ValueError(
            f"momentum rule {momentum!r} returned {value!r} for "
            f"n_workers={n_workers}, batch_size={batch_size}; it must return "
            "a float in [0, 1)."
        )
    return float(value)


