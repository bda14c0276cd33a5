"""Other local users and files on disk are not trusted (DESIGN.md §4): shared memory is private to
the user who trains, a /dev/shm too small for the fit costs speed and not the process, and a
checkpoint file can neither run code nor be one that others could have written."""

import os
import pickle
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import dask
import numpy as np
import pytest
import torch

from adadamp import DaskRegressor, checkpoint, shm
from adadamp.callbacks import Callback
from adadamp.dampers import AdaScale, GeoDamp

ROOT = os.geteuid() == 0
NOBODY = 65534


@pytest.fixture(scope="module")
def data(regression_data):
    return regression_data


def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


class LookAtSharedMemory(Callback):
    """Records, after the first update, what the fit keeps in the shared-memory directory."""

    def __init__(self, root=None):
        self.root = root

    def on_update_end(self, estimator, record=None, **info):
        if hasattr(self, "seen_"):
            return
        self.seen_ = {}
        for d in Path(self.root).iterdir():
            if d.name.startswith(f"adadamp-{os.getpid()}-"):
                self.seen_[d] = stat.S_IMODE(d.lstat().st_mode)
                for f in d.iterdir():
                    self.seen_[f] = stat.S_IMODE(f.lstat().st_mode)
                if ROOT:  # another user tries to read the weights, as in the report
                    other = subprocess.run(
                        ["head", "-c", "4", str(d / "weights")],
                        check=False, user=NOBODY, capture_output=True, text=True,
                    )
                    self.other_user_ = other.returncode, other.stderr.strip().splitlines()[-1:]


# ------------------------------------------------------------------------------ shared memory
def test_shared_memory_is_one_private_directory_removed_after_the_fit(client, data, tmp_path):
    X, y = data
    root = tmp_path / "shm"
    root.mkdir()
    look = LookAtSharedMemory(root=str(root))
    with dask.config.set({"adadamp.shm-dir": str(root)}):
        est = DaskRegressor(max_epochs=1, random_state=0, callbacks=[("look", look)]).fit(X, y)
    seen = dict(est.callbacks_)["look"].seen_
    dirs = [p for p in seen if p.parent == root]
    assert len(dirs) == 1 and seen[dirs[0]] == 0o700, seen
    files = {p.name: mode for p, mode in seen.items() if p.parent == dirs[0]}
    n_workers = len(client.scheduler_info()["workers"])
    expected = {"token", "weights", "data-X", "data-y", *(f"gradient-{k}" for k in range(1, n_workers + 1))}
    assert set(files) == expected, files
    assert set(files.values()) == {0o600}
    if ROOT:
        code, err = dict(est.callbacks_)["look"].other_user_
        assert code != 0 and "Permission denied" in err[0], err
    assert list(root.iterdir()) == []  # nothing left behind


def test_a_worker_maps_only_private_files_of_its_own_user(tmp_path):
    size = 16
    good = shm.create_private_array(str(tmp_path / "good"), size)
    good[:] = 3.0
    assert stat.S_IMODE(os.stat(tmp_path / "good").st_mode) == 0o600
    np.testing.assert_array_equal(shm.open_private_array(str(tmp_path / "good"), size), good)  # same memory

    with pytest.raises(FileExistsError):  # a file planted where a buffer is to be created
        shm.create_private_array(str(tmp_path / "good"), size)
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(FileExistsError):  # ... or a link
        shm.create_private_array(str(tmp_path / "link"), size)
    assert not (tmp_path / "elsewhere").exists()

    (tmp_path / "open").write_bytes(bytes(4 * size))
    os.chmod(tmp_path / "open", 0o644)
    with pytest.raises(PermissionError, match="open to other users"):
        shm.open_private_array(str(tmp_path / "open"), size)
    with pytest.raises(PermissionError, match="bytes"):
        shm.open_private_array(str(tmp_path / "good"), size + 1)
    os.symlink(tmp_path / "good", tmp_path / "to-good")
    with pytest.raises(OSError):  # O_NOFOLLOW
        shm.open_private_array(str(tmp_path / "to-good"), size)
    if ROOT:
        os.chown(tmp_path / "good", NOBODY, NOBODY)
        with pytest.raises(PermissionError, match="belongs to user"):
            shm.open_private_array(str(tmp_path / "good"), size)


def test_a_worker_without_the_token_uses_the_socket(tmp_path):
    buffers = shm.SharedBuffers.create(8, root=str(tmp_path))
    try:
        offer = buffers.offer("tcp://worker:1")
        assert shm.attach(offer, 8) is not None
        assert shm.attach({**offer, "token": "guessed"}, 8) is None
        assert shm.attach({**offer, "token_path": str(tmp_path / "nowhere")}, 8) is None  # another machine
        assert shm.attach(offer, 9) is None  # another model
    finally:
        buffers.close()
    assert list(tmp_path.iterdir()) == []


def test_directories_of_dead_clients_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"adadamp-{dead.pid}-abc"
    live = tmp_path / f"adadamp-{os.getppid()}-abc"
    for d in (stale, live):
        d.mkdir()
        (d / "weights").write_bytes(b"x")
    buffers = shm.SharedBuffers.create(8, root=str(tmp_path))
    buffers.close()
    assert not stale.exists() and live.exists()


SMALL_SHM_FIT = """
import logging, sys
import dask, numpy as np, torch
from distributed import Client, LocalCluster
from adadamp import DaskRegressor

if __name__ == "__main__":
    root, mode, out = sys.argv[1:4]
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 256)).astype(np.float32)
    y = X[:, :4].sum(axis=1).astype(np.float32)
    params = dict(module__hidden=(192,), max_epochs=2, random_state=0)  # 49.6k weights: 194 KiB
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster):
        with dask.config.set({"adadamp.shm-dir": root if mode == "small" else None}):
            est = DaskRegressor(**params).fit(X, y)
    np.save(out, torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy())
"""


