"""What the engine passes around, defined once: the messages between the client and its workers
(a share request, carried to its worker in a gradient request, and the gradient reply, a worker's
set-up and its reply with the shared-memory and channel offers, block moves, an all-reduce
group's forming and commits, a fit's release, the all-reduce step vector), one update's record,
one epoch's row of ``history_``, and the training state a fit works on.

Plain dataclasses with no Dask and no engine imports, so the workers (``adadamp.worker.plugin``,
``adadamp.wire.channel``) use them without importing the client side.  A message crosses a Dask
RPC as plain data: :func:`to_message` on the sending side (:func:`adadamp.wire.rpc.rpc_call`),
``Record(**message)`` on the other.  ``history_`` keeps plain dicts
(callbacks add keys such as ``valid_loss`` or ``event_cp``); :meth:`UpdateRecord.row` and
:func:`epoch_row` are where those dicts are made.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass
class GradientReply:
    """What a worker returns for one gradient request (arrays already on the client)."""

    n: int
    loss_sum: float
    chunk_sq_norm_sum: float
    n_chunks: int
    compute_time: float
    grad: np.ndarray | None  # None: the worker wrote it into shared memory
    buffers: np.ndarray | None
    weight: float = 0.0  # what the loss sum is normalized by: the examples, or their class weights
    grad_sq_norm: float = float("nan")  # all-reduce fits: the squared norm of the batch's mean gradient
    digest: int = 0  # examples_digest of the examples the gradient was computed over
    peak_memory: int = 0  # bytes at the worker's peak since its last reply (adadamp.worker.memory; 0: unknown)


def examples_digest(indices: np.ndarray) -> int:
    """An order-free digest of example indices: the sum of their 64-bit hashes (splitmix64), modulo 2**64.

    The digests of the parts of a batch add up (modulo 2**64) to the batch's, however it was
    split; an example counted twice, or left out, changes it.

    Examples
    --------
    >>> a, b = examples_digest(np.array([3, 1])), examples_digest(np.array([2]))
    >>> (a + b) % 2**64 == examples_digest(np.array([1, 2, 3]))
    True
    >>> examples_digest(np.array([1, 2, 3])) == examples_digest(np.array([1, 2, 2, 3]))
    False
    """
    z = np.asarray(indices, dtype=np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return int((z ^ (z >> np.uint64(31))).sum(dtype=np.uint64))


@dataclass
class ShareRequest:
    """One worker's share of an update: the examples it computes the gradient over, and those it
    may start loading for the next updates (lazy Datasets: loading overlaps the compute).

    ``epoch`` is the data epoch the examples are drawn in (a batch never straddles two): with
    the fit's seed and each example's index it seeds that example's random transforms.  The
    ``ahead`` examples are keys ``data_epoch * n_examples + index``.  ``step`` (all-reduce fits)
    is the update number and the optimizer step the worker applies before computing
    (:mod:`adadamp.worker.replica`).  ``shard`` is the shard of the batch the indices are
    (:mod:`adadamp.data.placement`); ``in_reply`` asks a worker that maps shared memory to send
    the gradient in its reply all the same (it computes more than one shard of the update).
    ``plan`` (all-reduce fits): the member's :class:`~adadamp.wire.batches.BatchPlan` as a vector;
    the member finds its examples from it, and ``indices`` and ``ahead`` are empty.  ``parts``
    (speed-based shares, several shards in one request): int64 rows ``(dropout seed, example
    count)``, one per shard, in the order of ``indices``; None: one shard, seeded by ``seed``.
    """

    worker: str
    seed: int  # the share's dropout seed
    indices: np.ndarray
    epoch: int = 0
    ahead: np.ndarray | None = None
    step: np.ndarray | None = None
    shard: int = 0
    in_reply: bool = False
    plan: np.ndarray | None = None  # int64: BatchPlan.to_array()
    parts: np.ndarray | None = None  # int64 (k, 2): each shard's dropout seed and example count


@dataclass
class GradientRequest:
    """What a worker computes for one share: the ``share`` as the client planned it, with what the
    round sends every worker alike.  The arguments of the ``adadamp_gradient`` RPC, and what a
    gradient channel's request carries (:mod:`adadamp.wire.channel`).

    A channel serves one fit and writes only what the worker computes with, so on its side
    ``fit_id`` is empty, as are the share's ``worker`` and ``shard`` (the client's bookkeeping).

    Examples
    --------
    >>> r = GradientRequest(ShareRequest("tcp://10.0.0.2:4000", seed=7, indices=np.arange(3)), n_chunks=2)
    >>> r.nbytes(), r.weights is None  # None: the worker maps the weights, or keeps its replica's
    (24, True)
    """

    share: ShareRequest
    n_chunks: int  # the chunks of the share whose squared gradient norms are summed, for AdaScale (0: none)
    weights: np.ndarray | None = None  # float32; None: the worker reads them from shared memory, or keeps its own
    buffers: np.ndarray | None = None  # float32 running statistics the share starts from (None: the worker's own)
    fit_id: str = ""  # the fit whose state computes it (the RPC's; a channel serves one fit)
    loss_scale: float = 1.0  # precision="16-mixed": the loss is multiplied by it before the backward pass

    def __post_init__(self):
        if isinstance(self.share, dict):  # as it crossed the RPC
            self.share = ShareRequest(**self.share)
        elif not isinstance(self.share, ShareRequest):
            raise TypeError(f"a gradient request's share is a ShareRequest, not {type(self.share).__name__}")

    def nbytes(self) -> int:
        """The bytes of the request's arrays: what it sends besides its numbers."""
        arrays = [*(getattr(self.share, f.name) for f in dataclasses.fields(ShareRequest)), self.weights, self.buffers]
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


