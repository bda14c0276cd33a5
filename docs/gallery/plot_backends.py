"""
The same fit on both backends
=============================

``backend="parameter-server"`` keeps the weights on the client; ``backend="allreduce"`` keeps a
replica of the module and the optimizer on every worker, which all-reduce their gradients among
themselves.  With the same ``random_state`` both follow the same trajectory (up to the order of
float summation), with the same damper; what differs is what the client's connections carry per
update (``history_`` records it).
"""

import matplotlib.pyplot as plt
from sklearn.datasets import load_digits

from adadamp import DaskClassifier, plot
from adadamp.dampers import GeoDamp

X, y = load_digits(return_X_y=True)
X = (X / 16).astype("float32")

common = {"batch_size": GeoDamp(initial=32, delay=2, factor=2), "optimizer__lr": 3e-3, "max_epochs": 4,
          "random_state": 0}
fits = {backend: DaskClassifier(backend=backend, **common).fit(X, y) for backend in ("parameter-server", "allreduce")}

fig, ax = plt.subplots(figsize=(6, 3.5))
for backend, est in fits.items():
    plot.plot_loss(est, x="update", ax=ax, label=backend, linestyle="-" if backend == "allreduce" else ":")
ax.set_yscale("log")
ax.legend()
fig.tight_layout()

# %%
# The final losses, and the bytes the client sent and received in a median update (with the
# parameter server on one machine the weights and gradients go through shared memory; across
# machines they would go through the client's sockets):
for backend, est in fits.items():
    updates = sorted((u for row in est.history_ for u in row["updates"]), key=lambda u: u["update_time"])
    mid = updates[len(updates) // 2]
    print(f"{backend:>16}: loss {est.history_[-1]['train_loss']:.5f}, "
          f"sent {mid['sent_bytes']:,} B, received {mid['received_bytes']:,} B per update")
