"""A checkpoint file is checked before anything is built from it (docs/guide/security.rst): what it
declares cannot take memory beyond its own size, a FIFO at its path cannot hang the fit, and every
crafted field is refused with one error naming the file, leaving the fitted state as it was."""

import dataclasses
import io
import os
import re
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification
from torch import nn

from adadamp import DaskClassifier, checkpoint
from adadamp.dampers import GeoDamp
from adadamp.dampers.clock import LoopState
from adadamp.records import TrainingState

N = 100  # examples the states below were fitted on


def _state(optimizer=torch.optim.SGD) -> TrainingState:
    """A classifier's state as a fit leaves it: a 2-output module, its optimizer after one step."""
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    opt = optimizer(module.parameters(), **({"lr": 0.1, "momentum": 0.9} if optimizer is torch.optim.SGD else {}))
    module(torch.ones(3, 4)).sum().backward()
    opt.step()
    return TrainingState(module=module, criterion=nn.CrossEntropyLoss(), optimizer=opt,
                         damper=GeoDamp(initial=8, delay=1).reset(N), loop=LoopState(seed=0, n_data=N),
                         history=[{"epoch": 1}], targets={"classes_": np.array(["a", "b"])})


def _text(value) -> str:
    """``value`` as text, tensors and arrays by their values, to compare states."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return f"{value.dtype}{value.tolist()}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(_text, value)) + "]"
    return repr(value)


def _snapshot(state: TrainingState) -> str:
    """What a restore may change."""
    return _text([state.module.state_dict(), state.optimizer.state_dict(), vars(state.damper), state.targets,
                  dataclasses.asdict(state.loop), state.history])


def _tamper(path: Path, change) -> None:
    payload = torch.load(path, weights_only=True)
    change(payload)
    torch.save(payload, path)
    os.chmod(path, 0o600)


def _shared_twice(levels: int) -> list:
    """A list holding the same child twice, ``levels`` deep: 2**levels leaves once expanded."""
    value = [0.5]
    for _ in range(levels):
        value = [value, value]
    return value


@pytest.fixture
def path(tmp_path) -> Path:
    path = tmp_path / "fit.ckpt"
    checkpoint.save(path, _state(), [])
    return path


# ------------------------------------------------------------------------------ memory
BOUNDED = """
import resource, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
import test_checkpoint_bounds as t
from adadamp import checkpoint
state = t._state()
size = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, size + 2**30))  # a regression fails, not the machine
start = time.perf_counter()
try:
    {call}
    print("loaded")
except BaseException as err:
    print(type(err).__name__, time.perf_counter() - start, err)
"""


@pytest.mark.parametrize(("change", "call"), [
    pytest.param(lambda p: p["targets"].update(classes_={"values": [0, 1, 2, 3], "dtype": "V2000000000"}),
                 "checkpoint.load(sys.argv[1])", id="void-dtype-classes"),
    pytest.param(lambda p: p["optimizer"]["state"][0].update(
        momentum_buffer=torch.zeros(1, dtype=torch.float64).expand(10**5, 10**5)),
        "checkpoint.load_parts(state, t.N, f_checkpoint=sys.argv[1])", id="expanded-optimizer-state"),
    pytest.param(lambda p: p["optimizer"]["state"][0].update(
        momentum_buffer=torch.empty(10**6, 10**6, dtype=torch.float64, device="meta")),
        "checkpoint.load_parts(state, t.N, f_checkpoint=sys.argv[1])", id="meta-optimizer-state"),
    pytest.param(lambda p: next(iter(p["damper"]["fitted"].values())).update(value=_shared_twice(24)),
                 "checkpoint.load_parts(state, t.N, f_checkpoint=sys.argv[1])", id="damper-state-shared-references"),
    pytest.param(lambda p: p["history"][0].update(shared=_shared_twice(24)),
                 "checkpoint.load_parts(state, t.N, f_checkpoint=sys.argv[1])", id="history-shared-references"),
])
def test_what_a_file_declares_is_refused_within_a_second_and_allocates_nothing(path, change, call):
    """A 2 GB dtype for each of 4 labels (8 GB and 30 s, then MemoryError before the fingerprint
    check); an optimizer state of 10^10 elements over 8 bytes of data (40 GB when converted); a list
    holding the same child twice, 24 levels deep (pickle writes it once: a few KB), which the damper's
    restore copied into 1.65 GiB and a resumed fit's next save wrote out whole."""
    _tamper(path, change)
    assert path.stat().st_size < 64 * 1024
    script = BOUNDED.format(tests=str(Path(__file__).parent), call=call)
    out = subprocess.run([sys.executable, "-c", script, str(path)], check=False, capture_output=True, text=True,
                         timeout=300)
    last = (out.stdout.strip().splitlines() or ["(nothing)"])[-1]
    assert last.startswith("CorruptCheckpointError "), (last, out.stderr[-2000:])
    _, seconds, message = last.split(" ", 2)
    assert float(seconds) < 1.0 and str(path) in message


