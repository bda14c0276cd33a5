"""Experiment 1: grow the batch instead of decaying the learning rate (Holt & Sievert 2021,
Figures 2-4 and Table 1; Smith et al. 2018).

Scikit-learn's digits data (1,797 8x8 images, shipped with scikit-learn), an MLP, SGD with
momentum 0.9, the same number of epochs for every schedule:

- ``constant``: batch 16, learning rate divided by 5 at epochs 20 and 40 (GeoDampLR);
- ``geodamp``: batch multiplied by 5 at the same epochs (16 -> 80 -> 400), learning rate fixed;
- ``geodamp-2x``: initial batch 32 with twice the learning rate (the paper's "(*2)" row);
- ``geodamp-cap80``: batch capped at 80, after which the learning rate decays instead.

Each schedule trains with the public API only (``DaskClassifier.partial_fit``, one epoch per
call, on a LocalCluster of 2 worker processes) and is scored on a held-out quarter after every
epoch.  Writes ``batch_size_schedules.md`` and ``batch_size_schedules.png`` beside this file.

Run: ``python experiments/batch_size_schedules.py`` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from adadamp.dampers import GeoDamp, GeoDampLR

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import digits_classifier, digits_split, local_client

HERE = Path(__file__).resolve().parent
LR = 0.05


def schedules(delay: int, lr: float = LR) -> dict:
    """The compared schedules; ``delay`` epochs between changes, factor 5 (the paper's)."""
    return {
        "constant": (GeoDampLR(initial=16, delay=delay, factor=5), lr),
        "geodamp": (GeoDamp(initial=16, delay=delay, factor=5), lr),
        "geodamp-2x": (GeoDamp(initial=32, delay=delay, factor=5), 2 * lr),
        "geodamp-cap80": (GeoDamp(initial=16, delay=delay, factor=5, max_batch_size=80), lr),
    }


def train(damper, lr: float, epochs: int, seed: int, client, data) -> list[dict]:
    """One run; a row per epoch with the test accuracy and the model updates so far."""
    X_train, X_test, y_train, y_test = data
    est = digits_classifier(damper, lr, seed, client)
    rows = []
    for _ in range(epochs):
        est.partial_fit(X_train, y_train, classes=np.arange(10))
        last = est.history_[-1]
        rows.append(
            {
                "epoch": last["epoch"],
                "n_updates": last["n_updates"],
                "batch_size": last["batch_size"],
                "lr": last["lr"],
                "train_loss": last["train_loss"],
                "test_accuracy": est.score(X_test, y_test),
            }
        )
    return rows


def updates_to_reach(rows: list[dict], target: float) -> int | None:
    """Model updates at the first epoch whose test accuracy reaches ``target``."""
    for row in rows:
        if row["test_accuracy"] >= target - 1e-12:
            return row["n_updates"]
    return None


def run(epochs: int, delay: int, seeds: list[int], client, lr: float = LR) -> dict:
    data = digits_split()
    runs = {name: [train(d, lr, epochs, s, client, data) for s in seeds] for name, (d, lr) in schedules(delay, lr).items()}
    summary = {}
    for name, per_seed in runs.items():
        acc = np.mean([[r["test_accuracy"] for r in rows] for rows in per_seed], axis=0)
        updates = per_seed[0][-1]["n_updates"]
        summary[name] = {"final_accuracy": float(acc[-1]), "updates": int(updates), "accuracy": acc.tolist()}
    target = summary["constant"]["final_accuracy"]
    for name, per_seed in runs.items():
        mean_rows = [
            {**r, "test_accuracy": a}
            for r, a in zip(per_seed[0], summary[name]["accuracy"])
        ]
        summary[name]["updates_to_target"] = updates_to_reach(mean_rows, target)
        summary[name]["n_updates_per_epoch"] = [r["n_updates"] for r in per_seed[0]]
    return {"target": target, "epochs": epochs, "delay": delay, "lr": lr, "seeds": seeds, "schedules": summary}


def write_report(result: dict) -> str:
    base = result["schedules"]["constant"]["updates_to_target"]
    lines = [
        "# Experiment 1: batch-size schedules on digits",
        "",
        (
            f"{result['epochs']} epochs, SGD lr {result.get('lr', LR)} (momentum 0.9), changes every "
            f"{result['delay']} epochs by 5x, seeds {result['seeds']} (accuracies are seed means). Target = the "
            f"constant-batch run's final test accuracy, {result['target']:.4f}."
        ),
        "",
        ("| schedule | final test accuracy | model updates (all epochs) | vs constant | updates to reach target "
        "| vs constant |"),
        "|---|---:|---:|---:|---:|---:|",
    ]
    total = result["schedules"]["constant"]["updates"]
    for name, s in result["schedules"].items():
        reach = s["updates_to_target"]
        ratio = f"{base / reach:.2f}x fewer" if reach and base else "not reached"
        lines.append(
            f"| {name} | {s['final_accuracy']:.4f} | {s['updates']} | {total / s['updates']:.2f}x fewer "
            f"| {reach if reach else 'not reached'} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_update) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, s in result["schedules"].items():
        epochs = np.arange(1, len(s["accuracy"]) + 1)
        by_epoch.plot(epochs, s["accuracy"], label=name)
        by_update.plot(s["n_updates_per_epoch"], s["accuracy"], label=name)
    by_epoch.set(xlabel="epoch", ylabel="test accuracy", ylim=(0.8, 1.0))
    by_update.set(xlabel="model updates", xscale="log")
    by_epoch.legend()
    fig.suptitle("Growing the batch vs decaying the learning rate (digits, MLP)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--delay", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--lr", type=float, default=LR)
    args = parser.parse_args()
    with local_client() as client:
        result = run(args.epochs, args.delay, args.seeds, client, lr=args.lr)
    report = write_report(result)
    print(report)
    (HERE / "batch_size_schedules.md").write_text(report)
    (HERE / "batch_size_schedules.json").write_text(json.dumps(result, indent=1))
    plot(result, HERE / "batch_size_schedules.png")


if __name__ == "__main__":
    main()