@pytest.mark.parametrize("size_kib", [512, 128])  # weights + one gradient fit / not even the weights
def test_a_small_shared_memory_falls_back_to_sockets(tmp_path, size_kib):
    """A tmpfs too small for the fit (as Docker's 64 MiB /dev/shm is for a large model), in a private
    mount namespace: the fit goes on over sockets, says so once, and trains the same weights."""
    if ROOT:
        unshare = ["unshare", "--mount", "--propagation", "private"]
    else:
        unshare = ["unshare", "--mount", "--map-root-user"]
    small = tmp_path / "small"
    small.mkdir()
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent(SMALL_SHM_FIT))
    run = [*unshare, "sh", "-c", f'mount -t tmpfs -o size={size_kib}k tmpfs "$1" && exec "$2" "$3" "$1" "$4" "$5"', "sh"]
    probe = subprocess.run([*unshare, "true"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"cannot make a mount namespace here (needs root or user namespaces): {probe.stderr}")
    small_fit = subprocess.run([*run, str(small), sys.executable, str(script), "small", str(tmp_path / "a.npy")],
                               check=False, capture_output=True, text=True, timeout=240)
    assert small_fit.returncode == 0, small_fit.stderr[-3000:]
    warnings = [line for line in small_fit.stderr.splitlines() if "no shared memory" in line]
    assert len(warnings) == 1, small_fit.stderr[-3000:]
    assert "adadamp" in warnings[0]
    plain = subprocess.run([sys.executable, str(script), str(small), "off", str(tmp_path / "b.npy")],
                           check=False, capture_output=True, text=True, timeout=240)
    assert plain.returncode == 0, plain.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


# -------------------------------------------------------------------------------- checkpoints
class Planted:
    """What an attacker pickles: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_checkpoint_runs_no_code(data, tmp_path, new_processes):
    X, y = data
    path = tmp_path / "fit.ckpt"
    marker = tmp_path / "owned"
    with open(path, "wb") as f:
        pickle.dump({"format": checkpoint.FORMAT, "loop": Planted(marker)}, f, protocol=2)
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match="not an adadamp checkpoint"):
        DaskRegressor(max_epochs=1, checkpoint=path).fit(X, y)
    assert not marker.exists()
    assert new_processes() == []  # refused before any cluster work


def test_checkpoints_others_could_write_are_refused(data, tmp_path, client):
    X, y = data
    path = tmp_path / "fit.ckpt"
    est = DaskRegressor(max_epochs=1, random_state=0, checkpoint=path).fit(X, y)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o664)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="chmod go-w"):
        DaskRegressor(max_epochs=2, checkpoint=path).fit(X, y)
    with pytest.raises(checkpoint.UnsafeCheckpointError):
        est.load_params(f_checkpoint=path)
    if ROOT:
        os.chmod(path, 0o600)
        os.chown(path, NOBODY, NOBODY)
        foreign = path
    else:
        foreign = Path("/etc/passwd")  # a file of another user (root)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="belongs to user"):
        checkpoint.load(foreign)


def test_checkpoint_writes_are_atomic_and_follow_no_link(data, tmp_path, client):
    X, y = data
    path = tmp_path / "fit.ckpt"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "fit.ckpt.tmp")  # the fixed temporary name of old
    DaskRegressor(max_epochs=2, random_state=0, checkpoint=path, checkpoint_every=3).fit(X, y)
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.ckpt", "fit.ckpt.tmp", "victim"]
    assert len(checkpoint.load(path)["history"]) == 2


@pytest.mark.parametrize("schedule", [GeoDamp(initial=16, delay=1), AdaScale(batch_size=32)])
def test_the_schedules_fitted_state_survives_a_checkpoint(data, tmp_path, client, schedule):
    X, y = data
    params = {"batch_size": schedule, "optimizer": torch.optim.SGD, "random_state": 1}
    whole = DaskRegressor(max_epochs=3, **params).fit(X, y)
    path = tmp_path / "fit.ckpt"
    DaskRegressor(max_epochs=2, checkpoint=path, **params).fit(X, y)
    resumed = DaskRegressor(max_epochs=3, checkpoint=path, **params).fit(X, y)
    np.testing.assert_array_equal(_weights(resumed), _weights(whole))
    fitted = {k: v for k, v in vars(whole.damper_).items() if k.endswith("_") and not hasattr(v, "next_batch_size")}
    assert fitted and all(np.all(getattr(resumed.damper_, k) == v) for k, v in fitted.items()), fitted


def test_a_checkpoint_of_another_fit_is_not_taken_for_this_one(data, tmp_path, client):
    """GridSearchCV clones sharing one checkpoint path: the second used to return the first one's
    model without training."""
    X, y = data
    path = tmp_path / "fit.ckpt"
    DaskRegressor(max_epochs=1, batch_size=16, random_state=0, checkpoint=path).fit(X, y)
    with pytest.raises(ValueError, match="other parameters"):
        DaskRegressor(max_epochs=1, batch_size=32, random_state=0, checkpoint=path).fit(X, y)
    flipped = X.copy()
    flipped[::2] *= -1  # same shape, other examples
    with pytest.raises(ValueError, match="other training data"):
        DaskRegressor(max_epochs=1, batch_size=16, random_state=0, checkpoint=path).fit(flipped, y)
    more = DaskRegressor(max_epochs=2, batch_size=16, random_state=0, checkpoint=path).fit(X, y)
    assert len(more.history_) == 2  # the same fit with more epochs resumes
