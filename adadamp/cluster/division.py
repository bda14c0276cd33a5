"""How the workers of a cluster are divided among the fits that share it: pure functions, no Dask.

Max-min fair shares of what the cluster may have; the fits that predict their speedup divide theirs
by it (Pollux, Qiao et al. OSDI'21, section 4.2, without restarts); each fit keeps what it holds up
to its share; a worker no fit wants is lent to a fit that can use it.  Every step grows as
fits x workers, so the scheduler's event loop stays responsive with thousands of fits.
"""

from __future__ import annotations

import itertools
import math


def shares(wants: dict[str, int], capacity: float, speedups: dict[str, list[float]] | None = None) -> dict[str, int]:
    """Max-min fair shares of ``capacity`` workers among fits that want ``wants`` (in the dict's
    order: the earlier fit gets a remainder first); the fits with a predicted speedup curve
    (``speedups``) then divide their shares together by it (:func:`by_speedup`).

    Examples
    --------
    >>> shares({"a": 6, "b": 1, "c": 4}, 8)
    {'a': 4, 'b': 1, 'c': 3}
    >>> shares({"a": 2, "b": 3}, math.inf)
    {'a': 2, 'b': 3}
    >>> shares({"a": 4, "b": 4}, 4, speedups={"a": [1, 1.1, 1.2, 1.3], "b": [1, 2, 3, 3.9]})
    {'a': 1, 'b': 3}
    """
    fair = _fair(wants, capacity)
    return fair if not speedups else by_speedup(fair, wants, speedups)


def by_speedup(fair: dict[str, int], wants: dict[str, int], speedups: dict[str, list[float]]) -> dict[str, int]:
    """The fair shares of the fits with a speedup curve pooled and dealt again among them: one
    worker each, then one at a time to the fit whose predicted speedup grows most with it.

    ``speedups[f][k - 1]`` is fit ``f``'s predicted speedup (goodput against one worker's) on
    ``k`` workers.  Pollux re-divides a cluster to maximize the sum of its jobs' speedups (Qiao et
    al. OSDI'21, section 4.2); on curves that grow less with each worker, this greedy deal is that
    maximum.  A worker no fit's speedup grows with stays in no share (the others' fair shares
    stand).  Here a share changes between two updates, where Pollux restarts the job.
    """
    fits = [f for f in wants if wants[f] > 0 and speedups.get(f)]
    pool = sum(fair[f] for f in fits)
    out = {f: (0 if f in fits else n) for f, n in fair.items()}
    for f in fits:
        if pool >= 1:
            out[f], pool = 1, pool - 1
    while pool >= 1:
        gain = {f: speedups[f][out[f]] - speedups[f][out[f] - 1] for f in fits
                if 0 < out[f] < min(wants[f], len(speedups[f]))}
        best = max(gain, key=lambda f: (gain[f], -fits.index(f)), default=None)
        if best is None or gain[best] <= 0:
            break
        out[best] += 1
        pool -= 1
    return out


