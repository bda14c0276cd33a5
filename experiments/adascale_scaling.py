"""Experiment 2: AdaScale vs linear scaling with warm-up as the batch grows S-fold
(Johnson et al. 2020, Table 2 and Alg. 2).

Digits (scikit-learn), MLP 64-128-10, SGD momentum 0.9, base batch b0 = 16 with a scale-1
schedule (learning rate x0.1 after 60% of the scale-invariant iterations).  For each scale
S = 1, 2, 4, 8, 16, 32 (batch S * b0):

- ``adascale``: ``AdaScale(batch_size=S*b0, base_batch_size=b0, lr_schedule=...)``; training
  stops after as many scale-invariant epochs as the S = 1 run (the gain ratio decides the steps);
- ``linear``: learning rate S times the scale-1 schedule (compressed to T/S steps) with a linear
  warm-up over the first 5% of steps: a small custom damper written against the public
  ``BaseDamper`` protocol, which is how users add their own rules.

Writes ``adascale_scaling.md`` beside this file.  Run: ``python experiments/adascale_scaling.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from adadamp import AdaScale
from adadamp.dampers import BaseDamper, UpdatePlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import digits_classifier, digits_split, local_client

HERE = Path(__file__).resolve().parent
B0 = 16
LR = 0.02


class StepSchedule:
    """Scale-1 learning-rate factor: 1, then 0.1 after ``fraction`` of ``total`` iterations."""

    def __init__(self, total: float, fraction: float = 0.6):
        self.total, self.fraction = total, fraction

    def __call__(self, t: float) -> float:
        return 1.0 if t < self.fraction * self.total else 0.1


class LinearScalingWarmup(BaseDamper):
    """Batch S*b0, learning rate S*lr(t*S) with a linear warm-up over the first 5% of steps."""

    def __init__(self, scale: int = 1, base_batch_size: int = B0, schedule=None, total_steps: int = 1):
        self.scale = scale
        self.base_batch_size = base_batch_size
        self.schedule = schedule
        self.total_steps = total_steps

    def next_batch_size(self, state):
        return self.scale * self.base_batch_size

    def plan_update(self, state, batch_size, stats):
        warm = max(1, int(0.05 * self.total_steps))
        ramp = min(1.0, (state.n_updates + 1) / warm)
        factor = (1 + (self.scale - 1) * ramp) * self.schedule(state.n_updates * self.scale)
        return UpdatePlan(lr_factor=factor)


def train(damper, epochs: int, seed: int, client, data) -> dict:
    X_train, X_test, y_train, y_test = data
    est = digits_classifier(damper, LR, seed, client, max_epochs=epochs)
    try:
        est.fit(X_train, y_train)
        accuracy = est.score(X_test, y_test)
        loss = est.history_[-1]["train_loss"]
    except ArithmeticError:  # ConvergenceError: the run diverged
        accuracy, loss = float("nan"), float("inf")
    updates = est.loop_.n_updates
    gains = [getattr(est.damper_, "gain_", np.nan)]
    return {"accuracy": accuracy, "train_loss": loss, "updates": updates, "last_gain": gains[-1]}


def run(scales: list[int], epochs: int, seeds: list[int], client) -> dict:
    data = digits_split()
    n_train = len(data[0])
    total = epochs * n_train / B0  # scale-1 iterations T_SI
    schedule = StepSchedule(total)
    rows = []
    for S in scales:
        for method in ("adascale", "linear"):
            if method == "adascale":
                damper = AdaScale(batch_size=S * B0, base_batch_size=B0, lr_schedule=schedule)
            else:
                steps = int(np.ceil(total / S))
                damper = LinearScalingWarmup(scale=S, schedule=schedule, total_steps=steps)
            results = [train(damper, epochs, seed, client, data) for seed in seeds]
            rows.append(
                {
                    "S": S,
                    "method": method,
                    "accuracy": float(np.mean([r["accuracy"] for r in results])),
                    "train_loss": float(np.mean([r["train_loss"] for r in results])),
                    "updates": int(np.mean([r["updates"] for r in results])),
                    "ideal_updates": int(np.ceil(total / S)),
                    "last_gain": float(np.mean([r["last_gain"] for r in results])),
                }
            )
    return {"epochs": epochs, "seeds": seeds, "T_SI": total, "rows": rows}


def write_report(result: dict) -> str:
    lines = [
        "# Experiment 2: AdaScale vs linear scaling with warm-up (digits)",
        "",
        (
            f"b0 = {B0}, lr {LR} x (1, then 0.1 after 60% of T_SI = {result['T_SI']:.0f} scale-1 iterations), "
            f"SGD momentum 0.9, {result['epochs']} (scale-invariant) epochs, seeds {result['seeds']} (means)."
        ),
        "",
        "| S | batch | method | test accuracy | final train loss | model updates | T_SI / S | last gain r |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        gain = f"{r['last_gain']:.2f}" if np.isfinite(r["last_gain"]) else "-"
        lines.append(
            f"| {r['S']} | {r['S'] * B0} | {r['method']} | {r['accuracy']:.4f} | {r['train_loss']:.4f} "
            f"| {r['updates']} | {r['ideal_updates']} | {gain} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    with local_client() as client:
        result = run(args.scales, args.epochs, args.seeds, client)
    report = write_report(result)
    print(report)
    (HERE / "adascale_scaling.md").write_text(report)


if __name__ == "__main__":
    main()
