"""
Loss against model updates: constant batch vs GeoDamp
=====================================================

A growing batch reaches the loss of a small constant batch in fewer model updates: each update
averages more examples, so it can take a step as large with less noise (Holt & Sievert 2021).
Both fits see the same examples in the same order, from the same initial weights.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import load_digits

from adadamp import DaskClassifier, plot
from adadamp.dampers import GeoDamp

X, y = load_digits(return_X_y=True)
X = (X / 16).astype("float32")

common = {"optimizer__lr": 3e-3, "max_epochs": 6, "random_state": 0}
constant = DaskClassifier(batch_size=32, **common).fit(X, y)
geodamp = DaskClassifier(batch_size=GeoDamp(initial=32, delay=2, factor=2), **common).fit(X, y)

fig, ax = plt.subplots(figsize=(6, 3.5))
plot.plot_loss(constant, x="update", ax=ax, label="constant batch 32")
plot.plot_loss(geodamp, x="update", ax=ax, label="GeoDamp 32 -> 128")
ax.set_yscale("log")
ax.legend()
fig.tight_layout()

# %%
# The final training losses and the model updates it took:
for name, est in (("constant", constant), ("GeoDamp", geodamp)):
    print(f"{name:>8}: loss {est.history_[-1]['train_loss']:.3f} after {est.history_[-1]['n_updates']} updates")