def _fair(wants: dict[str, int], capacity: float) -> dict[str, int]:
    if math.isinf(capacity):
        return {f: max(0, w) for f, w in wants.items()}
    left, out = capacity, dict.fromkeys(wants, 0)
    hungry = [f for f, w in wants.items() if w > 0]
    while hungry and left >= 1:
        each = max(1, int(left // len(hungry)))
        for f in list(hungry):
            give = min(each, wants[f] - out[f], left)
            out[f] += int(give)
            left -= give
            if out[f] >= wants[f]:
                hungry.remove(f)
            if left < 1:
                break
    return out


def divide(workers: list[str], wants: dict[str, int], held: dict[str, list[str]], capacity: float,
           least: dict[str, int] | None = None, speedups: dict[str, list[float]] | None = None,
           potential: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Disjoint grants of ``workers`` (live, in the order to hand them out) to the fits' ``wants``.

    ``speedups`` and ``potential``: the fits that predict their speedup divide by it
    (:func:`shares`) what they could use (``potential``, their ``max_workers``), and are granted
    at most what they want now.

    Each fit keeps the workers it ``held`` up to its share of ``capacity`` (the most workers the
    cluster may have); free workers go to the fits below their share, earliest fit first.  A fit
    left below its ``least`` workers (its ``min_workers``; one for any fit that wants some: its
    workers are still starting, or there are more fits than workers) shares the least shared
    workers meanwhile, rather than wait or train on fewer than it was told to: ``min_workers`` is a
    promise about the worker count, and so about the weights (the same seed on the same number of
    workers trains the same weights).  A floor never takes a worker from another fit's grant; it
    shares it, which slows both fits' updates but changes neither's result.  The work grows as
    fits x workers.

    Examples
    --------
    >>> divide(["w1", "w2", "w3"], {"a": 3, "b": 1}, {"a": ["w1", "w2", "w3"]}, capacity=8)  # b's worker is starting
    {'a': ['w1', 'w2', 'w3'], 'b': ['w1']}
    >>> divide(["w1", "w2", "w3"], {"a": 3, "b": 1}, {"a": ["w1", "w2", "w3"]}, capacity=3)
    {'a': ['w1', 'w2'], 'b': ['w3']}
    >>> divide(["w1"], {"a": 1, "b": 1}, {"a": ["w1"]}, capacity=1)
    {'a': ['w1'], 'b': ['w1']}
    >>> divide(["w1", "w2"], {"a": 2, "b": 2}, {}, capacity=2, least={"a": 2, "b": 2})
    {'a': ['w1', 'w2'], 'b': ['w2', 'w1']}
    """
    share = shares({**wants, **(potential or {})}, max(capacity, len(workers)), speedups)
    share = {f: min(share[f], w) for f, w in wants.items()}
    live, taken = set(workers), set()
    grants = {}
    for fit in wants:
        kept = [w for w in held.get(fit, []) if w in live and w not in taken][: share[fit]]
        grants[fit] = kept
        taken.update(kept)
    free = iter([w for w in workers if w not in taken])
    for fit in wants:
        need = share[fit] - len(grants[fit])
        if need > 0:
            grants[fit] += itertools.islice(free, need)
    least = least or {}
    order = {w: i for i, w in enumerate(workers)}
    load = dict.fromkeys(workers, 0)
    for grant in grants.values():
        for w in grant:
            load[w] += 1
    for fit, want in wants.items():
        floor = min(len(workers), max(least.get(fit, 0), 1 if want > 0 else 0))
        if len(grants[fit]) >= floor:
            continue
        mine = set(grants[fit])
        others = sorted((w for w in workers if w not in mine), key=lambda w: (load[w], order[w]))
        added = others[: floor - len(grants[fit])]
        grants[fit] = [*grants[fit], *added]
        for w in added:
            load[w] += 1
    return grants


def lend(workers: list[str], grants: dict[str, list[str]], borrow: dict[str, int],
         lent: dict[str, list[str]]) -> dict[str, list[str]]:
    """The ``workers`` no grant holds, lent to the fits that can use more (``borrow``: how many
    more each), one worker at a time in the fits' order; a fit keeps the workers it was ``lent``
    before while they are still free.

    Examples
    --------
    >>> lend(["w1", "w2", "w3", "w4"], {"a": ["w1"], "b": ["w2"]}, {"a": 3, "b": 0}, {})
    {'a': ['w3', 'w4']}
    >>> lend(["w1", "w2", "w3"], {"a": ["w1"], "b": ["w3"]}, {"a": 1}, {"a": ["w3"]})  # b wants w3 now
    {'a': ['w2']}
    """
    held = {w for g in grants.values() for w in g}
    free = [w for w in workers if w not in held]
    out = {f: [w for w in lent.get(f, []) if w in free][:n] for f, n in borrow.items() if n > 0}
    free = [w for w in free if not any(w in g for g in out.values())]
    while free:
        hungry = [f for f in out if len(out[f]) < borrow[f]]
        if not hungry:
            break
        for f in hungry[: len(free)]:
            out[f].append(free.pop(0))
    return out
