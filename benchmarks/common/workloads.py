"""The benchmark workloads: deterministic synthetic data, the modules and the data order.

Every runner (plain PyTorch, DDP, skorch, adadamp) takes its data, initial weights and
batch order from here, so their final losses are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from adadamp.engine import LoopState

SEED = 0
N_CLASSES = 10


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # "mlp", "cnn" or "resnet18"
    n: int
    n_quick: int
    shape: tuple[int, ...]  # one example
    batch_size: int
    epochs: int
    lr: float = 0.01
    momentum: float = 0.9

    def n_data(self, quick: bool) -> int:
        return self.n_quick if quick else self.n

    def data(self, quick: bool) -> tuple[np.ndarray, np.ndarray]:
        return make_data(self.n_data(quick), self.shape)

    def module(self) -> nn.Module:
        """The initial model: the same weights in every process."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            return {"mlp": mlp, "cnn": cnn, "resnet18": resnet18}[self.model]()

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)


WORKLOADS = {
    w.name: w
    for w in (
        Workload("W1", "mlp", 60_000, 4_096, (784,), batch_size=512, epochs=2),
        Workload("W2", "mlp", 60_000, 2_048, (784,), batch_size=64, epochs=2),
        Workload("W3", "cnn", 20_000, 2_048, (1, 28, 28), batch_size=256, epochs=1),
        # a real-size model: ResNet-18's widths and depth on CIFAR-shaped inputs (11.2M parameters)
        Workload("W4", "resnet18", 1_024, 64, (3, 32, 32), batch_size=128, epochs=1),
    )
}


def make_data(n: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Noisy class templates: ``X = 0.1 * template[y] + N(0, 1)``, 10 % of labels random.

    Image templates are 7x7 noise blown up to 4x4 blocks (and 3x stronger), so that a CNN
    can see them through its pooling.
    """
    rng = np.random.default_rng(SEED)
    d = int(np.prod(shape))
    if len(shape) == 3:
        coarse = rng.standard_normal((N_CLASSES, shape[0], shape[1] // 4, shape[2] // 4), dtype=np.float32)
        templates = 3 * np.kron(coarse, np.ones((1, 1, 4, 4), np.float32)).reshape(N_CLASSES, d)
    else:
        templates = rng.standard_normal((N_CLASSES, d), dtype=np.float32)
    y = rng.integers(0, N_CLASSES, n)
    X = rng.standard_normal((n, d), dtype=np.float32)
    for c in range(N_CLASSES):
        X[y == c] += 0.1 * templates[c]
    flip = rng.random(n) < 0.1
    y[flip] = rng.integers(0, N_CLASSES, int(flip.sum()))
    return X.reshape(n, *shape), y.astype(np.int64)


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, N_CLASSES)
    )


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 24 -> 12
        nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),  # 12 -> 8 -> 4
        nn.Flatten(), nn.Linear(32 * 4 * 4, N_CLASSES),
    )  # fmt: skip


class _Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, and the shortcut (a 1x1 convolution
    where the width or the stride changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out),
        )
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet18() -> nn.Module:
    """ResNet-18 for 32x32 inputs (He et al. 2016, widths 64-128-256-512, two blocks each; the CIFAR
    stem: one 3x3 convolution, no pooling): 11.2M parameters.  Written here: torchvision's
    ``resnet18`` is the same network with an ImageNet stem, and installing torchvision would pull
    another torch."""
    layers, c_in = [], 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_Block(c_in, c_out, stride), _Block(c_out, c_out, 1)]
        c_in = c_out
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), *layers,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, N_CLASSES),
    )


def adadamp_seed(random_state: int = SEED) -> int:
    """The sampler seed adadamp derives from ``random_state`` (``fitting.FitMixin._fit``)."""
    return int(np.random.RandomState(random_state).randint(2**31 - 1))


def epoch_order(n: int, epoch: int) -> np.ndarray:
    """The example order of one epoch, exactly as adadamp's engine draws it."""
    return LoopState(seed=adadamp_seed(), n_data=n, data_epoch=epoch).permutation()


def batches(n: int, batch_size: int, epoch: int):
    """Index batches of one epoch (the last one may be short), as adadamp takes them."""
    order = epoch_order(n, epoch)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def n_updates(n: int, batch_size: int, epochs: int) -> int:
    return epochs * -(-n // batch_size)


@torch.no_grad()
def full_loss(module: nn.Module, X: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of ``module`` over all of ``X`` (how every peer's final loss is measured)."""
    module.eval()
    total = 0.0
    with torch.no_grad():  # no graph: a ResNet-18's activations for 1,024 images kept were gigabytes
        for start in range(0, len(X), 256):
            out = module(torch.from_numpy(X[start : start + 256]))
            total += float(nn.functional.cross_entropy(out, torch.from_numpy(y[start : start + 256]), reduction="sum"))
    module.train()
    return total / len(X)
