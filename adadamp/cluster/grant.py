"""A fit's side of the allocator: what it declared, and the grant the allocator last answered."""

from __future__ import annotations

import contextlib

from .allocator import GrantReply


class Grant:
    """One fit's grant, as the allocator last answered: its workers (None until the first answer
    or when the allocator forgot the fit) and the cluster's measured worker start time."""

    def __init__(self, client, fit: str, bounds: tuple[int, int], scaled: bool):
        self.client, self.fit, self.scaled = client, fit, scaled
        self.least, self.most = bounds  # the fit's min_workers and max_workers
        self.workers: set[str] | None = None
        self.share = 0  # the workers the fit's fair share allows (its want when the cluster has room)
        self.others = 0  # the other fits the allocator divides the cluster among
        self.start_latency: float | None = None
        self.adapted_ago: float | None = None  # seconds since an adaptive last sized the cluster (None: never)
        self.declared: tuple[int, int] | None = None
        self.speedups: list[float] | None = None  # the damper's predicted speedup on 1, 2, ... workers
        self._sent_speedups: list[float] | None = None
        self.borrow = 0  # how many workers no fit wants this fit would use (its update-time model says)
        self._sent_borrow = 0
        self.lent: list[str] = []  # the workers of the grant lent to the fit (no one's share)

    def declare(self, want: int, ahead: int) -> None:
        """Tell the allocator what the fit wants now and ahead (only when it, the speedups or what
        the fit would borrow changed)."""
        if (self.declared == (want, ahead) and self.workers is not None and self._sent_speedups == self.speedups
                and self._sent_borrow == self.borrow):
            return
        self.declared, self._sent_speedups, self._sent_borrow = (want, ahead), self.speedups, self.borrow
        self._take(self.client.sync(self._allocate, declare=True))

    async def renew(self) -> None:
        """Renew the lease (the membership watcher's loop, every look); declare again if the
        allocator forgot the fit (a scheduler restart, an expired lease)."""
        if self.declared is None:  # released (a suspended partial_fit): nothing to renew
            return
        reply = await self._allocate(declare=False)
        if reply.grant is None and self.declared is not None:
            reply = await self._allocate(declare=True)
        self._take(reply)

    async def _allocate(self, declare: bool) -> GrantReply:
        """The allocator's answer to a renewal, or (``declare``) to the fit's last declaration."""
        wants = {}
        if declare:
            want, ahead = self.declared
            wants = {"want": want, "ahead": ahead, "most": self.most, "least": self.least, "client": self.client.id,
                     "scaled": self.scaled, "speedups": self._sent_speedups, "borrow": self._sent_borrow}
        return GrantReply(**await self.client.scheduler.adadamp_allocate(fit=self.fit, **wants))

    def _take(self, reply: GrantReply) -> None:
        if reply.grant is not None:
            self.workers = set(reply.grant)
            self.share = len(self.workers) if reply.share is None else reply.share
            self.lent = list(reply.lent)
            self.others = reply.others
        self.start_latency = reply.start_latency
        self.adapted_ago = reply.adapted_ago

    def release(self) -> None:
        """Give the workers back (the fit ended, or is suspended until its next ``partial_fit``)."""
        self.declared, self.workers, self.lent = None, None, []
        with contextlib.suppress(Exception):
            self.client.sync(self.client.scheduler.adadamp_release_grant, fit=self.fit)
