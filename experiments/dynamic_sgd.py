"""Experiment 3: a sudden 12x batch change, early and late (Lin et al. 2019, Table 1, Figure 4).

Digits (scikit-learn), MLP 64-128-10, SGD momentum 0.9, batch 16 (lr 0.01) jumping to 192 at
epoch ``early`` or ``late``.  Methods after the jump:

- ``fixed``: no jump (batch 16 throughout, the reference);
- ``linear``: learning rate x12 at once (Goyal's rule in PyTorch's u-form: the momentum buffer
  built at batch 16 is amplified 12x, LIN eq. 5);
- ``dynamic``: DynamicSGD, the factor ramps 1 -> 12 over T = 8k = 96 updates (LIN eq. 6);
- ``velocity``: DynamicSGD's App. B.4 form (momentum buffers rescaled, no ramp).

Also a sudden 12x decrease (192 -> 16).  Reports the loss spike (the larger mean training loss of
the two epochs after the change over that of the epoch before; below 1 means no spike) and the
test accuracy at the end.  Writes ``dynamic_sgd.md`` beside this file.  Run: ``python experiments/dynamic_sgd.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from adadamp import DynamicSGD
from adadamp.dampers import BaseDamper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import digits_classifier, digits_split, local_client

HERE = Path(__file__).resolve().parent
LR = 0.01


class Jump(BaseDamper):
    """Batch ``before`` until epoch ``at``, then ``after`` (one sudden change)."""

    def __init__(self, before: int = 16, after: int = 192, at: float = 1):
        self.before, self.after, self.at = before, after, at

    def next_batch_size(self, state) -> int:
        return self.before if state.epoch < self.at - 1e-9 else self.after

    def forecast_batch_size(self, epoch: float) -> int:
        return self.before if epoch < self.at - 1e-9 else self.after


def methods(at: int) -> dict:
    up = Jump(16, 192, at)
    return {
        "fixed": 16,
        "linear": DynamicSGD(batch_size=up, base_batch_size=16, compensation_iters=1),
        "dynamic": DynamicSGD(batch_size=up, base_batch_size=16),
        "velocity": DynamicSGD(batch_size=up, base_batch_size=16, compensation="velocity"),
        "decrease": DynamicSGD(batch_size=Jump(192, 16, at), base_batch_size=16),
    }


def train(damper, epochs: int, seed: int, client, data, at: int) -> dict:
    X_train, X_test, y_train, y_test = data
    est = digits_classifier(damper, LR, seed, client, max_epochs=epochs).fit(X_train, y_train)
    losses = [row["train_loss"] for row in est.history_]  # epoch means: per-update losses at batch 16 are noise
    spike = max(losses[at : at + 2]) / losses[at - 1]  # the two epochs after the change vs the one before
    return {"accuracy": est.score(X_test, y_test), "spike": spike, "final_loss": est.history_[-1]["train_loss"]}


def run(epochs: int, points: dict, seeds: list[int], client) -> dict:
    data = digits_split()
    rows = []
    for when, at in points.items():
        for name, damper in methods(at).items():
            results = [train(damper, epochs, seed, client, data, at) for seed in seeds]
            rows.append(
                {
                    "when": f"{when} (epoch {at})",
                    "method": name,
                    "spike": float(np.mean([r["spike"] for r in results])),
                    "accuracy": float(np.mean([r["accuracy"] for r in results])),
                    "final_loss": float(np.mean([r["final_loss"] for r in results])),
                }
            )
    return {"epochs": epochs, "seeds": seeds, "rows": rows}


def write_report(result: dict) -> str:
    lines = [
        "# Experiment 3: sudden 12x batch change (digits)",
        "",
        (
            f"Batch 16 <-> 192, SGD lr {LR} (at batch 16) momentum 0.9, {result['epochs']} epochs, seeds "
            f"{result['seeds']} (means). Spike = max epoch loss of the 2 epochs after the change / the epoch before."
        ),
        "",
        "| change | method | loss spike | final train loss | test accuracy |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        spike = f"{r['spike']:.2f}x"
        lines.append(f"| {r['when']} | {r['method']} | {spike} | {r['final_loss']:.4f} | {r['accuracy']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--early", type=int, default=3)
    parser.add_argument("--late", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    with local_client() as client:
        result = run(args.epochs, {"early": args.early, "late": args.late}, args.seeds, client)
    report = write_report(result)
    print(report)
    (HERE / "dynamic_sgd.md").write_text(report)


if __name__ == "__main__":
    main()
