"""The clock a schedule runs on, and which examples each update uses: one seeded permutation per
data epoch.  The engine trains on it and :func:`~adadamp.dampers.simulate_schedule` runs a damper on
it without a model, so the two count updates alike.

The trajectory must not depend on how many workers there are, or which: so the indices of an
update come from a permutation seeded by ``(seed, data_epoch)`` alone (:doc:`/guide/elasticity`),
and only afterwards are they routed to whoever holds those examples
(:mod:`adadamp.data.placement`).  Pure; no Dask.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..wire.batches import epoch_permutation, next_keys
from .base import TrainState


@dataclasses.dataclass
class LoopState:
    """The training clock and the sampler position (picklable, checkpointed).

    ``progress`` is the one epoch clock in examples: data examples, unless the
    damper reports another progress per update (AdaScale).

    Examples
    --------
    >>> loop = LoopState(seed=0, n_data=10)
    >>> sorted(loop.permutation().tolist()) == list(range(10))
    True
    """

    seed: int
    n_data: int
    n_updates: int = 0
    n_samples_seen: int = 0
    progress: float = 0.0
    data_epoch: int = 0
    position: int = 0
    last_loss: float | None = None
    #: Where the running ``fit`` call ends on the epoch clock (None: unknown, ``partial_fit``); set by
    #: the fit loop for the call, not part of the trajectory.
    end_epoch: float | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def epoch(self) -> float:
        return self.progress / self.n_data

    def epoch_end(self) -> float:
        """Where the current epoch ends on the clock, in examples (an epoch runs while ``progress`` is below)."""
        return (math.floor(self.epoch + 1e-9) + 1) * self.n_data

    def in_epoch(self, end: float) -> bool:
        """Whether another update belongs to the epoch ending at ``end`` (rounding of the clock absorbed)."""
        return self.progress < end - 1e-6

    def advance(self, n: int, progress: float | None = None, loss: float | None = None) -> None:
        """Move the clock past one update of ``n`` examples; ``progress``: the damper's progress of the
        update in examples (the plan's, AdaScale), ``n`` when None; ``loss``: the update's training loss."""
        self.n_updates += 1
        self.n_samples_seen += int(n)
        self.progress += float(n if progress is None else progress)
        self.last_loss = loss

    def resized(self, n_data: int) -> LoopState:
        """The clock for data of another size (``partial_fit``): it continues in epochs, and a
        started data epoch counts as done."""
        return LoopState(
            seed=self.seed,
            n_data=n_data,
            n_updates=self.n_updates,
            n_samples_seen=self.n_samples_seen,
            progress=self.epoch * n_data,
            data_epoch=self.data_epoch + (self.position > 0),
        )

    def permutation(self) -> np.ndarray:
        return epoch_permutation(self.seed, self.data_epoch, self.n_data)

    def train_state(self, n_workers: int, max_workers: int | None = None,
                    available_workers: int | None = None) -> TrainState:
        """What a damper sees before the next update (``max_workers``: the fit's budget of workers;
        ``available_workers``: those running that it could use now)."""
        return TrainState(
            self.n_updates, self.n_samples_seen, self.epoch, self.n_data, max(1, n_workers), loss=self.last_loss,
            max_workers=max_workers, available_workers=available_workers, end_epoch=self.end_epoch,
        )


class Sampler:
    """Draws the next batch's example indices; a batch never straddles two data epochs.

    Examples
    --------
    >>> loop = LoopState(seed=0, n_data=5)
    >>> s = Sampler(loop)
    >>> [len(s.take(2)) for _ in range(4)], loop.data_epoch
    ([2, 2, 1, 2], 1)
    """

    def __init__(self, loop: LoopState, order=None):
        self.loop = loop
        self.order = order  # a streamed source's StreamOrder (None: one permutation of all the examples)
        self._perm: np.ndarray | None = None
        self._perm_epoch: int | None = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if self.order is None:
            return epoch_permutation(self.loop.seed, epoch, self.loop.n_data)
        return self.order.permutation(epoch)

    def take(self, batch_size: int) -> np.ndarray:
        """The example indices of the next batch (at most ``batch_size``, fewer at an epoch's end)."""
        lp = self.loop
        if lp.position == 0 or self._perm is None or self._perm_epoch != lp.data_epoch:
            self._perm, self._perm_epoch = self._permutation(lp.data_epoch), lp.data_epoch
        perm = self._perm
        span = self.advance(batch_size)
        return perm[span.start : span.stop]

    def peek(self, batch_size: int, batches: int = 1) -> np.ndarray:
        """The examples of the next ``batches`` batches if they have ``batch_size`` examples, as
        keys ``data_epoch * n_data + index``, without drawing them (a lazy Dataset's workers load
        them ahead).

        Examples
        --------
        >>> loop = LoopState(seed=0, n_data=5)
        >>> s = Sampler(loop)
        >>> keys = s.peek(2, batches=4)  # 2 + 2 + 1 (the end of epoch 0), then 2 of epoch 1
        >>> (keys // 5).tolist(), (keys[:2] % 5).tolist() == s.take(2).tolist()
        ([0, 0, 0, 0, 0, 1, 1], True)
        """
        lp = self.loop
        held = lp.position and self._perm is not None and self._perm_epoch == lp.data_epoch
        return next_keys(lp.seed, lp.n_data, lp.data_epoch, lp.position, batch_size, batches,
                         self._perm if held else None, permute=self._permutation)

    def advance(self, batch_size: int) -> range:
        """Move past the next batch without drawing it: its positions in this data epoch's permutation.

        The simulators count a schedule's updates with this, so their batches are the engine's.
        """
        lp = self.loop
        span = range(lp.position, min(lp.position + batch_size, lp.n_data))
        lp.position = span.stop
        if lp.position >= lp.n_data:
            lp.position = 0
            lp.data_epoch += 1
        return span
