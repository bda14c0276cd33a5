"""Dampers: per-update batch size, learning-rate factor and momentum.

A damper is a small scikit-learn style object (``get_params``/``set_params``,
clonable, picklable) with no Dask and no I/O.  The engine talks to every damper
through the same calls per model update::

    damper_ = clone(user_damper).reset(n_data)          # fresh fit
    B = damper_.next_batch_size(state)                  # before the update
    plan = damper_.plan_update(state, b, stats)         # after the gradient
    damper_.forecast_batch_size(epoch)                  # cluster planning

1. ``next_batch_size(state)`` before the update: how many examples to use.
2. ``plan_update(state, batch_size, stats)`` after the workers returned their
   gradients: the learning-rate factor, the momentum and how far the update
   advances the epoch clock.

State that evolves during training lives in attributes ending in ``_`` and is
created by ``reset``; ``clone`` therefore gives a fresh damper, and ``pickle``
keeps the state (checkpoints).  Parameters are validated in ``reset`` (not in
``__init__``, scikit-learn rules) with a ``ValueError`` naming the parameter.

Catalogue
---------
Batch-size schedules (the "noise level" is expressed as a batch size, the
*damping* ``D``; a batch above ``max_batch_size`` is capped and the learning
rate scaled by ``max_batch_size / D`` instead, Holt & Sievert 2021):

* :class:`Constant` -- fixed batch size.
* :class:`GeoDamp` / :class:`GeoDampLR` -- geometric growth every ``delay``
  epochs (Smith et al. 2017; Holt & Sievert 2021), or the same schedule as a
  learning-rate decay.
* :class:`Seesaw` -- GeoDamp for Adam: batch x factor with the learning rate
  / sqrt(factor) where a step schedule would divide it by factor (Meterez et
  al. 2025).
* :class:`AdaDamp`, :class:`PadaDamp`, :class:`RadaDamp`, :class:`CntsDampLR`,
  :class:`GradientDescent` -- the original adadamp family (Sievert & Charles
  2019, "Improving the convergence of SGD through adaptive batch sizes").

Learning-rate rules for a changing batch size (they wrap a batch schedule):

* :class:`AdaScale` -- gain-ratio scaling (Johnson et al. 2020, Alg. 2);
  :class:`AdamScale` -- its square-root form for Adam (adaptdl).
* :class:`DynamicSGD` -- momentum compensation (Lin et al. 2019, §3.2 eq. 6)
  or the velocity form of Lin et al. 2019, App. B.4.

Batch size and workers from measurements:

* :class:`Goodput` -- the batch size and the workers that maximize throughput x
  statistical efficiency (Pollux, Qiao et al. OSDI'21), the efficiency from the
  gradient noise scale (McCandlish et al. 2018), the throughput from the fit's
  own update times (:class:`ThroughputModel`); the learning rate follows
  AdaScale's gain.

Every damper accepts ``momentum`` (None, a float, a callable
``momentum(n_workers, batch_size)`` or ``"tang"``, see :func:`tang_momentum`).
Callables given as parameters must be module-level functions if the damper is
to be pickled (checkpoints); lambdas clone but do not pickle.

:func:`simulate_schedule` and :func:`count_updates` run a damper through the
engine's epoch loop without any model (schedules, update counts).

The formulas, with the papers they come from, are in the Dampers guide
(docs/guide/dampers.rst); ``tests/dampers/test_dampers.py`` holds their numeric oracles.

Examples
--------
Give a damper class and route its parameters with ``batch_size__*``:

>>> from adadamp import DaskClassifier
>>> from adadamp.dampers import GeoDamp, count_updates
>>> est = DaskClassifier(batch_size=GeoDamp, batch_size__initial=128,
...                      batch_size__delay=60, batch_size__factor=5)

Holt & Sievert's schedule on CIFAR-10 (50,000 examples, 200 epochs) needs
29,240 model updates instead of 78,200 at a constant batch of 128:

>>> count_updates(GeoDamp(initial=128, delay=60, factor=5), n_data=50_000, max_epochs=200)
29240
"""

from .adaptive import AdaDamp, RadaDamp
from .adascale import AdamScale, AdaScale
from .base import BaseDamper, Constant, GradStats, TrainState, UpdatePlan
from .damping import GeoDamp, GeoDampLR, Seesaw
from .dynamic_sgd import DynamicSGD
from .goodput import Goodput, ThroughputModel
from .growth import CntsDampLR, GradientDescent, PadaDamp
from .momentum import tang_momentum
from .simulation import count_updates, simulate_schedule

__all__ = [
    "AdaDamp",
    "AdaScale",
    "AdamScale",
    "BaseDamper",
    "CntsDampLR",
    "Constant",
    "DynamicSGD",
    "GeoDamp",
    "GeoDampLR",
    "Goodput",
    "GradStats",
    "GradientDescent",
    "PadaDamp",
    "RadaDamp",
    "Seesaw",
    "ThroughputModel",
    "TrainState",
    "UpdatePlan",
    "count_updates",
    "simulate_schedule",
    "tang_momentum",
]
