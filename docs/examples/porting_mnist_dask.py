"""The original adadamp's MNIST-with-Dask example (its ``test_mnist_dask.py``), ported.

``DaskBaseDamper(module=..., loss=nn.NLLLoss, ...)`` becomes ``DaskClassifier(module=...,
criterion=nn.NLLLoss, ...)``; the model is the original's (PyTorch's MNIST example) with its
first linear layer sized for scikit-learn's 8x8 digits, which stand in for MNIST.
"""

import torch
import torch.nn.functional as F
from distributed import Client, LocalCluster
from porting_basic_usage import digits_datasets  # beside this file
from torch import nn, optim

from adadamp import DaskClassifier


class Model(nn.Module):
    """PyTorch's MNIST example, as in the original test; fc1 takes 64 * 2 * 2 features for 8x8 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64 * 2 * 2, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def main(epochs: int = 2) -> float:
    dataset, test_set = digits_datasets()
    # adadamp 0.x:
    #   net = DaskBaseDamper(module=Model, loss=nn.NLLLoss, optimizer=optim.Adadelta, optimizer__lr=1.0, batch_size=64)
    net = DaskClassifier(
        module=Model,
        criterion=nn.NLLLoss,
        optimizer=optim.Adadelta,
        optimizer__lr=1.0,
        batch_size=64,
        max_epochs=epochs,
        random_state=0,
    )
    net.fit(dataset)
    accuracy = net.score(test_set)
    print(f"test accuracy {accuracy:.3f}, {net.meta_['n_updates']} model updates on {net.meta_['n_workers']} workers")
    return accuracy


if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster):
        main()
