"""Is Goodput good?  Time to a target test accuracy on emulated devices (issue 32, item 5).

On three tasks, each run on its own LocalCluster of emulated accelerators
(:class:`benchmarks.common.emulated.Emulated`: every training forward on a worker sleeps ``FIXED`` plus
``PER_EXAMPLE`` per example, off the CPU), the parameter-server backend and SGD (momentum 0.9):

- **constant**: a small grid of constant batch sizes, each on the workers it wants at 32 examples
  per worker (32/1, 64/2, 128/4, 256/8), the learning rate scaled linearly with the batch
  (Goyal et al. 2017): the hand-tuned baseline is the best of these per task;
- **geodamp-defaults**: ``batch_size=GeoDamp`` with nothing set (initial 32, delay 5, factor 2;
  ``grads_per_worker`` the estimator's default 128);
- **geodamp-tuned**: GeoDamp growing the batch 32 -> 256 and the workers with it at 32 examples
  per worker, every 1 or every 2 epochs (the better of the two per task);
- **goodput**: ``batch_size=Goodput`` with nothing set;
- **goodput-pollux** (an ablation, not in the summary): ``Goodput(cooldown=0)``, the learning
  rate following AdaScale's gain alone as Pollux's does (no cool-down at the end of the fit);
- **goodput-anneal** (an ablation, not in the summary): ``Goodput(anneal=True)``, the learning
  rate also decayed as the noise scale grows (McCandlish et al.'s best step; the default until
  the cool-down measured better).

Every run may use 8 workers (``max_workers=8``) of the process's embedded cluster, kept warm
with 8 workers running between runs (as in a notebook after a first large fit): each run uses
the workers it wants, and takes idle ones as it grows (their set-up for the fit, the data placed on
them included, is part of its time; a worker's process start is not).  The test accuracy is measured on the client
``EVALS_PER_EPOCH`` times per epoch (16: the races to the target last one to two seconds, so a
quarter epoch moved a ratio by 15-25%, more than the 10% it is judged by); time to target is the wall-clock time of the fit until the first such point at the target,
less the evaluations.  Every run goes on to ``max_epochs`` (the same for all), where its final
accuracy is read: the accuracy at equal epochs.

Usage (each piece appends its runs to ``benchmarks/goodput/goodput.json``; ``--report`` writes
``benchmarks/goodput/goodput.md`` and ``goodput.png`` from it)::

    python -m benchmarks.goodput --tasks blobs4 --configs constant-32 goodput
    python -m benchmarks.goodput --report
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import make_classification

from adadamp import DaskClassifier
from adadamp.callbacks import Callback
from adadamp.dampers import GeoDamp, Goodput
from adadamp.modules import MLP

from ..common.accuracy_tasks import accuracy
from ..common.emulated import Emulated

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "goodput.json"
#: The emulated device: seconds per training forward and per example (a device ~20x slower than
#: emulated.py's defaults, so that on this 2-core machine the device, not the CPU, sets the time).
FIXED, PER_EXAMPLE = 2e-3, 0.2e-3
MAX_WORKERS = 8
EVALS_PER_EPOCH = 16


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    n_classes: int
    n_features: int
    n_informative: int
    flip_y: float
    hidden: tuple[int, ...]
    lr: float  #: SGD's learning rate at batch 32
    max_epochs: int
    about: str

    @functools.cached_property
    def data(self):
        X, y = make_classification(
            n_samples=20_000, n_features=self.n_features, n_informative=self.n_informative, n_redundant=0,
            n_classes=self.n_classes, n_clusters_per_class=2, class_sep=1.0, flip_y=self.flip_y, random_state=0,
        )
        X = X.astype(np.float32)
        return X[:16_000], y[:16_000], X[16_000:], y[16_000:]


TASKS = {t.name: t for t in (
    Task("blobs4", 4, 32, 16, 0.0, (128, 128), lr=0.05, max_epochs=5,
         about="4 classes x 2 Gaussian clusters, 32 features (16 informative); MLP 32-128-128-4"),
    Task("noisy10", 10, 64, 24, 0.1, (256,), lr=0.02, max_epochs=5,
         about="10 classes x 2 clusters, 64 features (24 informative), 10% of labels random; MLP 64-256-10"),
    Task("wide2", 2, 128, 64, 0.05, (64,), lr=0.02, max_epochs=5,
         about="2 classes x 2 clusters, 128 features (64 informative), 5% of labels random; MLP 128-64-2"),
)}

#: name -> (family, estimator parameters beyond the task's)
CONFIGS: dict[str, tuple[str, dict]] = {
    **{f"constant-{b}": ("constant", {"batch_size": b, "grads_per_worker": 32, "lr_scale": b / 32})
       for b in (32, 64, 128, 256)},
    "geodamp-defaults": ("geodamp-defaults", {"batch_size": GeoDamp}),
    **{f"geodamp-delay{d}": ("geodamp-tuned", {"batch_size": GeoDamp(initial=32, delay=d, factor=2, max_batch_size=256),
                                                "grads_per_worker": 32}) for d in (1, 2)},
    "goodput": ("goodput", {"batch_size": Goodput}),
    "goodput-pollux": ("goodput-pollux", {"batch_size": Goodput(cooldown=0.0)}),
    "goodput-anneal": ("goodput-anneal", {"batch_size": Goodput(anneal=True)}),
}


class Curve(Callback):
    """Test accuracy ``EVALS_PER_EPOCH`` times per epoch against the fit's time less evaluations."""

    def __init__(self, X=None, y=None, start=0.0):
        self.X, self.y, self.start = X, y, start

    def on_train_begin(self, estimator, **info):
        self.points_, self.spent_, self.next_ = [], 0.0, 0.0

    def on_update_end(self, estimator, record=None, module=None, loop=None, **info):
        if loop.epoch + 1e-9 >= self.next_:
            self._point(module, loop, record)
            self.next_ = (round(loop.epoch * EVALS_PER_EPOCH) + 1) / EVALS_PER_EPOCH

    def _point(self, module, loop, record):
        t = time.perf_counter()
        acc = accuracy(module, self.X, self.y)
        self.points_.append({"time": t - self.start - self.spent_, "epoch": round(float(loop.epoch), 4),
                             "updates": int(loop.n_updates), "accuracy": acc,
                             "batch_size": int(record["batch_size"]), "n_workers": int(record["n_workers"])})
        self.spent_ += time.perf_counter() - t