def test_a_compressed_archive_is_refused(path):
    """torch.load inflates deflated parts: 200 KB would become 200 MB of tensor data."""
    with zipfile.ZipFile(path) as z:
        parts = {i.filename: z.read(i.filename) for i in z.infolist()}
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in parts.items():
            z.writestr(name, data)
    path.write_bytes(packed.getvalue())
    with pytest.raises(checkpoint.CorruptCheckpointError, match=f"{re.escape(str(path))}.*compressed"):
        checkpoint.load(path)


# ------------------------------------------------------------------------------ FIFO
def _refused_at_once(fifo: Path, load) -> None:
    """``load()`` of the FIFO at ``fifo`` returns within 5 s with the not-a-regular-file refusal."""
    outcome = []

    def attempt():
        try:
            outcome.append(load())
        except (OSError, ValueError) as err:  # UnsafeCheckpointError is an OSError
            outcome.append(err)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(5)
    try:
        assert not thread.is_alive(), "open() blocked on the FIFO"
        assert isinstance(outcome[0], checkpoint.UnsafeCheckpointError), outcome
        assert "not a regular file" in str(outcome[0])
    finally:
        if thread.is_alive():  # a regression: a writer lets the blocked open() return
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(5)


def test_a_fifo_at_the_checkpoint_path_is_refused_at_once(tmp_path):
    path = tmp_path / "fit.ckpt"
    os.mkfifo(path, 0o600)
    _refused_at_once(path, lambda: checkpoint.load(path))


# ------------------------------------------------------------------------------ crafted fields
def _set_class_values(p, values):
    p["targets"]["classes_"]["values"] = values


CRAFTED = {
    "missing-targets": lambda p: p.pop("targets"),
    "history-not-a-list": lambda p: p.update(history=5),
    "loop-count-a-string": lambda p: p["loop"].update(n_data="100"),
    "three-classes-for-two-outputs": lambda p: p["targets"]["classes_"]["values"].append("c"),
    "regressor-targets": lambda p: p.update(targets={"_y_1d": True}),
    "object-labels": lambda p: p["targets"].update(classes_={"values": [[1], [2]], "dtype": "|O"}),
    "labels-not-of-the-dtype": lambda p: _set_class_values(p, [1, 2]),
    "wrong-weight-shape": lambda p: p["module"].update(weight=torch.zeros(3, 4)),
    "missing-bias": lambda p: p["module"].pop("bias"),
    "momentum-of-another-shape": lambda p: p["optimizer"]["state"][0].update(momentum_buffer=torch.zeros(4, 2)),
    "learning-rate-a-string": lambda p: p["optimizer"]["param_groups"][0].update(lr="fast"),
    "state-of-no-parameter": lambda p: p["optimizer"]["state"].update({7: {"momentum_buffer": torch.zeros(2)}}),
    "nested-in-a-cycle": lambda p: p["history"][0].update(cycle=p["history"]),
}


@pytest.mark.parametrize("change", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_crafted_field_is_refused_by_name_and_changes_nothing(path, change):
    """What ``load_params(f_checkpoint=...)`` runs: refused with the one error, the state untouched."""
    _tamper(path, change)
    state = _state()
    before = _snapshot(state)
    with pytest.raises(checkpoint.CorruptCheckpointError, match=re.escape(str(path))):
        checkpoint.load_parts(state, N, f_checkpoint=path)
    assert _snapshot(state) == before


ADAFACTOR = getattr(torch.optim, "Adafactor", None)  # torch >= 2.5


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam, pytest.param(
    ADAFACTOR, id="Adafactor", marks=pytest.mark.skipif(ADAFACTOR is None, reason="torch < 2.5 has no Adafactor"))])
def test_a_checkpoint_adadamp_wrote_still_loads(tmp_path, optimizer):
    """The bounds refuse nothing adadamp writes (Adafactor's factored moments included)."""
    path = tmp_path / "fit.ckpt"
    written = _state(optimizer)
    checkpoint.save(path, written, [])
    state = _state(optimizer)
    with torch.no_grad():
        state.module.weight.zero_()
    checkpoint.load_parts(state, N, f_checkpoint=path)
    assert _snapshot(state) == _snapshot(written)


# ------------------------------------------------------------------------------ end to end
def _weights(est) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in est.module_.parameters()]).numpy()


