"""The notebooks in notebooks/, executed with nbclient on a kernel that runs this interpreter.

Each run writes the executed notebook under the test's tmp_path (its working directory too, where
the notebook itself may leave nothing: run from the checkout, it would be an untracked file) and
prints one line to the terminal (also under ``pytest -q``, so CI's log shows it): the progress
bar's last frame, the number of plots and the last line printed.  04_slurm needs the
single-node SLURM of tests/system/slurm (the ``slurm`` fixture of conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the test extra: pip install -e .[test]")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the test extra: pip install -e .[test]")
pytest.importorskip("ipykernel", reason="notebook tests need the test extra: pip install -e .[test]")

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
NAMES = ["01_quickstart", "02_batch_size_schedules", "03_grid_search", "04_slurm", "05_image_folder"]


def test_notebooks_are_committed_without_outputs():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == NAMES
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3"
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, (
                    f"{name}.ipynb cell {i} has outputs: clear them "
                    f"(jupyter nbconvert --clear-output --inplace notebooks/{name}.ipynb)"
                )


@pytest.fixture(scope="session")
def kernel_specs(tmp_path_factory):
    """A kernel spec manager whose "python3" kernel runs ``sys.executable`` (this virtualenv's python)."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    kernels = tmp_path_factory.mktemp("kernels")
    write_kernel_spec(kernels / "python3")
    specs = KernelSpecManager(kernel_dirs=[str(kernels)])
    assert specs.get_kernel_spec("python3").argv[0] == sys.executable
    return specs


def execute(name: str, tmp_path: Path, kernel_specs, timeout: int = 240):
    """Run notebooks/<name>.ipynb in tmp_path; returns the executed notebook and the seconds it took."""
    from jupyter_client import KernelManager

    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # adadamp, installed or not
    env.pop("MPLBACKEND", None)  # the kernel's inline backend makes the image/png outputs
    km = KernelManager(kernel_name="python3", kernel_spec_manager=kernel_specs)
    client = nbclient.NotebookClient(
        nb, km=km, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(tmp_path)}}
    )
    t0 = time.monotonic()
    try:
        client.execute(env=env)
    finally:
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        if km.has_kernel:
            km.shutdown_kernel(now=False)
    return nb, time.monotonic() - t0


def left_behind(name: str, tmp_path: Path) -> list[str]:
    """What the notebook left in its working directory (the checkout's notebooks/ when a reader runs
    it there: untracked files) besides the executed copy :func:`execute` writes."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name != f"{name}.ipynb")


def outputs(nb) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def stream(nb, name: str) -> str:
    return "".join(out.text for out in outputs(nb) if out.output_type == "stream" and out.name == name)


def n_plots(nb) -> int:
    return sum("image/png" in out.get("data", {}) for out in outputs(nb))


def progress_frames(nb) -> list[str]:
    """The text progress bar's frames (tqdm writes them to stderr, separated by carriage returns)."""
    return [f.strip() for f in re.split(r"[\r\n]", stream(nb, "stderr")) if re.search(r"\d+%\|", f)]


def report(capsys, name: str, nb, seconds: float) -> None:
    frames = progress_frames(nb)
    printed = stream(nb, "stdout").strip().splitlines()
    with capsys.disabled():
        print(
            f"\nnotebook {name}: progress bar {frames[-1] if frames else None!r}; plots: {n_plots(nb)}; "
            f"last printed line: {printed[-1] if printed else None!r}; {seconds:.1f} s",
            flush=True,
        )


def test_quickstart(tmp_path, kernel_specs, capsys, new_processes):
    nb, seconds = execute("01_quickstart", tmp_path, kernel_specs)
    report(capsys, "01_quickstart", nb, seconds)
    assert left_behind("01_quickstart", tmp_path) == [], "the notebook wrote files into its working directory"
    frames = progress_frames(nb)
    assert frames, "no progress bar output"
    assert frames[-1].startswith("epoch 9:") and "1347/1347" in frames[-1], frames[-1]
    accuracy = re.search(r"DaskClassifier\s+test accuracy: ([\d.]+)", stream(nb, "stdout"))
    assert accuracy and float(accuracy.group(1)) > 0.85, stream(nb, "stdout")
    assert new_processes() == [], "the notebook left processes running"


def test_batch_size_schedules(tmp_path, kernel_specs, capsys, new_processes):
    nb, seconds = execute("02_batch_size_schedules", tmp_path, kernel_specs)
    report(capsys, "02_batch_size_schedules", nb, seconds)
    assert left_behind("02_batch_size_schedules", tmp_path) == [], "the notebook wrote files into its working directory"
    assert n_plots(nb) >= 3
    updates = dict(re.findall(r"(\w+)\s+model updates:\s+(\d+)", stream(nb, "stdout")))
    assert int(updates["GeoDamp"]) < int(updates["Constant"]), updates
    assert new_processes() == [], "the notebook left processes running"


def test_grid_search(tmp_path, kernel_specs, capsys, new_processes):
    nb, seconds = execute("03_grid_search", tmp_path, kernel_specs)
    report(capsys, "03_grid_search", nb, seconds)
    assert left_behind("03_grid_search", tmp_path) == [], "the notebook wrote files into its working directory"
    tables = [out.data["text/html"] for out in outputs(nb) if 'class="dataframe"' in out.get("data", {}).get("text/html", "")]
    assert len(tables) == 1 and tables[0].count("<tr") == 5, tables  # the header and 4 schedules
    assert "mean_test_score" in tables[0] and "GeoDamp(delay=1, factor=4, initial=16)" in tables[0]
    assert "best schedule:" in stream(nb, "stdout")
    assert new_processes() == [], "the notebook left processes running"


def test_image_folder(tmp_path, kernel_specs, capsys, new_processes):
    nb, seconds = execute("05_image_folder", tmp_path, kernel_specs)
    report(capsys, "05_image_folder", nb, seconds)
    assert left_behind("05_image_folder", tmp_path) == [], "the notebook wrote files into its working directory"
    assert "PNG files under" in stream(nb, "stdout")
    accuracy = re.search(r"test accuracy: ([\d.]+)", stream(nb, "stdout"))
    assert accuracy and float(accuracy.group(1)) > 0.85, stream(nb, "stdout")
    assert new_processes() == [], "the notebook left processes running"


@pytest.mark.slurm
def test_slurm(slurm, tmp_path, kernel_specs, capsys, new_processes):
    nb, seconds = execute("04_slurm", tmp_path, kernel_specs)
    report(capsys, "04_slurm", nb, seconds)
    assert n_plots(nb) == 1
    workers = re.search(r"workers per epoch: \[([\d, ]+)\]", stream(nb, "stdout"))
    assert workers and max(map(int, workers.group(1).split(","))) > 1, "the cluster did not grow"
    deadline = time.monotonic() + 60
    squeue = ["squeue", "-h", "--name=adadamp-nb04", "-o", "%i %T"]
    while active := subprocess.run(squeue, check=True, capture_output=True, text=True, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, f"SLURM jobs left by the notebook: {active}"
        time.sleep(1)
    assert new_processes() == [], "the notebook left processes running"
