"""The engine's pure parts, without Dask: the sampler, the block placement, the cluster policy,
the records, the backends' registry and the shared epoch loop (each runs in milliseconds)."""

import numpy as np
import pytest

from adadamp.cluster import ClusterPolicy
from adadamp.dampers.epoch import run_epoch
from adadamp.data.placement import Placement, plan_moves
from adadamp.engine import AllReduce, Backend, LoopState, ParameterServer, Sampler
from adadamp.engine.backends import backend_names, get_backend, register_backend
from adadamp.records import (
    BlocksReply,
    ChannelOffer,
    CommitReply,
    CommitRequest,
    GradientRequest,
    GroupReply,
    GroupRequest,
    ReleaseReply,
    ReleaseRequest,
    ReplicaSettings,
    SetupReply,
    SetupRequest,
    SharedFile,
    ShareRequest,
    ShmOffer,
    UpdateRecord,
    epoch_row,
    to_message,
)
from adadamp.wire.rpc import rpc_call


def test_sampler_draws_one_permutation_per_data_epoch_without_straddling():
    loop = LoopState(seed=3, n_data=10)
    s = Sampler(loop)
    batches = [s.take(4) for _ in range(6)]
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]  # the last batch of an epoch is short
    first, second = np.concatenate(batches[:3]), np.concatenate(batches[3:])
    assert sorted(first) == sorted(second) == list(range(10))  # every example once per epoch
    assert first.tolist() == LoopState(seed=3, n_data=10).permutation().tolist()
    assert second.tolist() == LoopState(seed=3, n_data=10, data_epoch=1).permutation().tolist()
    assert not np.array_equal(first, second)
    assert (loop.data_epoch, loop.position) == (2, 0)


def test_sampler_resumes_mid_epoch_from_the_loop_state():
    loop = LoopState(seed=0, n_data=9)
    whole = Sampler(loop)
    whole.take(3)
    b, c = whole.take(3), whole.take(3)
    resumed = Sampler(LoopState(seed=0, n_data=9, position=3))  # a checkpoint after the first batch
    assert np.array_equal(resumed.take(3), b) and np.array_equal(resumed.take(3), c)


@pytest.mark.parametrize("n_blocks", [3, 7, 256])
def test_plan_moves_balances_shards_and_moves_as_little_as_possible(n_blocks):
    old = [None] * n_blocks
    shard_of, holder, add, drop = plan_moves(old, ["a", "b", "c"], n_shards=3)
    assert holder == ["a", "b", "c"] and sum(len(v) for v in add.values()) == n_blocks and not any(drop.values())
    assert np.all(np.diff(shard_of) >= 0) and max(np.bincount(shard_of, minlength=3)) - min(np.bincount(shard_of, minlength=3)) <= 1
    owner = [holder[g] for g in shard_of]
    # one worker dies: its shard goes whole to a survivor, nobody else's moves, the shards stay the same
    shard_of2, holder2, add2, drop2 = plan_moves(owner, ["a", "c"], n_shards=3)
    assert shard_of2.tolist() == shard_of.tolist() and holder2 == ["a", "a", "c"]
    assert add2 == {"a": [b for b in range(n_blocks) if owner[b] == "b"], "c": []} and not any(drop2.values())
    # its replacement joins: it takes that shard back, and only it moves
    owner2 = [holder2[g] for g in shard_of2]
    _, holder3, add3, drop3 = plan_moves(owner2, ["a", "c", "d"], n_shards=3)
    assert holder3 == ["a", "d", "c"] and add3["d"] == drop3["a"] == add2["a"]
    # more workers than shards: the last ones hold none
    _, holder4, _, _ = plan_moves(owner, ["a", "b", "c", "d"], n_shards=3)
    assert holder4 == ["a", "b", "c"]