@pytest.mark.parametrize(("change", "match"), [
    (lambda p: p["targets"]["classes_"]["values"].append(2), "3 classes"),
    (lambda p: p["module"].update({k: torch.zeros(3, *v.shape[1:]) for k, v in p["module"].items()}), "module tensor"),
])
def test_a_crafted_checkpoint_is_refused_before_training_and_keeps_the_fitted_state(tmp_path, client, change, match):
    """Through ``checkpoint=`` (a resumed fit) and ``load_params``: a 3-class ``classes_`` for a
    2-output model used to "fit"."""
    X, y = make_classification(n_samples=128, n_features=6, n_informative=4, n_classes=2, random_state=0)
    X = X.astype(np.float32)
    path = tmp_path / "fit.ckpt"
    est = DaskClassifier(max_epochs=1, batch_size=32, random_state=0, checkpoint=path).fit(X, y)
    weights, classes = _weights(est), est.classes_.copy()
    _tamper(path, change)
    with pytest.raises(checkpoint.CorruptCheckpointError, match=f"{re.escape(str(path))}.*{match}"):
        est.set_params(max_epochs=2).fit(X, y)
    with pytest.raises(checkpoint.CorruptCheckpointError, match=f"{re.escape(str(path))}.*{match}"):
        est.load_params(f_checkpoint=path)
    np.testing.assert_array_equal(_weights(est), weights)
    np.testing.assert_array_equal(est.classes_, classes)
    assert est.n_iter_ == 1


# ------------------------------------------------------------------------------ save_params / load_params
def _saved_parts(tmp_path) -> dict:
    paths = {k: tmp_path / f"part.{k}" for k in ("f_params", "f_optimizer", "f_history")}
    state = _state()
    state.history = [{"epoch": 1, "train_loss": 0.5, "updates": [{"batch_size": 8, "shares": [4, 4]}]}]
    checkpoint.save_parts(state, **paths)
    return paths


def test_save_params_writes_private_files(tmp_path):
    """They were written with the umask (0644 here): weights, optimizer state and history readable by
    every local user, where checkpoints are 0600."""
    old = os.umask(0o022)
    try:
        paths = _saved_parts(tmp_path)
    finally:
        os.umask(old)
    assert {k: oct(stat.S_IMODE(p.stat().st_mode)) for k, p in paths.items()} == dict.fromkeys(paths, "0o600")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())  # no temporary left
    state = _state()
    with torch.no_grad():
        state.module.weight.zero_()
    checkpoint.load_parts(state, N, **paths)
    assert _snapshot(state) != _snapshot(_state())  # the history differs; weights and optimizer state came back
    assert torch.equal(state.module.weight, _state().module.weight) and state.history[0]["updates"][0]["shares"] == [4, 4]


@pytest.mark.parametrize("part", ["f_params", "f_optimizer", "f_history"])
def test_a_fifo_as_a_saved_part_is_refused_at_once(tmp_path, part):
    """load_params(f_params=<a FIFO>) blocked forever in open()."""
    fifo = tmp_path / "planted"
    os.mkfifo(fifo, 0o600)
    _refused_at_once(fifo, lambda: checkpoint.load_parts(_state(), N, **{part: fifo}))


@pytest.mark.parametrize("part", ["f_params", "f_optimizer", "f_history"])
def test_a_saved_part_others_could_write_is_refused(tmp_path, part):
    """Another user's 0666 file was loaded silently."""
    paths = _saved_parts(tmp_path)
    os.chmod(paths[part], 0o666)
    state = _state()
    before = _snapshot(state)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="chmod go-w"):
        checkpoint.load_parts(state, N, **paths)
    assert _snapshot(state) == before


def _rewrite(path: Path, change) -> None:
    value = torch.load(path, weights_only=True)
    change(value)
    torch.save(value, path)
    os.chmod(path, 0o600)


PARTS = {
    "params-of-another-shape": ("f_params", lambda p: _rewrite(p, lambda v: v.update(weight=torch.zeros(5, 4)))),
    "params-expanded": ("f_params", lambda p: _rewrite(
        p, lambda v: v.update(weight=torch.zeros(1).expand(10**5, 10**5)))),
    "optimizer-momentum-of-another-shape": ("f_optimizer", lambda p: _rewrite(
        p, lambda v: v["state"][0].update(momentum_buffer=torch.zeros(4, 2)))),
    "optimizer-shared-references": ("f_optimizer", lambda p: _rewrite(
        p, lambda v: v["param_groups"][0].update(extra=_shared_twice(24)))),
    "history-not-records": ("f_history", lambda p: p.write_text("[1, 2, 3]")),
    "history-nested-deep": ("f_history", lambda p: p.write_text('[{"a": [[[[[1]]]]]}]')),
}


@pytest.mark.parametrize(("part", "change"), PARTS.values(), ids=PARTS.keys())
def test_a_crafted_saved_part_is_refused_and_changes_nothing(tmp_path, part, change):
    """Each part is checked as a checkpoint is, all before the state changes."""
    paths = _saved_parts(tmp_path)
    change(paths[part])
    state = _state()
    before = _snapshot(state)
    with pytest.raises(checkpoint.CorruptCheckpointError, match=re.escape(str(paths[part]))):
        checkpoint.load_parts(state, N, **paths)
    assert _snapshot(state) == before