def run(task: Task, name: str) -> dict:
    from adadamp.cluster.embedded import embedded_client

    family, params = CONFIGS[name]
    params = dict(params)
    lr = task.lr * params.pop("lr_scale", 1.0)
    X, y, X_test, y_test = task.data
    with embedded_client(MAX_WORKERS):  # warm: MAX_WORKERS running, as in a notebook after a first large fit
        curve = Curve(X_test, y_test)
        est = DaskClassifier(
            module=Emulated, module__inner=MLP, module__fixed=FIXED, module__per_example=PER_EXAMPLE,
            module__n_features=task.n_features, module__n_outputs=task.n_classes, module__hidden=task.hidden,
            optimizer=torch.optim.SGD, optimizer__lr=lr, optimizer__momentum=0.9, max_epochs=task.max_epochs,
            max_workers=MAX_WORKERS, random_state=0, verbose=0,
            callbacks=[("curve", curve)], **params,
        )
        curve.start = time.perf_counter()
        est.fit(X, y)
        wall = time.perf_counter() - curve.start
    points = dict(est.callbacks_)["curve"].points_  # the clone that ran
    rows = [u for row in est.history_ for u in row["updates"]]
    return {
        "task": task.name, "config": name, "family": family, "lr": lr, "final_accuracy": points[-1]["accuracy"], "epochs": task.max_epochs, "wall": wall, "curve": points,
        "batch_sizes": sorted({u["batch_size"] for u in rows}), "workers": sorted({u["n_workers"] for u in rows}),
        "n_updates": len(rows), "changes": getattr(est.damper_, "n_changes_", None),
        "noise_scale": [u.get("noise_scale") for u in rows[:: max(1, len(rows) // 40)]],
    }


def target(runs: list[dict], task: str) -> float | None:
    """The task's target test accuracy, from the constant-batch runs alone: their best final
    accuracy less one point, rounded down to 0.005 (what the hand-tuned grid reaches).  Fixed
    before any other run was looked at; None until a constant run is in."""
    best = max((r["final_accuracy"] for r in runs if r["task"] == task and r["family"] == "constant"), default=None)
    return None if best is None else math.floor(round((best - 0.01) / 0.005, 6)) * 0.005


def high_target(runs: list[dict], task: str) -> float | None:
    """A second, higher target, added after the first run was seen: the best accuracy any
    constant-batch run measured at any point (rounded down to 0.005); None without one."""
    best = max((p["accuracy"] for r in runs if r["task"] == task and r["family"] == "constant" for p in r["curve"]),
               default=None)
    return None if best is None else math.floor(round(best / 0.005, 6)) * 0.005


def load(path: Path | None = None, rule=target) -> list[dict]:
    """The runs saved, each with its time to its task's target under ``rule`` (the first
    evaluation at the target)."""
    path = RESULTS if path is None else path
    runs = json.loads(path.read_text()) if path.exists() else []
    targets = {t: rule(runs, t) for t in {r["task"] for r in runs}}
    for r in runs:
        r["target"] = targets[r["task"]]
        hit = None if r["target"] is None else next((p for p in r["curve"] if p["accuracy"] >= r["target"]), None)
        r["time_to_target"] = None if hit is None else hit["time"]
        r["epoch_at_target"] = None if hit is None else hit["epoch"]
    return runs


def save(new: dict) -> None:
    runs = [r for r in load() if (r["task"], r["config"]) != (new["task"], new["config"])]
    for r in runs:
        for key in ("target", "time_to_target", "epoch_at_target"):
            r.pop(key)
    RESULTS.write_text(json.dumps([*runs, new], indent=1) + "\n")


def _fmt(t):
    return "not reached" if t is None else f"{t:.1f} s"


def _best_final(runs: list[dict], family: str) -> float:
    return max(r["final_accuracy"] for r in runs if r["family"] == family)


def summary(runs: list[dict]) -> list[str]:
    """One row per task: the best of each family's time to target, the ratios, the final accuracies."""
    out = [("| task | target | best constant (hand-tuned) | GeoDamp defaults | GeoDamp tuned | Goodput | "
            "Goodput / best constant | GeoDamp defaults / Goodput | Goodput's final accuracy; points vs best "
            "constant / vs best run |"), "|---" * 9 + "|"]
    for task in TASKS.values():
        mine = [r for r in runs if r["task"] == task.name]
        if not mine:
            continue

        def best(family, runs=mine):
            cands = [r for r in runs if r["family"] == family]
            reached = [r for r in cands if r["time_to_target"] is not None]
            return min(reached, key=lambda r: r["time_to_target"]) if reached else (cands[0] if cands else None)

        const, geo_d, geo_t, good = (best(f) for f in ("constant", "geodamp-defaults", "geodamp-tuned", "goodput"))

        def cell(r):
            return "-" if r is None else f"{_fmt(r['time_to_target'])} ({r['config']})"

        ratio = ahead = "-"
        if good and const and const["time_to_target"]:
            ratio = f"{good['time_to_target'] / const['time_to_target']:.2f}" if good["time_to_target"] else "not reached"
        if good and geo_d and good["time_to_target"]:
            ahead = (f"{geo_d['time_to_target'] / good['time_to_target']:.2f}" if geo_d["time_to_target"] else
                     f"> {geo_d['wall'] / good['time_to_target']:.1f} (not reached)")
        top = max(mine, key=lambda r: r["final_accuracy"])
        final = "-" if good is None or const is None else (
            f"{good['final_accuracy']:.4f}; {100 * (good['final_accuracy'] - _best_final(mine, 'constant')):+.1f} / "
            f"{100 * (good['final_accuracy'] - top['final_accuracy']):+.1f} ({top['config']})")
        goal = "-" if mine[0]["target"] is None else f"{mine[0]['target']:.3f}"
        out.append(f"| {task.name} | {goal} | {cell(const)} | {cell(geo_d)} | {cell(geo_t)} | "
                   f"{cell(good)} | {ratio} | {ahead} | {final} |")
    return out


def report() -> str:
    runs = load()
    repeat = HERE / "goodput-repeat.json"
    lines = ["# Goodput against hand-tuned batch sizes and GeoDamp (issue 32, item 5)", "",
             ("Generated by `python -m benchmarks.goodput --report` from `goodput.json` (and `goodput-repeat.json`, "
              "the same runs again); the method is in the module docstring. Emulated device: "
              f"{FIXED * 1e3:g} ms per training forward + {PER_EXAMPLE * 1e3:g} ms per example; parameter server, "
              f"SGD (momentum 0.9), at most {MAX_WORKERS} workers of a warm embedded cluster, a 2-core machine shared "
              "with other work."), "",
             ("## Time to the target (set from the constant runs before the others: their best final accuracy "
             "less one point)"), "", *summary(runs)]
    if repeat.exists():
        lines += ["", "The same runs again (`goodput-repeat.json`):", "", *summary(load(repeat))]
    lines += ["", ("## Time to a higher target (added after the first run: the best accuracy any constant run "
              "measured at any point)"), "", *summary(load(rule=high_target))]
    if repeat.exists():
        lines += ["", "The same runs again:", "", *summary(load(repeat, rule=high_target))]
    lines += ["", "## Every run (first run, first target)", "",
              "| task | run | time to target | epoch at target | final accuracy | batch sizes | workers | updates |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["task"], r["config"])):
        b = r["batch_sizes"]
        lines.append(f"| {r['task']} | {r['config']} | {_fmt(r['time_to_target'])} | {r['epoch_at_target'] or '-'} | "
                     f"{r['final_accuracy']:.4f} | {b[0]}-{b[-1]} | {r['workers'][0]}-{r['workers'][-1]} | {r['n_updates']} |")
    lines += ["", "Tasks:", ""] + [f"- {t.name}: {t.about}; 16k train / 4k test; lr {t.lr} at batch 32; "
                                   f"{t.max_epochs} epochs" for t in TASKS.values()]
    lines += ["", "![accuracy against wall-clock time (first run)](goodput.png)", ""]
    text = "\n".join(lines)
    (HERE / "goodput.md").write_text(text)
    plot(runs)
    return text


def plot(runs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    style = {"constant": ("tab:gray", ":"), "geodamp-defaults": ("tab:orange", "--"), "geodamp-tuned": ("tab:blue", "-."),
             "goodput": ("tab:red", "-"), "goodput-pollux": ("tab:pink", "-"), "goodput-anneal": ("tab:brown", "-")}
    for ax, name in zip(axes[0], tasks):
        for r in sorted((r for r in runs if r["task"] == name), key=lambda r: r["config"]):
            color, ls = style[r["family"]]
            pts = r["curve"]
            ax.plot([p["time"] for p in pts], [p["accuracy"] for p in pts], color=color, ls=ls, label=r["config"],
                    lw=2 if r["family"] == "goodput" else 1)
        goal = next(r["target"] for r in runs if r["task"] == name)
        if goal is not None:  # none without a constant run
            ax.axhline(goal, color="k", lw=0.5)
            ax.set_ylim(goal - 0.15, None)
        ax.set(title=name, xlabel="wall-clock seconds (evaluation excluded)", ylabel="test accuracy")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "goodput.png", dpi=100)


def main(argv=None) -> None:
    global RESULTS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="*", default=list(TASKS))
    p.add_argument("--configs", nargs="*", default=list(CONFIGS))
    p.add_argument("--report", action="store_true", help="only write goodput.md and goodput.png")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the runs are merged (a repeat: another file)")
    args = p.parse_args(argv)
    RESULTS = args.out
    if not args.report:
        for t in args.tasks:
            for c in args.configs:
                out = run(TASKS[t], c)
                save(out)
                print(json.dumps({k: v for k, v in out.items() if k not in ("curve", "noise_scale")}), flush=True)
                print("   ", [(p["epoch"], round(p["accuracy"], 4), round(p["time"], 1)) for p in out["curve"]], flush=True)
    print(report())
