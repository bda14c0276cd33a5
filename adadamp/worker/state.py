"""A fit's state on a worker, shared by the handlers (:mod:`adadamp.worker.plugin`), the gradient
(:mod:`adadamp.worker.gradient`) and the all-reduce replica (:mod:`adadamp.worker.replica`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..records import Block, TrainingKit
from ..wire.channel import ChannelServer
from .loading import ExampleLoader
from .resident import ResidentData


@dataclass
class FitState:
    """One fit on this worker: the module on its device, its parameters and gradients as views of
    two flat buffers (in shared memory with the client on its host), the criterion, and the
    examples the client placed here (or the loader of a lazy Dataset)."""

    module: torch.nn.Module
    criterion: torch.nn.Module
    device: torch.device
    flat: torch.Tensor
    grads: torch.Tensor
    n_total: int
    shared: bool = False  # weights and gradient live in shared memory with the client
    inline: bool = False  # the last gradient was quick: compute on the event loop
    shared_weights: torch.Tensor | None = None  # (GPU workers: host copies of the two)
    shared_gradient: torch.Tensor | None = None
    data: ResidentData | None = None  # the blocks placed here (set in __post_init__)
    buffers: list[torch.Tensor] = field(default_factory=list)  # float buffers sent back each update
    lock: threading.Lock = field(default_factory=threading.Lock)  # data changes vs. gradients
    last_used: float = field(default_factory=time.monotonic)  # the client's last request or set-up
    channel: ChannelServer | None = None
    loader: ExampleLoader | None = None  # a lazy Dataset: examples are read per share, not placed
    forward_draws: bool | None = None  # whether the module's forward draws random numbers (None: not seen)
    draws: bool | None = None  # whether its first forward drew any (None: not seen; forward_draws also says "seed")
    fuse: bool = False  # several shards of a request may be one forward pass (speed shares, independent examples)
    replica: Any = None  # an all-reduce fit: this worker's Replica (optimizer and process group)
    kit: TrainingKit = field(default_factory=TrainingKit)  # precision, clipping, micro-batches, compiling
    compiled: Any = None  # kit.compile: torch.compile(module), which the forward passes call

    def __post_init__(self):
        if self.data is None:
            self.data = ResidentData(self.n_total, self.device)

    @property
    def block_index(self) -> dict[int, range]:
        return self.data.block_index

    def update_blocks(self, add: list[Block], drop: list[int], borrowed: bool = False) -> None:
        """Add blocks and drop block numbers (``borrowed``: Dask's partitions, kept as views)."""
        with self.lock:
            self.data.update(add, drop, borrowed)
