"""
AdaScale's gain over training
=============================

:class:`~adadamp.dampers.AdaScale` (Johnson et al. 2020) trains with a batch ``S`` times the base
batch and scales the learning rate by the gain ratio ``r_t`` in ``[1, S]``: about ``S`` while the
gradient noise dominates (a big batch is worth ``S`` small steps), falling towards 1 as the
gradient's signal dominates.  A callback records the gain the damper computed at every update.
"""

import matplotlib.pyplot as plt
import torch
from sklearn.datasets import load_digits

from adadamp import DaskClassifier
from adadamp.callbacks import Callback
from adadamp.dampers import AdaScale


class RecordGain(Callback):
    """Keeps the damper's gain ratio after every model update."""

    def on_train_begin(self, estimator, **info):
        self.gains_ = []

    def on_update_end(self, estimator, damper=None, **info):
        self.gains_.append(damper.gain_)


X, y = load_digits(return_X_y=True)
X = (X / 16).astype("float32")

est = DaskClassifier(
    optimizer=torch.optim.SGD,
    optimizer__lr=0.05,
    batch_size=AdaScale(batch_size=256, base_batch_size=32),
    max_epochs=6,
    random_state=0,
    callbacks=[("gain", RecordGain())],
)
est.fit(X, y)
gains = dict(est.callbacks_)["gain"].gains_

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(range(1, len(gains) + 1), gains)
ax.axhline(256 / 32, color="grey", linestyle=":", label="S = 256 / 32")
ax.set_xlabel("model updates")
ax.set_ylabel("gain ratio r")
ax.set_ylim(0, 9)
ax.legend()
fig.tight_layout()
