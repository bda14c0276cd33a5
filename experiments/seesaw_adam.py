"""Experiment 6: growing the batch under Adam (Seesaw, Meterez et al. 2025, Alg. 1).

Adam with a step decay of its learning rate vs Adam with the Seesaw schedule that replaces it,
at equal epochs, on two tasks:

- ``digits``: scikit-learn's digits (1,797 8x8 images), MLP 64-128-10;
- ``synthetic``: a harder 10-class problem from ``make_classification`` (24,000 examples, 40
  features of which 20 informative, class_sep 0.7, 5% flipped labels), MLP 40-128-128-10.

Schedules (``factor`` f every ``delay`` epochs):

- ``adam-decay``: constant batch, learning rate / f (GeoDampLR);
- ``seesaw``: batch x f, learning rate / sqrt(f) (Seesaw);
- ``geodamp``: batch x f, learning rate fixed (the SGD rule, which under-decays Adam).

Test accuracy after every epoch (mean over seeds) and the model updates.  Writes
``seesaw_adam.md`` and ``seesaw_adam.json`` beside this file.
Run: ``python experiments/seesaw_adam.py`` (about 6 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from adadamp import Callback, DaskClassifier
from adadamp.dampers import GeoDamp, GeoDampLR, Seesaw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import digits_split, timed_run, write_results

HERE = Path(__file__).resolve().parent

TASKS = {
    # name: (initial batch, Adam lr, hidden layers)
    "digits": (16, 3e-3, (128,)),
    "synthetic": (32, 3e-3, (128, 128)),
}


def synthetic_split():
    X, y = make_classification(
        n_samples=24000, n_features=40, n_informative=20, n_redundant=10, n_classes=10,
        n_clusters_per_class=2, class_sep=0.7, flip_y=0.05, random_state=0,
    )
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_test), y_train, y_test


def schedules(initial: int, delay: int, factor: float) -> dict:
    return {
        "adam-decay": GeoDampLR(initial=initial, delay=delay, factor=factor),
        "seesaw": Seesaw(initial=initial, delay=delay, factor=factor),
        "geodamp": GeoDamp(initial=initial, delay=delay, factor=factor),
    }


class TestAccuracy(Callback):
    """Test accuracy of the module being trained, after every epoch."""

    def __init__(self, X=None, y=None, classes=None):
        self.X = X
        self.y = y
        self.classes = classes

    def on_train_begin(self, estimator, **info) -> None:
        self.accuracy_ = []

    def on_epoch_end(self, estimator, module=None, **info) -> None:
        module.eval()
        with torch.no_grad():
            pred = module(torch.as_tensor(self.X, dtype=torch.float32)).argmax(1).numpy()
        module.train()
        self.accuracy_.append(float(np.mean(self.classes[pred] == self.y)))


def train(damper, lr: float, hidden, epochs: int, seed: int, client, data) -> dict:
    X_train, X_test, y_train, y_test = data
    est = DaskClassifier(
        module__hidden=hidden,
        optimizer=torch.optim.Adam,
        optimizer__lr=lr,
        batch_size=damper,
        max_epochs=epochs,
        random_state=seed,
        client=client,
        callbacks=[("acc", TestAccuracy(X_test, y_test, np.unique(y_train)))],
    )
    est.fit(X_train, y_train)
    return {
        "accuracy": dict(est.callbacks_)["acc"].accuracy_,
        "train_loss": [row["train_loss"] for row in est.history_],
        "updates": est.history_[-1]["n_updates"],
        "final_batch": est.history_[-1]["batch_size"],
        "final_lr": est.history_[-1]["lr"],
    }


def run(epochs: int, delay: int, factor: float, seeds: list[int], client, tasks=("digits", "synthetic")) -> dict:
    rows = []
    for task in tasks:
        data = digits_split() if task == "digits" else synthetic_split()
        initial, lr, hidden = TASKS[task]
        for name, damper in schedules(initial, delay, factor).items():
            runs = [train(damper, lr, hidden, epochs, s, client, data) for s in seeds]
            final = [r["accuracy"][-1] for r in runs]
            rows.append({
                "task": task,
                "schedule": name,
                "accuracy_mean": float(np.mean(final)),
                "accuracy_std": float(np.std(final)),
                "final_train_loss": float(np.mean([r["train_loss"][-1] for r in runs])),
                "updates": runs[0]["updates"],
                "final_batch": runs[0]["final_batch"],
                "final_lr": runs[0]["final_lr"],
                "accuracy_per_epoch": np.mean([r["accuracy"] for r in runs], axis=0).tolist(),
            })
    return {"epochs": epochs, "delay": delay, "factor": factor, "seeds": seeds, "rows": rows}


def write_report(result: dict) -> str:
    lines = [
        "# Experiment 6: Seesaw (batch growth for Adam) vs Adam's step decay",
        "",
        (f"{result['epochs']} epochs, factor {result['factor']} every {result['delay']} epochs, Adam, "
         f"seeds {result['seeds']}; accuracy = test accuracy after the last epoch, mean (std) over seeds."),
        "",
        "| task | schedule | test accuracy | final train loss | model updates | vs adam-decay | final batch | final lr |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r["task"]: r["updates"] for r in result["rows"] if r["schedule"] == "adam-decay"}
    for r in result["rows"]:
        lines.append(
            f"| {r['task']} | {r['schedule']} | {r['accuracy_mean']:.4f} ({r['accuracy_std']:.4f}) "
            f"| {r['final_train_loss']:.4f} | {r['updates']} | {base[r['task']] / r['updates']:.2f}x fewer "
            f"| {r['final_batch']} | {r['final_lr']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--delay", type=int, default=10)
    parser.add_argument("--factor", type=float, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    result = timed_run(lambda client: run(args.epochs, args.delay, args.factor, args.seeds, client), n_workers=2)
    print(write_results(HERE, "seesaw_adam", result, write_report(result)))


if __name__ == "__main__":
    main()
