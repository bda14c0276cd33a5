"""The original adadamp's "Basic Usage" (PadaDamp on MNIST, SGD), ported to adadamp's estimators.

Scikit-learn's digits (8x8 images, shipped with scikit-learn) stand in for MNIST, and the
convnet is the original's, sized for 8x8 images.  The damper is a schedule given to the
estimator, not an optimizer wrapping the model; the estimator trains on the Dask cluster of
the current client (or starts a LocalCluster for the fit).
"""

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn, optim
from torch.utils.data import TensorDataset

from adadamp import DaskClassifier
from adadamp.dampers import PadaDamp


class Net(nn.Module):
    """The original's MNIST convnet for 8x8 images; returns log-probabilities (for NLLLoss)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.fc1 = nn.Linear(16 * 3 * 3, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 8x8 -> 6x6 -> 3x3
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def digits_datasets():
    """Map-style datasets of (image, label) pairs, as torchvision's MNIST is."""
    X, y = load_digits(return_X_y=True)
    images = torch.tensor(X / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    labels = torch.tensor(y)
    return TensorDataset(images[:1400], labels[:1400]), TensorDataset(images[1400:], labels[1400:])


def main(epochs: int = 5) -> float:
    train_set, test_set = digits_datasets()
    # adadamp 0.x:
    #   optimizer = PadaDamp(model=model, dataset=train_set, opt=optim.SGD(model.parameters(), lr=0.05),
    #                        loss=F.nll_loss, batch_growth_rate=0.01, initial_batch_size=32, max_batch_size=1024)
    #   for epoch in range(epochs): train(model=model, opt=optimizer); test(model=model, loss=loss, dataset=test_set)
    est = DaskClassifier(
        module=Net,
        criterion=nn.NLLLoss,
        optimizer=optim.SGD,
        optimizer__lr=0.05,
        optimizer__momentum=0.9,
        batch_size=PadaDamp,
        batch_size__initial=32,
        batch_size__rate=0.01,
        batch_size__max_batch_size=1024,
        max_epochs=epochs,
        random_state=0,
    )
    est.fit(train_set)
    for row in est.history_:
        print(f"epoch {row['epoch']}: train loss {row['train_loss']:.3f}, batch size {row['batch_size']}")
    accuracy = est.score(test_set)
    print(f"test accuracy {accuracy:.3f} after {est.meta_['n_updates']} model updates")
    return accuracy


if __name__ == "__main__":
    main()