def test_more_shards_keep_most_blocks_where_they_are():
    owner = ["a"] * 128 + ["b"] * 128  # two shards of 128 blocks, cut into three: 86, 85, 85
    _, holder, add, drop = plan_moves(owner, ["a", "b", "c"], n_shards=3)
    assert holder == ["a", "b", "c"]  # shard 1 holds 42 blocks of a's and 43 of b's: it goes to b
    assert add == {"a": [], "b": list(range(86, 128)), "c": list(range(171, 256))}
    assert drop == {"a": list(range(86, 128)), "b": list(range(171, 256)), "c": []}


def test_placement_cuts_a_batch_by_shards_held_by_ranks():
    p = Placement(100, n_blocks=10)
    shard_of, holder, _, _ = plan_moves(p.names([]), ["w0", "w1"], n_shards=3)
    p.assign(shard_of, holder, ["w0", "w1"])
    idx = np.random.default_rng(0).permutation(100)[:40]
    shards = p.shards(idx)
    assert [g for g, _ in shards] == [0, 1, 2]  # in shard order
    assert sorted(np.concatenate([s for _, s in shards]).tolist()) == sorted(idx.tolist())
    for g, sub in shards:
        assert sub.tolist() == [i for i in idx.tolist() if p.shard_of[i // p.block_size] == g]  # order kept
    for g, sub in shards:
        assert all(p.owner[i // p.block_size] == p.holder[g] for i in sub)  # routed to the shard's holder


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(1, 1), (128, 1), (129, 2), (1000, 8), (10_000, 16)],
)
def test_cluster_policy_clips_the_workers_a_batch_calls_for(batch, expected):
    assert ClusterPolicy(grads_per_worker=128, min_workers=1, max_workers=16).wanted(batch) == expected


def test_records_make_the_history_rows():
    rec = UpdateRecord(8, 0.1, 2, 0.5, 0.01, 0.002, 0.001, 0.0005, 0.0003, 0.02)
    row = rec.row()
    assert list(row) == ["batch_size", "lr", "n_workers", "loss", "compute_time", "comm_time", "send_time",
                         "aggregate_time", "step_time", "update_time", "sent_bytes", "received_bytes"]
    epoch = epoch_row(3, [row, {**row, "batch_size": 2, "loss": 1.0}], n_updates=12, n_samples_seen=40, dur=1.5)
    assert epoch["train_loss"] == pytest.approx((0.5 * 8 + 1.0 * 2) / 10)
    assert (epoch["epoch"], epoch["batch_size"], epoch["n_updates"]) == (3, 8, 12)


def test_the_registry_names_the_backends_and_refuses_other_names():
    assert get_backend("parameter-server") is ParameterServer and get_backend("allreduce") is AllReduce
    assert not issubclass(AllReduce, ParameterServer) and issubclass(AllReduce, Backend)
    with pytest.raises(ValueError, match=r"backend must be one of \['allreduce', 'parameter-server'\]; got 'nope'"):
        get_backend("nope")
    with pytest.raises(TypeError, match="subclass of adadamp.engine.backends.Backend"):
        register_backend("mine", object)


def test_a_registered_backend_is_found_by_name():
    class Mine(ParameterServer):
        pass

    register_backend("mine", Mine)
    try:
        assert get_backend("mine") is Mine and "mine" in backend_names()
    finally:
        from adadamp.engine.backends import registry

        registry._BACKENDS.pop("mine")


def test_the_hooks_a_backend_must_implement_are_public_and_listed():
    """What ``register_backend`` promises a new backend: the hooks it implements, named in the
    class's docstring (the others have defaults)."""
    required = {"module_payload", "bind", "gradient_round", "finite", "keep_last_finite", "grad_sq_norm", "step", "sync"}
    assert Backend.__abstractmethods__ == required
    optional = {"setup_request", "setup_reply", "announce_step", "stepped_weights"}
    for hook in required | optional:
        assert f":meth:`{hook}`" in Backend.__doc__, hook
        assert getattr(Backend, hook).__doc__, hook


def test_the_sizing_mixin_declares_what_it_reads_of_its_backend():
    """Every attribute ``Sizing`` uses of ``self`` is declared on the class (or is its own), and
    every declared one is a property of ``Backend`` or set by it or by ``Sizing``."""
    import ast
    import inspect

    from adadamp.engine.backends import base, sizing

    def attributes(module, stored: bool) -> set[str]:
        tree = ast.parse(inspect.getsource(module))
        return {node.attr for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and (not stored or isinstance(node.ctx, ast.Store))}

    declared = set(sizing.Sizing.__annotations__)
    own = set(vars(sizing.Sizing))  # its methods and class attributes
    assert attributes(sizing, stored=False) - own <= declared
    properties = {name for name, value in vars(Backend).items() if isinstance(value, property)}
    assert declared <= attributes(base, stored=True) | attributes(sizing, stored=True) | properties


def test_the_epoch_loop_runs_updates_to_the_epochs_end_and_runs_an_undone_one_again():
    loop, records, seen, undone = LoopState(seed=0, n_data=10), [], [], [False]

    def update():
        if loop.n_updates == 1 and not undone[0]:  # undone once (the all-reduce backend's roll-back)
            undone[0] = True
            return None
        loop.advance(4)
        return loop.n_updates

    assert run_epoch(loop, update, records, on_update=lambda r: seen.append(list(r))) == 10
    assert records == [1, 2, 3] and seen == [[1], [1, 2], [1, 2, 3]]
    assert (loop.n_updates, loop.n_samples_seen, loop.progress) == (3, 12, 12.0)


@pytest.mark.parametrize("n_blocks,n_shards,lengths", [(7, 3, None), (5, 5, None), (6, 2, [10, 30, 5, 20, 25, 10])])
def test_a_batch_plan_names_the_examples_the_client_would_have_listed(n_blocks, n_shards, lengths):
    """An all-reduce member finds its shards' examples (and those to load ahead) from a BatchPlan
    exactly as the client cuts the batch, whether blocks are uniform or a dask collection's."""
    from adadamp.wire.batches import BatchPlan, epoch_permutation

    n = 100
    placement = Placement(n, n_blocks=n_blocks, lengths=lengths)
    workers = ["a", "b"]
    shard_of, holder, _, _ = plan_moves(placement.names([]), workers, n_shards)
    placement.assign(shard_of, holder, workers)
    loop = LoopState(seed=3, n_data=n, data_epoch=1, position=90)  # the batch ends the epoch
    sampler = Sampler(loop)
    start = loop.position
    idx = sampler.take(16)
    ahead = sampler.peek(16, 2)[:n]
    owner_of_ahead = placement.owner[placement.blocks_of(ahead % n)]
    by_shard = dict(placement.shards(idx))
    perm = epoch_permutation(3, 1, n)
    for k in range(2):
        held = np.flatnonzero(placement.holder == k).tolist()
        plan = BatchPlan(3, start, start + len(idx), placement.n_shards, placement.n_blocks,
                         placement.block_size or 0, 16, 2, np.array(held, dtype=np.int64))
        plan = BatchPlan.from_array(plan.to_array(layout=False), BatchPlan.from_array(plan.to_array()).layout())
        with pytest.raises(ValueError, match="no layout"):  # a member that never heard the layout refuses
            BatchPlan.from_array(plan.to_array(layout=False))
        with pytest.raises(ValueError, match="3 or at least 8"):
            BatchPlan.from_array(plan.to_array()[:6])
        mine = set(np.flatnonzero(placement.owner == k).tolist())

        def block_of(indices, mine=mine):
            blocks = placement.blocks_of(indices)
            return np.where(np.isin(blocks, list(mine)), blocks, -1)

        got, counts = plan.indices(perm, block_of)
        expected = [by_shard[g] for g in held if g in by_shard]
        np.testing.assert_array_equal(got, np.concatenate(expected) if expected else idx[:0])
        assert counts.tolist() == [len(by_shard.get(g, ())) for g in held]
        if placement.block_size:
            np.testing.assert_array_equal(plan.ahead(n, 1, perm), ahead[owner_of_ahead == k])


def test_the_rpc_messages_cross_as_themselves():
    """Each RPC's record, sent as Dask's comm sends it (msgpack) and rebuilt on the other side
    (``Record(**message)``), equals what was sent: nested records (the offers) included."""
    from distributed.protocol import dumps, loads

    offer = ShmOffer("/dev/shm/w", "/dev/shm/g", "/dev/shm/token", "secret",
                     X=SharedFile("/dev/shm/X", "<f4", (3, 2)), y=SharedFile("/dev/shm/y", "<i8", (3,)))
    messages = [
        SetupRequest("fit", b"payload", 3, shared=offer, replica=ReplicaSettings(30.0, 25.0, 0)),
        SetupReply(True, True, ChannelOffer(8786, b"key")),
        BlocksReply((0, 3)),
        GroupRequest("fit", 2, 0, 3, restore=b"state"), GroupReply(4, 0.5),
        CommitRequest("fit", state=True, groups=b"groups"), CommitReply(4, b"state"),
        ReleaseRequest("fit"), ReleaseReply(True),
    ]
    for message in messages:
        assert type(message)(**loads(dumps(to_message(message)))) == message
    assert "secret" not in repr(offer)  # the token proves the client's user: never logged
    step = np.array([2.0, 7.0, -1.0, 1.0])
    _, op, kwargs = rpc_call("tcp://w:1", "adadamp_commit", CommitRequest("fit", step), serialized=("step",))
    assert op == "adadamp_commit" and np.array_equal(CommitRequest(**loads(dumps(kwargs))).step, step)
    # A share crosses inside its gradient request, its arrays through Dask's serialization, not msgpack.
    share = ShareRequest("tcp://w:1", 7, np.arange(3), epoch=2, ahead=np.arange(3, 5), parts=np.array([[7, 3]]))
    request = GradientRequest(share, 2, np.ones(4, dtype=np.float32), fit_id="fit")
    crossed = GradientRequest(**loads(dumps(rpc_call("tcp://w:1", "adadamp_gradient", request)[2])))
    assert (crossed.fit_id, crossed.n_chunks, crossed.buffers, crossed.share.seed, crossed.share.epoch) == ("fit", 2, None, 7, 2)
    for name in ("indices", "ahead", "parts"):
        np.testing.assert_array_equal(getattr(crossed.share, name), getattr(share, name))
    np.testing.assert_array_equal(crossed.weights, request.weights)
    assert crossed.nbytes() == request.nbytes() == 3 * 8 + 2 * 8 + 2 * 8 + 4 * 4
    with pytest.raises(TypeError):  # a share that is not one is refused before anything is computed
        GradientRequest(**{**loads(dumps(rpc_call("tcp://w:1", "adadamp_gradient", request)[2])), "share": [7]})


def test_a_share_is_gathered_in_its_indices_order_however_its_blocks_are_held():
    """A worker may hold a shard's blocks as several segments (Dask partitions it borrows, blocks
    the client sent it after a loss): the share's rows come in the indices' order all the same, so
    the gradient sums in the same order whichever worker computes it."""
    import torch

    from adadamp.records import Block
    from adadamp.worker.resident import ResidentData

    X, y = np.arange(24, dtype=np.float32).reshape(12, 2), np.arange(12)
    blocks = [Block(b, np.arange(4 * b, 4 * b + 4), X[4 * b : 4 * b + 4], y[4 * b : 4 * b + 4]) for b in range(3)]
    borrowed, mixed = ResidentData(12, torch.device("cpu")), ResidentData(12, torch.device("cpu"))
    borrowed.update(blocks, [], borrowed=True)
    mixed.update(blocks[2:], [])  # sent by the client after a worker was lost: owned
    mixed.update(blocks[:2], [], borrowed=True)
    indices = np.array([9, 1, 6, 10, 0, 5])
    for data in (borrowed, mixed):
        Xs, ys = data.gather(indices)
        assert ys.tolist() == indices.tolist()
        np.testing.assert_array_equal(Xs.numpy(), X[indices])