def to_message(record) -> dict:
    """A record as the keyword arguments or the reply of a Dask RPC (msgpack takes no dataclasses);
    records in its fields become dicts too.  Shallow otherwise: no array or bytes is copied.

    Examples
    --------
    >>> to_message(SetupReply(shared=False, shared_data=False, channel=ChannelOffer(8786, b"k")))
    {'shared': False, 'shared_data': False, 'channel': {'port': 8786, 'token': b'k'}, 'kept': None}
    """
    return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _plain(value):
    return to_message(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


@dataclass
class ReplicaSettings:
    """What an all-reduce fit's set-up adds: the worker builds a replica (:mod:`adadamp.worker.replica`)."""

    timeout: float  # seconds a collective may run before its members look for a failed peer
    bucket_mb: float  # the size of the gradient buckets all-reduced during the backward pass
    applied: int  # the updates the payload's state has taken: steps are numbered from it, none taken twice
    #: Streamed data: the order its members find their examples in (a
    #: :class:`~adadamp.wire.batches.StreamOrder`, a dict once it crossed the RPC; the replica makes it one again).
    stream: Any = None


@dataclass
class SharedFile:
    """One array the client wrote to shared memory, for the workers on its host to map read-only."""

    path: str
    dtype: str  # numpy's dtype.str
    shape: tuple[int, ...]

    def __post_init__(self):
        self.shape = tuple(self.shape)  # a list, as it crossed the RPC


@dataclass
class ShmOffer:
    """What a worker's set-up needs to map the client's shared memory (:mod:`adadamp.wire.shm`):
    the fit's weights, this worker's gradient buffer, the training data (if the client shared it)
    and the token file that proves the worker is on the client's host, as the client's user."""

    weights: str  # the paths of the weight and gradient buffers (float32)
    gradient: str
    token_path: str
    token: str = field(repr=False)  # a secret: never logged
    X: SharedFile | None = None  # the training data, when the client shared it
    y: SharedFile | None = None

    def __post_init__(self):
        if isinstance(self.X, dict):  # as it crossed the RPC
            self.X = SharedFile(**self.X)
        if isinstance(self.y, dict):
            self.y = SharedFile(**self.y)


@dataclass
class SetupRequest:
    """A worker's set-up for one fit: the arguments of the ``adadamp_setup`` RPC."""

    fit_id: str  # several fits may share a worker: every later call names its fit
    payload: bytes = field(repr=False)  # cloudpickled (module, criterion, device[, optimizer]): large
    n_total: int  # the examples of the fit: a request naming any other index is refused
    channel: bool = False  # open a gradient channel (a tcp:// worker, dask config adadamp.channels)
    shared: ShmOffer | None = None  # the client's shared memory, for a worker on its host
    dataset: bytes | None = field(default=None, repr=False)  # a lazy torch Dataset and how to load it (pickled)
    replica: ReplicaSettings | None = None  # all-reduce fits: the payload holds the optimizer too
    fuse: bool = False  # a request's several shards may be one forward pass (speed-based shares)
    kit: TrainingKit | None = None  # precision and clipping (None: float32, no clipping)

    def __post_init__(self):
        if isinstance(self.replica, dict):  # as it crossed the RPC
            self.replica = ReplicaSettings(**self.replica)
        if isinstance(self.kit, dict):
            self.kit = TrainingKit(**self.kit)
        if isinstance(self.shared, dict):
            self.shared = ShmOffer(**self.shared)


@dataclass(frozen=True)
class TrainingKit:
    """How each update is computed and stepped beyond the plain gradient: ``precision`` (a key of
    :data:`adadamp.wire.precision.PRECISIONS`), ``clip_grad_norm`` (the gradient's largest global norm, as
    :func:`torch.nn.utils.clip_grad_norm_` takes it; None: no clipping) and ``micro_batch_size``
    (the most examples a worker passes forward and backward at once; None: its whole share);
    ``compile``: the keyword arguments of :func:`torch.compile` for the workers' module (None: eager);
    ``averaging``: ``kind`` ("ema" or "swa") and its settings (:mod:`adadamp.wire.averaging`; None: none)."""

    precision: str = "32-true"
    clip_grad_norm: float | None = None
    micro_batch_size: int | None = None
    compile: dict | None = None
    averaging: dict | None = None

    @property
    def scales_loss(self) -> bool:
        return self.precision == "16-mixed"


@dataclass
class ChannelOffer:
    """Where the client reaches a worker's gradient channel (:mod:`adadamp.wire.channel`)."""

    port: int  # on the worker's host
    token: bytes = field(repr=False)  # the secret the client proves itself with: never logged


@dataclass
class SetupReply:
    """What a worker's set-up found: the reply of the ``adadamp_setup`` RPC."""

    shared: bool  # it maps the client's shared memory: the weights and gradient, or (a replica) the data
    shared_data: bool  # it maps the client's training data: its blocks are placed by number only
    channel: ChannelOffer | None = None  # the gradient channel it opened (None: gradients go as Dask RPCs)
    kept: dict | None = None  # an all-reduce set-up: the group it keeps from an earlier fit (worker.groups)

    def __post_init__(self):
        if isinstance(self.channel, dict):  # as it crossed the RPC
            self.channel = ChannelOffer(**self.channel)


@dataclass
class Block:
    """One block of the fit's examples, placed on a worker (:mod:`adadamp.data.placement`)."""

    block: int  # the placement's number: blocks are dropped by it
    indices: np.ndarray  # the examples' global indices (consecutive): requests name examples by them
    X: np.ndarray
    y: np.ndarray


@dataclass
class BlockMove:
    """A worker's change of data blocks: the arguments of the ``adadamp_data`` RPC."""

    fit_id: str  # the fit whose blocks change
    add: list[Block]  # the blocks it takes (sent pickled: they hold arrays)
    drop: list[int]  # the numbers of the blocks it gives up


@dataclass
class BlocksReply:
    """The reply of the ``adadamp_data`` RPC: the blocks the worker holds for the fit now."""

    blocks: tuple[int, ...]

    def __post_init__(self):
        self.blocks = tuple(self.blocks)


@dataclass
class GroupRequest:
    """The arguments of the ``adadamp_group`` RPC: form an all-reduce fit's next group
    (:meth:`adadamp.worker.generation.GroupMember.join`); every member is called at once."""

    fit_id: str
    generation: int  # the group's number: its rendezvous keys, and what requests name
    rank: int  # this member's rank in it (rank 0 broadcasts its state to the others)
    size: int
    step: np.ndarray | None = None  # the step the member may still owe (StepVector.encode; None: none)
    restore: bytes | None = field(default=None, repr=False)  # rank 0 only: the client's committed state
    members: tuple[str, ...] = ()  # the group's workers in rank order (kept with the group after the fit)
    reuse: str | None = None  # the key of a group an earlier fit left on every member: taken over, not formed
    broadcast: bool = True  # False: every member was set up from the state the fit is at (rank 0 sends none)

    def __post_init__(self):
        self.members = tuple(self.members)


@dataclass
class GroupReply:
    """The reply of the ``adadamp_group`` RPC."""

    applied: int  # the updates the member's state has taken
    seconds: float  # how long forming the group took on the member
    reused: bool = False  # an earlier fit's group was taken over
    broadcast: bool = True  # rank 0's state was sent to the members


@dataclass
class CommitRequest:
    """The arguments of the ``adadamp_commit`` RPC: take an all-reduce fit's pending step
    (:meth:`adadamp.worker.replica.Replica.commit`)."""

    fit_id: str
    step: np.ndarray | None = None  # the pending step's StepVector.encode (None: drop the pending gradient)
    state: bool = False  # reply with the replica's state (the client's copy is brought up to date)
    groups: bytes | None = None  # the client's param groups (torch.save, no parameters): new hyperparameters
    keep: float = 0.0  # seconds the members keep their group should the fit end here (0: not kept)


@dataclass
class CommitReply:
    """The reply of the ``adadamp_commit`` RPC."""

    applied: int  # the updates the replica's state has taken
    state: bytes | None = field(default=None, repr=False)  # the replica's state, if asked (dump_state)


@dataclass
class ReleaseRequest:
    """The arguments of the ``adadamp_release`` RPC: drop a fit's state on the worker."""

    fit_id: str


@dataclass
class ReleaseReply:
    """The reply of the ``adadamp_release`` RPC."""

    released: bool  # the worker held the fit (False: it was gone already, e.g. dropped as idle)


@dataclass(frozen=True)
class StepVector:
    """What an all-reduce request carries besides the indices: the update it is, and the step the
    replicas still owe (:mod:`adadamp.worker.replica`).  Float64 numbers on the wire (:meth:`encode`).

    Examples
    --------
    >>> StepVector(2, 7, 6, 1.0, (0.1, 0.9)).encode().tolist()
    [2.0, 7.0, 6.0, 1.0, 0.1, 0.9]
    >>> StepVector.decode([2.0, 7.0, -1.0, 1.0]).step_of
    -1
    """

    generation: int  # the group the request is for: a replica of another generation refuses it
    update: int  # the update number: a replica at another update refuses it
    step_of: int = -1  # the update whose step to take first (-1: none)
    buffer_scale: float = 1.0  # that step's momentum-buffer scale (velocity compensation)
    settings: tuple[float, ...] = ()  # that step's learning rate and momentum, per param group

    #: The numbers before the settings.
    HEADER: ClassVar[int] = 4

    def encode(self) -> np.ndarray:
        """The vector a request sends."""
        return np.array([self.generation, self.update, self.step_of, self.buffer_scale, *self.settings],
                        dtype=np.float64)

    @classmethod
    def decode(cls, vector) -> StepVector | None:
        """The record of a vector :meth:`encode` made (None: no step)."""
        if vector is None:
            return None
        v = np.asarray(vector, dtype=np.float64)
        return cls(int(v[0]), int(v[1]), int(v[2]), float(v[3]), tuple(v[cls.HEADER:].tolist()))


def finite_update(loss_sum: float, weight: float, grad_sq_norm: float) -> bool:
    """Whether an all-reduced update's mean loss and gradient are finite: the one rule by which the
    client keeps an update's step and a member takes an announced one (the same totals on both).

    Examples
    --------
    >>> finite_update(3.0, 2.0, 0.5), finite_update(3.0, 0.0, 0.5), finite_update(3.0, 2.0, float("inf"))
    (True, False, False)
    """
    return bool(weight) and math.isfinite(loss_sum / weight) and math.isfinite(grad_sq_norm)


@dataclass
class UpdateRecord:
    """One model update: its batch, learning rate, workers, loss and where the time went (seconds).

    ``compute_time`` is the slowest worker's gradient, ``comm_time`` the round trip minus that,
    ``send_time`` the client writing the requests, ``aggregate_time`` averaging, the finite check
    and the damper's plan, ``step_time`` the optimizer step, ``update_time`` the whole update.
    ``sent_bytes`` and ``received_bytes`` are what the client's connections to the workers carried
    for the update's round (the data plane: requests and replies; not Dask's control messages).
    With dask config ``adadamp.debug.digests``, ``examples_digest`` is :func:`examples_digest` of
    the examples the workers' gradients were computed over, and ``weights_digest`` a hash of the
    weights after the step (both integers): two fits trained the same update alike exactly when
    both match.  ``shares`` are the examples each worker computed (in rank order; with
    ``shares="speed"`` they follow the workers' measured speeds), ``stragglers`` the ranks of
    the workers that would take over twice the median's time for an equal share
    (:mod:`adadamp.engine.speeds`) and ``lost`` the
    workers the update lost (dead, or not answering in ten times the others' time) and
    recomputed the shares of; ``lent`` the workers no fit wanted that the cluster's allocator lent
    to the update (:func:`~adadamp.cluster.division.lend`; only with ``shares="speed"``).
    ``peak_memory``: each worker's peak memory in bytes during the update (rank order; a CUDA
    worker's device memory, else its resident memory; 0: unknown, :mod:`adadamp.worker.memory`).
    ``grad_norm`` (with ``clip_grad_norm``) is the batch's mean gradient's global norm before
    clipping; ``skipped`` and ``loss_scale`` (``precision="16-mixed"``): 1 when the gradient was not
    finite at the update's loss scale and the step was skipped, and that scale.
    """

    batch_size: int
    lr: float
    n_workers: int
    loss: float
    compute_time: float
    comm_time: float
    send_time: float
    aggregate_time: float
    step_time: float
    update_time: float
    sent_bytes: int = 0
    received_bytes: int = 0
    examples_digest: int | None = None
    weights_digest: int | None = None
    shares: list[int] | None = None
    stragglers: list[int] | None = None
    lost: int | None = None
    lent: int | None = None
    peak_memory: list[int] | None = None
    grad_norm: float | None = None
    skipped: int | None = None
    loss_scale: float | None = None

    def row(self) -> dict:
        """The record as a row of ``history_[i]["updates"]`` (a shallow dict: every field is a
        number but ``shares`` and ``stragglers``, lists of integers; the digests only when they
        were taken)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def epoch_row(epoch: int, updates: list[dict], n_updates: int, n_samples_seen: int, dur: float) -> dict:
    """One epoch's row of ``history_`` from its update rows.

    ``train_loss`` is the batch losses' mean weighted by the batch sizes; ``batch_size`` the
    epoch's largest batch; ``lr`` and ``n_workers`` those of its last update; ``peak_memory`` (where
    the updates measured it) the largest peak of any worker in any update, in bytes.

    Examples
    --------
    >>> rows = [{"batch_size": 2, "loss": 1.0, "lr": 0.1, "n_workers": 1},
    ...         {"batch_size": 6, "loss": 0.5, "lr": 0.1, "n_workers": 2}]
    >>> row = epoch_row(1, rows, n_updates=2, n_samples_seen=8, dur=0.1)
    >>> row["train_loss"], row["batch_size"], row["n_workers"]
    (0.625, 6, 2)
    """
    n = sum(u["batch_size"] for u in updates)
    peaks = [m for u in updates for m in u.get("peak_memory") or ()]
    memory = {"peak_memory": max(peaks)} if peaks and max(peaks) > 0 else {}
    return {
        "epoch": epoch,
        "train_loss": sum(u["loss"] * u["batch_size"] for u in updates) / n,
        "batch_size": max(u["batch_size"] for u in updates),
        "lr": updates[-1]["lr"],
        "n_workers": updates[-1]["n_workers"],
        "n_updates": n_updates,
        "n_samples_seen": n_samples_seen,
        "dur": dur,
        **memory,
        "updates": updates,
    }


@dataclass
class TrainingState:
    """What one ``fit``/``partial_fit`` trains; the estimator's fitted attributes when it succeeds.

    A warm start trains a deep copy, so a failed call leaves the fitted state as it was.
    ``targets`` holds the fitted attributes that describe the data (``classes_``,
    ``n_features_in_``, ``feature_names_in_``, ...); ``fingerprint`` identifies the data and
    parameters a checkpoint was written for.
    """

    module: Any  # torch.nn.Module
    criterion: Any  # torch.nn.Module
    optimizer: Any  # torch.optim.Optimizer
    damper: Any  # adadamp.dampers.BaseDamper
    loop: Any  # adadamp.engine.LoopState: the clock and the sampler position
    history: list[dict] = field(default_factory=list)
    targets: dict = field(default_factory=dict)
    callbacks: list = field(default_factory=list)  # (name, Callback) clones that ran, with what they learned
    fingerprint: dict | None = None

    #: The estimator attribute of each field (``targets`` are attributes under their own names).
    ATTRIBUTES: ClassVar[dict[str, str]] = {"module": "module_", "criterion": "criterion_", "optimizer": "optimizer_", "damper": "damper_",
                  "loop": "loop_", "history": "history_", "callbacks": "callbacks_", "fingerprint": "_fingerprint_"}

    def attributes(self) -> dict:
        """The fitted attributes this state sets on an estimator."""
        out = {attr: getattr(self, name) for name, attr in self.ATTRIBUTES.items()}
        out.update(self.targets)
        return out

    def set_on(self, estimator) -> None:
        """Make this state ``estimator``'s fitted attributes (and ``n_iter_``, the epochs trained)."""
        if "n_features_in_" in self.targets and "feature_names_in_" not in self.targets:
            estimator.__dict__.pop("feature_names_in_", None)  # a fresh fit on data without column names
        for key, value in self.attributes().items():
            setattr(estimator, key, value)
        estimator.n_iter_ = len(self.history)

    @classmethod
    def of(cls, estimator, target_keys: tuple[str, ...]) -> TrainingState:
        """The fitted state of ``estimator`` (its attributes) as a TrainingState."""
        fields = {name: getattr(estimator, attr, None) for name, attr in cls.ATTRIBUTES.items()}
        fields["history"] = fields["history"] or []
        fields["callbacks"] = []  # a fit resolves its own clones; the last fit's stay on the estimator
        targets = {k: getattr(estimator, k) for k in target_keys if hasattr(estimator, k)}
        return cls(**fields, targets=targets)
