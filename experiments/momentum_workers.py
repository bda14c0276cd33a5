"""Experiment 4: momentum factor vs number of workers (Tang et al., Table 2 and Figure 5).

Tang et al. train ResNet-50 on CIFAR-10 on a parameter server with P = 1..32 GPUs and find that
the accuracy falls as P grows at a fixed total batch (Table 2), and that a larger momentum factor
(0.99 instead of 0.9) recovers it on many GPUs while hurting on one (Figure 5).  Their mechanism
(§3.1) is BatchNorm: every GPU normalizes over its own K = M / P examples.

Here: scikit-learn's digits, an MLP 64-128-10 with BatchNorm after the hidden layer, SGD, a
LocalCluster scaled to P = 1, 2, 4, 8, 16 real worker processes (the engine splits every batch
over all workers; each worker's BatchNorm sees only its share, as on Tang's GPUs).  Two ways of
adding workers, the same epochs for all:

- ``fixed``: total batch 128 (Tang's default, lr 0.05, Table 1), so each worker gets ~128 / P
  examples (Table 2 / Figure 5);
- ``weak``: 8 examples per worker, total batch 8 P, lr 0.05 * B / 128 (the linear rule of Tang's
  Table 1), the way adadamp grows the cluster with the batch (``grads_per_worker``).

Momentum 0.9, 0.95, 0.975, 0.99 and the ``"tang"`` preset (0.9 for P <= 4, 0.95 for 5..16 workers,
resolved from the live worker count), set through ``Constant(batch_size=B, momentum=m)``.  A
control run uses the plain MLP (no BatchNorm) at the fixed batch: there the worker count does
not change the arithmetic (gradients are sums, the client divides once), so P must not matter.

Reports the final test accuracy and test log-loss (seed means) per (momentum, P), writes
``momentum_workers.md``, ``.json`` and ``.png`` beside this file.
Run: ``python experiments/momentum_workers.py`` (12.6 minutes on the 2-core machine while other jobs ran).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import log_loss
from torch import nn

from adadamp import ConvergenceError
from adadamp.dampers import Constant, tang_momentum

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import digits_classifier, digits_split, scale_to, timed_run, write_results

HERE = Path(__file__).resolve().parent
LR = 0.05  # at batch 128 (Tang et al. Table 1)
BASE_BATCH = 128
MOMENTA = (0.9, 0.95, 0.975, 0.99, "tang")
WORKERS = (1, 2, 4, 8, 16)


class BatchNormMLP(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear.

    A worker whose share of a batch is a single example normalizes it with the running
    statistics (training-mode BatchNorm cannot normalize one example).  Shares follow data
    ownership (they vary around batch / P), so at ~8 examples per worker this happens now and
    then, mostly in an epoch's short last batch.
    """

    def __init__(self, n_features: int = 64, n_outputs: int = 10, hidden: Sequence[int] = (128,)):
        super().__init__()
        self.hidden = nn.Linear(n_features, hidden[0])
        self.norm = nn.BatchNorm1d(hidden[0])
        self.out = nn.Linear(hidden[0], n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hidden(x.flatten(1))
        bn = self.norm
        h = nn.functional.batch_norm(
            h, bn.running_mean, bn.running_var, bn.weight, bn.bias, self.training and len(h) > 1, bn.momentum, bn.eps
        )
        return self.out(torch.relu(h))


def train(batch: int, lr: float, momentum, seed: int, epochs: int, client, data, batchnorm: bool = True,
          workers: int = 1) -> dict:
    """One fit on ``workers`` workers (the batch is spread over all of them, however small)."""
    X_train, X_test, y_train, y_test = data
    module = {"module": BatchNormMLP, "module__n_features": 64, "module__n_outputs": 10} if batchnorm else {}
    est = digits_classifier(Constant(batch, momentum=momentum), lr, seed, client, max_epochs=epochs,
                            min_workers=workers, max_workers=workers, **module)
    start = time.perf_counter()
    try:
        est.fit(X_train, y_train)
    except ConvergenceError:
        return {"accuracy": float("nan"), "test_loss": float("nan"), "diverged": True, "seconds": 0.0}
    seconds = time.perf_counter() - start
    proba = est.predict_proba(X_test)
    return {
        "accuracy": float(est.score(X_test, y_test)),
        "test_loss": float(log_loss(y_test, proba, labels=np.arange(10))),
        "train_loss": float(est.history_[-1]["train_loss"]),
        "n_workers": int(est.history_[-1]["n_workers"]),
        "updates": int(est.history_[-1]["n_updates"]),
        "diverged": False,
        "seconds": seconds,
    }


def settings(p: int, total_batch: int, per_worker: int) -> dict:
    """Setting name -> (total batch, learning rate, BatchNorm?) at ``p`` workers."""
    weak = per_worker * p
    return {
        "fixed": (total_batch, LR * total_batch / BASE_BATCH, True),
        "weak": (weak, LR * weak / BASE_BATCH, True),
        "control": (total_batch, LR * total_batch / BASE_BATCH, False),
    }


def run(
    workers: Sequence[int] = WORKERS,
    momenta: Sequence = MOMENTA,
    epochs: int = 20,
    seeds: Sequence[int] = (0, 1, 2),
    client=None,
    total_batch: int = BASE_BATCH,
    per_worker: int = 8,
) -> dict:
    """Every (setting, momentum, P) cell, seed means; the control runs momentum 0.9 only."""
    data = digits_split()
    rows, done = [], {}
    for p in workers:
        scale_to(client, p)
        for setting, (batch, lr, batchnorm) in settings(p, total_batch, per_worker).items():
            for m in momenta if batchnorm else (0.9,):
                per_seed = []
                for seed in seeds:
                    key = (p, batch, lr, batchnorm, m, seed)  # weak at P = total_batch / per_worker is a fixed cell
                    if key not in done:
                        done[key] = train(batch, lr, m, seed, epochs, client, data, batchnorm, workers=p)
                    per_seed.append(done[key])
                ok = [r for r in per_seed if not r["diverged"]]
                rows.append(
                    {
                        "setting": setting,
                        "P": p,
                        "batch": batch,
                        "per_worker": batch / p,
                        "lr": lr,
                        "momentum": m,
                        "momentum_used": tang_momentum(p) if m == "tang" else m,
                        "accuracy": float(np.mean([r["accuracy"] for r in ok])) if ok else float("nan"),
                        "accuracy_std": float(np.std([r["accuracy"] for r in ok])) if ok else float("nan"),
                        "test_loss": float(np.mean([r["test_loss"] for r in ok])) if ok else float("nan"),
                        "train_loss": float(np.mean([r["train_loss"] for r in ok])) if ok else float("nan"),
                        "accuracies": [r["accuracy"] for r in per_seed],
                        "diverged": sum(r["diverged"] for r in per_seed),
                        "n_workers": [r.get("n_workers") for r in per_seed],
                        "updates": per_seed[0].get("updates"),
                        "seconds": float(sum(r["seconds"] for r in per_seed)),
                    }
                )
    return {"epochs": epochs, "seeds": list(seeds), "total_batch": total_batch, "per_worker": per_worker, "rows": rows}


def _cell(rows: list[dict], setting: str, m, p: int) -> dict | None:
    return next((r for r in rows if r["setting"] == setting and r["momentum"] == m and r["P"] == p), None)


def best_momentum(result: dict, setting: str, by: str = "accuracy") -> dict[int, float]:
    """P -> the numeric momentum with the highest mean accuracy (or lowest test loss); tang left out."""
    out = {}
    for p in sorted({r["P"] for r in result["rows"]}):
        cells = [r for r in result["rows"] if r["setting"] == setting and r["P"] == p and r["momentum"] != "tang"]
        cells = [r for r in cells if not np.isnan(r["accuracy"])]
        if cells:
            key = (lambda r: (r["accuracy"], -r["test_loss"])) if by == "accuracy" else (lambda r: -r["test_loss"])
            out[p] = max(cells, key=key)["momentum"]
    return out


def _rises(best: dict[int, float]) -> str:
    ps = sorted(best)
    return (
        "never falls" if all(best[q] >= best[p] for p, q in itertools.pairwise(ps)) else "does not rise monotonically"
    )


def write_report(result: dict) -> str:
    rows = result["rows"]
    ps = sorted({r["P"] for r in rows})
    momenta = list(dict.fromkeys(r["momentum"] for r in rows if r["setting"] == "fixed"))
    lines = [
        "# Experiment 4: momentum factor vs number of workers (digits, BatchNorm MLP)",
        "",
        (
            f"{result['epochs']} epochs, SGD, seeds {result['seeds']} (means; ± = std over seeds), real worker "
            f"processes P on a LocalCluster. Cells: test accuracy / test log-loss. `tang` = the preset, "
            f"{', '.join(f'P={p}: {tang_momentum(p)}' for p in ps)}."
        ),
    ]
    titles = {
        "fixed": f"Fixed total batch {result['total_batch']} (lr {LR}); per-worker share ~{result['total_batch']}/P",
        "weak": f"{result['per_worker']} examples per worker; batch {result['per_worker']}P, lr {LR} x batch / 128",
        "control": f"Control: plain MLP (no BatchNorm), fixed batch {result['total_batch']}, momentum 0.9",
    }
    for setting, title in titles.items():
        present = [m for m in momenta if _cell(rows, setting, m, ps[0])]
        if not present:
            continue
        lines += ["", f"## {title}", "", "| momentum | " + " | ".join(f"P = {p}" for p in ps) + " |"]
        lines.append("|---|" + "---:|" * len(ps))
        for m in present:
            cells = []
            for p in ps:
                r = _cell(rows, setting, m, p)
                if r is None or np.isnan(r["accuracy"]):
                    cells.append("diverged")
                    continue
                div = f" ({r['diverged']} diverged)" if r["diverged"] else ""
                cells.append(f"{r['accuracy']:.4f} ±{r['accuracy_std']:.3f} / {r['test_loss']:.3f}{div}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        if setting != "control":
            for by, name in (("accuracy", "best (accuracy)"), ("test_loss", "best (test loss)")):
                best = best_momentum(result, setting, by)
                lines.append(f"| {name} | " + " | ".join(str(best.get(p, "-")) for p in ps) + " |")
            lines.append(
                "| batch (updates) | "
                + " | ".join(
                    f"{_cell(rows, setting, momenta[0], p)['batch']} ({_cell(rows, setting, momenta[0], p)['updates']})"
                    for p in ps
                )
                + " |"
            )
    lines += ["", "## Tang's direction", ""]
    lo, hi = ps[0], ps[-1]
    for setting in ("fixed", "weak"):
        a = {(m, p): _cell(rows, setting, m, p) for m in (0.9, 0.99) for p in (lo, hi)}
        if any(v is None for v in a.values()):
            continue
        d_lo = a[(0.99, lo)]["accuracy"] - a[(0.9, lo)]["accuracy"]
        d_hi = a[(0.99, hi)]["accuracy"] - a[(0.9, hi)]["accuracy"]
        r_lo = a[(0.99, lo)]["test_loss"] / a[(0.9, lo)]["test_loss"]
        r_hi = a[(0.99, hi)]["test_loss"] / a[(0.9, hi)]["test_loss"]
        by_acc, by_loss = best_momentum(result, setting), best_momentum(result, setting, "test_loss")
        lines.append(
            f"- {setting}: accuracy(0.99) - accuracy(0.9) = {d_lo:+.4f} at P = {lo}, {d_hi:+.4f} at P = {hi} "
            f"(Tang Fig. 5: -0.026 at 1 GPU, +0.031 at 32 GPUs); test loss(0.99) / loss(0.9) = {r_lo:.2f}x at "
            f"P = {lo}, {r_hi:.2f}x at P = {hi}. Best momentum by accuracy: "
            f"{', '.join(f'P={p}: {m}' for p, m in by_acc.items())} ({_rises(by_acc)}); by test loss: "
            f"{', '.join(f'P={p}: {m}' for p, m in by_loss.items())} ({_rises(by_loss)})."
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    ps = sorted({r["P"] for r in rows})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True, sharey="row")
    for col, setting, title in (
        (0, "fixed", f"fixed total batch {result['total_batch']}"),
        (1, "weak", f"{result['per_worker']} examples per worker"),
    ):
        for m in dict.fromkeys(r["momentum"] for r in rows if r["setting"] == setting):
            cells = [_cell(rows, setting, m, p) for p in ps]
            style = {"linestyle": "--", "marker": "x", "color": "k"} if m == "tang" else {"marker": "o"}
            acc, std = [c["accuracy"] for c in cells], [c["accuracy_std"] for c in cells]
            axes[0, col].errorbar(ps, acc, yerr=std, capsize=3, label=f"momentum {m}", **style)
            axes[1, col].plot(ps, [c["test_loss"] for c in cells], label=f"momentum {m}", **style)
        control = [_cell(rows, "control", 0.9, p) for p in ps]
        if setting == "fixed" and all(control):
            for row, key in ((0, "accuracy"), (1, "test_loss")):
                axes[row, col].plot(ps, [c[key] for c in control], ":", color="grey", label="0.9, no BatchNorm")
        axes[0, col].set(title=title)
        axes[1, col].set(xscale="log", xticks=ps, xticklabels=[str(p) for p in ps], xlabel="workers P")
    axes[0, 0].set_ylabel("test accuracy")
    axes[1, 0].set(ylabel="test log-loss", yscale="log")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Momentum vs workers (digits, BatchNorm MLP, {result['epochs']} epochs, seed means)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKERS))
    args = parser.parse_args()
    result = timed_run(lambda client: run(args.workers, MOMENTA, args.epochs, args.seeds, client), args.workers[0])
    print(save(result, HERE))


def save(result: dict, out: Path) -> str:
    """Write ``momentum_workers.md``, ``.json`` and ``.png`` into ``out``; returns the report."""
    report = write_results(out, "momentum_workers", result, write_report(result))
    plot(result, out / "momentum_workers.png")
    return report


if __name__ == "__main__":
    main()
