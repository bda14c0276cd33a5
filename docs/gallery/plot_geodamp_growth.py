"""
Batch size and workers over a GeoDamp fit
=========================================

:class:`~adadamp.dampers.GeoDamp` multiplies the batch size by ``factor`` every ``delay``
epochs.  With no client, the estimator trains on the embedded LocalCluster and grows it with the batch:
``ceil(batch / grads_per_worker)`` workers, up to one per core.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import load_digits

from adadamp import DaskClassifier, plot
from adadamp.dampers import GeoDamp

X, y = load_digits(return_X_y=True)
X = (X / 16).astype("float32")

est = DaskClassifier(
    batch_size=GeoDamp(initial=32, delay=1, factor=2),
    grads_per_worker=64,
    max_epochs=4,
    random_state=0,
)
est.fit(X, y)

fig, axes = plt.subplots(2, 1, sharex=True, figsize=(6, 4.5))
plot.plot_batch_size(est, x="update", ax=axes[0])
plot.plot_n_workers(est, x="update", ax=axes[1])
axes[0].set_title("GeoDamp(initial=32, delay=1, factor=2)")
fig.tight_layout()

# %%
# Each epoch's last batch is what is left of the epoch, so the batch size dips before it
# doubles.  The number of model updates per epoch halves each time the batch doubles:
print([row["n_updates"] for row in est.history_])
