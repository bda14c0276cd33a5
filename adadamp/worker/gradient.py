"""One worker's share of an update: the gradient SUM over its examples, the loss sum and the
statistics the damper asked for, from one forward pass (runs on the workers).

Sums, not means: the client adds the workers' sums and divides once by the batch's total, so the
result does not depend on how the batch was split.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from ..exceptions import ShareTooSmallError
from ..records import GradientReply, examples_digest
from ..sample_weight import SampleWeightedLoss
from ..wire.parameters import BATCH_NORMS, exact_squared_norm
from ..wire.precision import autocast
from ..wire.seeding import generator_state, seeded
from .memory import peak_since_last
from .state import FitState

_NOTHING = np.zeros(0, dtype=np.int64)
logger = logging.getLogger(__name__)


def share_gradient(
    state: FitState,
    weights,
    indices: np.ndarray,
    n_chunks: int,
    seed: int,
    epoch: int = 0,
    ahead: np.ndarray = _NOTHING,
    in_reply: bool = False,
    buffers: np.ndarray | None = None,
    parts: np.ndarray | None = None,
    loss_scale: float = 1.0,
) -> GradientReply:
    """The gradient sum over ``indices`` at ``weights`` (None: already in place).

    ``parts`` (speed-based shares): the request is several shards, rows ``(dropout seed, example
    count)`` in the order of ``indices``; each is its own forward and backward pass from the same
    running statistics (:func:`shards_sum`), or one pass for all when the module's examples are
    independent.  None: one shard seeded by ``seed``.

    ``buffers`` (the client's running statistics, BatchNorm's) are where the share's forward pass
    starts its statistics from: every shard then updates the same statistics, so what the client
    averages does not depend on which worker computed which shard, nor on what a worker computed
    before (a restarted worker, one that took over a lost worker's shard).

    The examples are resident rows, or (a lazy Dataset) read now, in data epoch ``epoch``;
    then the ``ahead`` examples of the next shares (keys ``epoch * n + index``) start loading.  Returns numpy arrays
    (``grad`` is None when it went to shared memory, unless ``in_reply``: this worker computes
    several shards of the update, and the next one's gradient overwrites that memory) and the
    example count, the loss sum, the examples' digest and, with ``n_chunks`` (:func:`gradient_sum`), the chunk
    statistics AdaScale needs.  ``loss_scale`` (``precision="16-mixed"``) multiplies the loss
    before the backward pass: the gradient sum comes back scaled, the loss and the statistics not.
    """
    with state.lock:
        state.last_used = time.monotonic()
        start = time.perf_counter()
        X, y = examples(state, indices, epoch, ahead)
        if state.shared and state.device.type != "cpu":
            state.flat.copy_(state.shared_weights, non_blocking=True)
        elif not state.shared:
            state.flat.copy_(torch.from_numpy(np.asarray(weights)), non_blocking=True)
        if buffers is not None and state.buffers:
            set_buffers(state.buffers, torch.from_numpy(buffers))
        running = None
        if parts is None:
            n, weight, loss_sum, sq_sum, n_stat_chunks = gradient_sum(state, X, y, n_chunks, seed, scale=loss_scale)
        else:
            start_buffers = flat_buffers(state.buffers) if state.buffers else None
            (n, weight, loss_sum, sq_sum, n_stat_chunks), running = shards_sum(
                state, X, y, n_chunks, np.asarray(parts, dtype=np.int64).reshape(-1, 2), start_buffers,
                scale=loss_scale,
            )
            n, n_stat_chunks = int(n), int(n_stat_chunks)
        if in_reply:
            grad = state.grads.detach().to("cpu", copy=True).numpy()
        elif state.shared:
            if state.device.type != "cpu":
                state.shared_gradient.copy_(state.grads)
            grad = None  # the client reads it from shared memory
        else:
            grad = state.grads.detach().to("cpu").numpy()
        return GradientReply(
            n=n,
            loss_sum=loss_sum,
            chunk_sq_norm_sum=sq_sum,
            n_chunks=n_stat_chunks,
            compute_time=time.perf_counter() - start,
            grad=grad,
            buffers=_reply_buffers(state, running, n),
            weight=weight,
            digest=examples_digest(indices),
            peak_memory=peak_since_last(state.device),
        )


def _reply_buffers(state: FitState, running: torch.Tensor | None, n: int) -> np.ndarray | None:
    """The running statistics a reply carries: the module's after its one pass, or (several shards)
    the shards' statistics weighted by their examples."""
    if not state.buffers:
        return None
    if running is None:
        return torch.cat([b.reshape(-1) for b in state.buffers]).cpu().numpy()
    return (running / max(n, 1)).numpy()


def shards_sum(
    state: FitState, X: torch.Tensor, y: torch.Tensor, n_chunks: int, parts: np.ndarray,
    start: torch.Tensor | None, before_last: Callable[[ChunkStatistic | None], None] | None = None,
    scale: float = 1.0,
) -> tuple[list[float], torch.Tensor | None]:
    """The gradient sum over consecutive shards of ``X, y`` (rows ``(dropout seed, example count)``
    of ``parts``), in ``state.grads``; returns the summed scalars of :func:`gradient_sum` and the
    running statistics weighted by each shard's examples (None without any).

    Each shard is its own forward and backward pass, its running statistics starting from
    ``start``, so a shard's gradient, dropout masks and BatchNorm statistics do not depend on which
    shards it is computed with.  When the fit fuses shards (``state.fuse``: speed-based shares and
    a module whose examples are independent, :func:`~adadamp.wire.parameters.examples_independent`)
    and its first pass drew no random numbers, the shards are one pass (seeded by the first
    shard's seed, which then draws nothing): the same gradient sum up to float summation order,
    one pass's fixed cost instead of one per shard.  ``before_last`` is :func:`gradient_sum`'s
    ``before_backward`` for the last pass (the all-reduce replica's buckets start listening to it).
    """
    sums = [0.0] * 5
    running = torch.zeros(sum(b.numel() for b in state.buffers)) if state.buffers else None
    if state.fuse and state.draws is False and len(parts) > 1:
        parts = np.array([[parts[0, 0], parts[:, 1].sum()]], dtype=np.int64)
        n_chunks = 2 if n_chunks else 0  # the shards' samples, one pass: its halves instead
    offset = 0
    for i, (seed, count) in enumerate(parts.tolist()):
        if i and start is not None:
            set_buffers(state.buffers, start)
        shard = slice(offset, offset + count)
        offset += count
        last = before_last if i == len(parts) - 1 else None
        result = gradient_sum(state, X[shard], y[shard], n_chunks, seed, accumulate=i > 0, before_backward=last,
                              scale=scale)
        sums = [a + b for a, b in zip(sums, result)]
        if running is not None:  # BatchNorm: one running average whatever the split
            running += flat_buffers(state.buffers) * result[0]
    return sums, running


def flat_buffers(buffers: list[torch.Tensor]) -> torch.Tensor:
    """The running statistics, one flat float tensor (a copy) on the CPU."""
    return torch.cat([b.detach().reshape(-1).float().cpu() for b in buffers])


def set_buffers(buffers: list[torch.Tensor], values: torch.Tensor) -> None:
    """Write one flat tensor of running statistics (:func:`flat_buffers`) back into ``buffers``."""
    offset = 0
    with torch.no_grad():
        for b in buffers:
            b.copy_(values[offset : offset + b.numel()].view_as(b))
            offset += b.numel()


def gradient_sum(
    state: FitState, X: torch.Tensor, y: torch.Tensor, n_chunks: int, seed: int, accumulate: bool = False,
    before_backward: Callable[[ChunkStatistic | None], None] | None = None, scale: float = 1.0,
) -> tuple:
    """Accumulate the gradient SUM over ``X, y`` into ``state.grads`` (zeroed first, unless
    ``accumulate``: a replica's next shard of the same update adds its sum to the last's).

    Returns ``(n, weight, loss_sum, chunk_sq_norm_sum, n_chunks)``.  ``n_chunks`` asks for the
    statistics AdaScale's estimator needs (Johnson et al. 2020; docs/guide/dampers.rst), the
    squared gradient norms per example of the share's chunks: 0 none; 1 the share is one chunk
    (free: when the batch is cut into several shards, each shard's gradient is one sample, as
    fairscale and adaptdl take each replica's); 2 its two halves (one extra backward pass, so that
    a batch of a single shard still gives two samples).  An empty share adds nothing.

    ``before_backward(statistic)`` runs just before the trained backward pass (also for an empty
    share, with nothing to follow): whoever changes ranges of ``state.grads`` as that pass fills
    them (an all-reduce started per bucket) reads each range into ``statistic`` first
    (:meth:`ChunkStatistic.read`; None when no statistics were asked for).

    The forward pass and the loss run under the fit's precision (:func:`~adadamp.wire.precision.autocast`);
    ``scale`` multiplies the loss before the backward pass (float16's loss scaling: the gradient is
    summed scaled, the statistics are of the unscaled gradient).  A share of more than the fit's
    ``micro_batch_size`` examples is accumulated over several passes (:func:`_micro_batches`).
    """
    n = len(X)
    if not accumulate:
        state.grads.zero_()
    if n == 0:
        if before_backward is not None:
            before_backward(None)
        return 0, 0.0, 0.0, 0.0, 0
    before = state.grads.clone() if accumulate and n_chunks else None  # the statistics are this share's
    micro = state.kit.micro_batch_size
    if micro is not None and n > micro:
        return _micro_batches(state, X, y, n_chunks, seed, before, before_backward, scale, micro)
    with autocast(state.device, state.kit.precision):
        out = _seeded_forward(state, X, seed)  # one forward: BatchNorm sees the share once
        loss, weight = _loss_sum(state.criterion, out, y, n)
        first = _first_half_gradient(state, out, y, n, scale) if n_chunks > 1 and n > 1 else None
    statistic = ChunkStatistic(state.grads, n, before, first, scale) if n_chunks else None
    if before_backward is not None:
        before_backward(statistic)
    (loss if scale == 1.0 else loss * scale).backward()  # the trained gradient: the same with or without statistics
    if statistic is None:
        return n, weight, float(loss.detach()), 0.0, 0
    return n, weight, float(loss.detach()), statistic.total(), statistic.n_chunks


def _micro_batches(
    state: FitState, X: torch.Tensor, y: torch.Tensor, n_chunks: int, seed: int, before: torch.Tensor | None,
    before_backward: Callable[[ChunkStatistic | None], None] | None, scale: float, micro: int,
) -> tuple:
    """:func:`gradient_sum` over passes of at most ``micro`` examples (gradient accumulation), so a
    worker's memory is one pass's whatever its share: DeepSpeed's micro-batch, AdaptDL's
    accumulation when the batch outgrows what the devices hold.

    The passes are fixed by the share's size alone (near-equal, consecutive), so the same seed and
    worker count give bitwise the same gradient; pass ``k`` draws its dropout masks from a seed of
    its own.  With two chunk statistics the halves are passes of their own: the first half's
    gradient is read off between them, with no extra backward pass.  ``before_backward`` runs
    before the last pass's backward (the gradient is complete only then).
    """
    n = len(X)
    half = n // 2 if n_chunks > 1 else n
    cuts = [c for lo, hi in ((0, half), (half, n)) if hi > lo for c in _cuts(lo, hi, micro)]
    loss_sum, weight, first = 0.0, 0.0, None
    for k, (lo, hi) in enumerate(cuts):
        with autocast(state.device, state.kit.precision):
            out = _seeded_forward(state, X[lo:hi], seed if k == 0 else _pass_seed(seed, k))
            loss, w = _loss_sum(state.criterion, out, y[lo:hi], hi - lo)
        if k == len(cuts) - 1 and before_backward is not None:
            before_backward(ChunkStatistic(state.grads, n, before, first, scale) if n_chunks else None)
        (loss if scale == 1.0 else loss * scale).backward()
        loss_sum, weight = loss_sum + float(loss.detach()), weight + w
        if n_chunks > 1 and hi == half:  # the first half's gradient sum, for the statistics
            first = (state.grads if before is None else state.grads - before).double()
    if not n_chunks:
        return n, weight, loss_sum, 0.0, 0
    statistic = ChunkStatistic(state.grads, n, before, first, scale)
    return n, weight, loss_sum, statistic.total(), statistic.n_chunks


def _cuts(lo: int, hi: int, micro: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` in the fewest near-equal passes of at most ``micro`` examples.

    >>> _cuts(0, 10, 4)
    [(0, 4), (4, 7), (7, 10)]
    """
    k = -(-(hi - lo) // micro)
    bounds = [lo + ((hi - lo) * i + k - 1) // k for i in range(k + 1)]
    return list(itertools.pairwise(bounds))


def _pass_seed(seed: int, k: int) -> int:
    """The dropout seed of a share's ``k``-th pass (k >= 1): distinct from the share's and its other passes'."""
    return int(np.random.SeedSequence([seed % 2**63, k]).generate_state(1, np.uint64)[0] >> np.uint64(1))


class ChunkStatistic:
    """AdaScale's statistic of one share (:func:`gradient_sum`), read range by range of the flat
    gradient: the sum over the share's chunks of each chunk's squared gradient sum per example.

    The share is one chunk (``first`` None) or two halves, the first's gradient sum ``first``;
    ``before`` is what the gradient held before this share's backward pass (earlier shards of the
    same update), subtracted; ``scale``, the loss scale the gradients were computed at, divided out.  Ranges read once the backward pass filled them let an all-reduce
    start there during that pass; :meth:`total` reads the rest.
    """

    def __init__(self, grads: torch.Tensor, n: int, before: torch.Tensor | None, first: torch.Tensor | None,
                 scale: float = 1.0):
        self.grads, self.n, self.before, self.first, self.scale = grads, n, before, first, scale
        self.n_chunks = 1 if first is None else 2
        # squared norms (float64, on the gradient's device until the total): the whole share's
        # (or its first half's), the second half's
        self._sums = [torch.zeros((), dtype=torch.float64, device=grads.device) for _ in range(2)]
        self._read: list[tuple[int, int]] = []

    def read(self, lo: int, hi: int) -> None:
        """Add the range ``[lo, hi)`` of the gradient, as the share's backward pass left it."""
        before = () if self.before is None else (self.before[lo:hi],)
        if self.first is None:
            self._sums[0] += exact_squared_norm(self.grads[lo:hi], *before)
        else:
            self._sums[0] += exact_squared_norm(self.first[lo:hi])
            self._sums[1] += exact_squared_norm(self.grads[lo:hi], *before, self.first[lo:hi])
        self._read.append((lo, hi))

    def total(self) -> float:
        """The statistic, after reading the ranges not read yet."""
        end = 0
        for lo, hi in sorted(self._read) + [(self.grads.numel(), self.grads.numel())]:
            if lo > end:
                self.read(end, lo)
            end = max(end, hi)
        whole, second = (float(s) / self.scale**2 for s in self._sums)
        if self.first is None:
            return whole / self.n
        m = self.n // 2
        return whole / m + second / (self.n - m)


def _seeded_forward(state: FitState, X: torch.Tensor, seed: int) -> torch.Tensor:
    """The module's forward pass with its random draws (dropout) seeded by ``seed``.

    Seeding holds the process's generator lock, which a lazy Dataset's seeded loads also need.
    So, while a Dataset is read with seeds on this CPU worker, the first forward pass looks
    whether the module draws at all; one that does not then runs without the lock, and the
    loads of the next share go on meanwhile.  Should it draw later after all, it is seeded from
    then on (that one share's draws were not; a warning says so).
    """
    if state.forward_draws is False:
        before = generator_state()  # seeded loads between the two looks restore what they change
        out = _forward(state, X)
        if not torch.equal(before, generator_state()):
            state.forward_draws = state.draws = True
            logger.warning("the module drew random numbers in a forward pass after its first drew none; "
                           "seeding its forward passes from now on")
        return out
    with seeded(seed, state.device):
        before = torch.default_generator.get_state() if state.forward_draws is None else None
        out = _forward(state, X)
        if before is not None:
            lazy = state.loader is not None and not state.loader.cache and state.device.type == "cpu"
            draws = not torch.equal(before, torch.default_generator.get_state())
            state.forward_draws = draws or not lazy
            state.draws = draws
    return out


def examples(state: FitState, indices, epoch: int, ahead) -> tuple[torch.Tensor, torch.Tensor]:
    """The share's inputs and targets on the fit's device."""
    if state.loader is not None:
        X, y = state.loader.load(epoch, indices, ahead)
        return torch.from_numpy(X).to(state.device), torch.from_numpy(y).to(state.device)
    return state.data.gather(indices)




def _forward(state: FitState, X: torch.Tensor) -> torch.Tensor:
    """``module(X)`` (compiled, ``compile=True``); a one-example share that a training-mode BatchNorm
    cannot take is named as such.

    A compiled module sees its batch dimension marked dynamic (unless ``compile__dynamic=False``):
    one compilation serves every share size of a growing batch, micro-batch and ragged last batch,
    where a static first graph would be compiled again at the first new size.
    """
    module = state.module
    try:
        if state.compiled is None:
            return module(X)
        if state.kit.compile.get("dynamic") is not False and X.dim() and len(X) > 1:
            torch._dynamo.mark_dynamic(X, 0)
        return state.compiled(X)
    except ValueError as err:
        if len(X) == 1 and module.training and any(isinstance(m, BATCH_NORMS) for m in module.modules()):
            raise ShareTooSmallError(
                "A worker's share of this update was 1 example, too few for the module's batch normalization "
                "in training mode. Shares follow where the data lives, so raise the batch size or "
                "grads_per_worker (fewer workers per batch)."
            ) from err
        raise


def weights_are_counts(criterion) -> bool:
    """Whether :func:`_loss_sum` weighs a share by its example count whatever its labels (no
    sample or class weights, no ``ignore_index`` that a label can hit): a batch's mean gradient
    is then its sum over the batch's size, known before the all-reduce."""
    if isinstance(criterion, SampleWeightedLoss):
        return False
    if getattr(criterion, "reduction", "mean") != "mean":
        return True
    ignore = getattr(criterion, "ignore_index", None)
    return ignore is None or (getattr(criterion, "weight", None) is None and ignore < 0)


def _loss_sum(criterion, out, y, n: int) -> tuple[torch.Tensor, float]:
    """The share's loss as a sum, and what the full batch's mean divides that sum by.

    Gradients are sums and the client divides once by the batch's total
    (docs/guide/dampers.rst).  A mean-reduced criterion is turned back into a sum: for
    most criteria by the example count, but a class-weighted or
    ``ignore_index`` mean (CrossEntropyLoss, NLLLoss) divides by the targets'
    total weight, so that sum is computed (``reduction="sum"``) and that
    weight returned: the batch's loss is then exactly the criterion's
    weighted mean over all workers' examples.  With sample weights, the sum and the weight are
    :meth:`SampleWeightedLoss.sum_and_weight`'s.
    """
    if isinstance(criterion, SampleWeightedLoss):
        return criterion.sum_and_weight(out, y)
    if getattr(criterion, "reduction", "mean") != "mean":
        return criterion(out, y), float(n)
    ignore = getattr(criterion, "ignore_index", None)
    weights = getattr(criterion, "weight", None)
    if (
        weights_are_counts(criterion)
        or y.is_floating_point()
        or (weights is None and not bool((y == ignore).any()))  # no label is the ignored one
    ):
        return criterion(out, y) * n, float(n)
    kept = y != ignore
    dtype = torch.promote_types(out.dtype, torch.float32)  # a bfloat16 sum of weights would round
    per_target = torch.ones_like(y, dtype=dtype) if weights is None else weights.to(dtype)[y.clamp(min=0)]
    original = criterion.reduction
    criterion.reduction = "sum"
    try:
        total = criterion(out, y)
    finally:
        criterion.reduction = original
    return total, float((per_target * kept).sum())


def _first_half_gradient(state: FitState, out, y, n: int, scale: float = 1.0) -> torch.Tensor:
    """The gradient sum of the share's first ``n // 2`` examples, from the share's one forward pass.

    An extra backward of that half's loss (the graph is kept for the full
    backward that follows); the second half's sum is then ``G - G_1``.
    Nothing here changes what is trained, and BatchNorm sees the share once.
    """
    m = n // 2
    params = [p for p in state.module.parameters() if p.requires_grad]
    half, _ = _loss_sum(state.criterion, out[:m], y[:m], m)
    grads = torch.autograd.grad(half * scale, params, retain_graph=True, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for g, p in zip(grads, params)])
