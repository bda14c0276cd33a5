"""Logger callbacks: the training written where teams watch it (TensorBoard), with skorch's names.

Each is a :class:`~adadamp.callbacks.Callback`, routed like every callback
(``callbacks=[("tb", TensorBoard())], callbacks__tb__log_dir=...``), and needs its library only
when used (an optional extra; a missing one is named before any cluster work).
"""

from __future__ import annotations

from .callbacks import Callback

__all__ = ["TensorBoard"]


class TensorBoard(Callback):
    """Write the training to TensorBoard (skorch's name): scalars per update and per epoch, and the
    estimator's parameters with the final losses as hyperparameters.

    Needs the ``tensorboard`` package (``pip install "adadamp[tensorboard]"``); the writer is
    PyTorch's ``torch.utils.tensorboard.SummaryWriter``.  Per update (step = model updates):
    ``update/loss``, ``update/batch_size``, ``update/lr``, ``update/n_workers`` and the time
    breakdown (``update/compute_time``, ...); per epoch (step = epoch): every number of the
    epoch's row (``epoch/train_loss``, ``epoch/valid_loss``, ``epoch/dur``, ...).

    Parameters
    ----------
    log_dir : str or None, default=None
        The run's directory (None: ``runs/<date>_<host>``, as ``SummaryWriter``).
    every_update : bool, default=True
        Also write the per-update scalars (False: per epoch only).
    hparams : bool, default=True
        At the end, record the estimator's scalar parameters with the last ``train_loss`` (and
        ``valid_loss``) in TensorBoard's HParams tab.

    Attributes
    ----------
    writer_ : SummaryWriter
        The writer of the last fit (closed at its end).

    Examples
    --------
    >>> from adadamp import DaskClassifier
    >>> est = DaskClassifier(callbacks=[("tb", TensorBoard())], callbacks__tb__log_dir="runs/geodamp")
    """

    def __init__(self, log_dir: str | None = None, every_update: bool = True, hparams: bool = True):
        self.log_dir = log_dir
        self.every_update = every_update
        self.hparams = hparams

    def check_params(self) -> None:
        """The tensorboard package must be installed (checked before any cluster work)."""
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as err:
            raise ImportError(
                'The TensorBoard callback needs the tensorboard package: pip install "adadamp[tensorboard]".'
            ) from err

    def on_train_begin(self, estimator, **info) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer_ = SummaryWriter(log_dir=self.log_dir)

    def on_update_end(self, estimator, record=None, loop=None, **info) -> None:
        if self.every_update:
            for key, value in record.items():
                self.writer_.add_scalar(f"update/{key}", value, global_step=loop.n_updates)

    def on_epoch_end(self, estimator, row=None, **info) -> None:
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "epoch":
                self.writer_.add_scalar(f"epoch/{key}", value, global_step=row["epoch"])
        self.writer_.flush()

    def on_train_end(self, estimator, history=None, **info) -> None:
        if self.hparams and history:
            params = {
                k: v for k, v in estimator.get_params(deep=False).items()
                if isinstance(v, int | float | str | bool) and not k.startswith("callbacks")
            }
            metrics = {f"hparam/{k}": history[-1][k] for k in ("train_loss", "valid_loss") if k in history[-1]}
            self.writer_.add_hparams(params, metrics, run_name=".")
        self.writer_.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("writer_", None)  # an open file: not part of a pickled estimator
        return state
