"""Ctrl-C and SIGTERM during ``fit`` stop it at the end of the update running: the estimator keeps
the weights trained so far, the checkpoint holds them, the workers are given back, and the script
exits with a nonzero status -- whatever handler dask-jobqueue installed (docs/guide/checkpoints.rst)."""

import json
import signal
import subprocess
import sys
import textwrap

import pytest

# A user's script: dask-jobqueue imported (its runner installs ``signal(SIGINT, sys.exit)``), a fit
# on a cluster of two workers; its callback stands for the user or the batch scheduler, sending the
# signal to the process once update AT has ended.  Prints what the estimator and the cluster hold.
SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    import dask_jobqueue  # noqa: F401
    from distributed import Client, LocalCluster
    from adadamp import DaskRegressor, checkpoint
    from adadamp.callbacks import Callback

    SIGNUM, AT, PATH = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


    class Signal(Callback):
        def on_update_end(self, estimator, loop=None, **info):
            if loop.n_updates == AT:
                os.kill(os.getpid(), SIGNUM)


    def allocated(dask_scheduler):
        return list(dask_scheduler.plugins["adadamp-allocator"].fits)


    if __name__ == "__main__":
        jobqueue_handler = signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, signal.SIG_DFL)
        X = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
        y = X.sum(axis=1)
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as c:
            est = DaskRegressor(batch_size=16, max_epochs=12, random_state=0, checkpoint=PATH, checkpoint_every=5,
                                callbacks=[("signal", Signal())])
            try:
                est.fit(X, y)
                weights = b"".join(v.numpy().tobytes() for v in est.module_.state_dict().values())
                print(json.dumps({"weights": weights.hex(), "n_updates": est.loop_.n_updates}), flush=True)
            except KeyboardInterrupt as err:
                saved = checkpoint.load(PATH)
                print(json.dumps({
                    "error": type(err).__name__, "message": str(err), "jobqueue_handler": jobqueue_handler,
                    "n_updates": est.loop_.n_updates, "saved_updates": saved["loop"]["n_updates"],
                    "same_weights": all((saved["module"][k] == v).all().item()
                                        for k, v in est.module_.state_dict().items()),
                    "handler_back": signal.getsignal(signal.SIGINT) is not None
                                    and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                    "allocated": c.run_on_scheduler(allocated), "predicts": bool(np.isfinite(est.predict(X)).all()),
                }), flush=True)
                raise
    """
)


def test_ctrl_c_stops_the_fit_at_the_updates_end_keeping_what_it_trained(tmp_path):
    """Before: SIGINT raised SystemExit from dask-jobqueue's handler (status 0, no traceback, nothing
    kept).  (SIGTERM, which killed the process mid-update: the tests below.)"""
    signum = signal.SIGINT
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(int(signum)), "7", str(tmp_path / "fit.ckpt")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert out.returncode != 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-3000:]
    seen = json.loads(lines[-1])
    assert seen["jobqueue_handler"]  # dask-jobqueue's SIGINT handler was there before the fit
    assert seen["error"] == "FitInterrupted" and signal.Signals(signum).name in seen["message"]
    # sent once update 7's callbacks ran: update 8 is the one running when it arrives, and the last
    assert seen["n_updates"] == seen["saved_updates"] == 8 and seen["same_weights"] and seen["predicts"]
    assert seen["handler_back"] and seen["allocated"] == []
    assert "FitInterrupted" in out.stderr  # the traceback a script's user reads


def _run(tmp_path, signum: int, at: int, path) -> dict:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(signum), str(at), str(path)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """The fit never stopped."""
    folder = tmp_path_factory.mktemp("whole")
    return _run(folder, int(signal.SIGTERM), -1, folder / "whole.ckpt")


@pytest.mark.parametrize("at", [123, 15], ids=["mid-epoch", "an-epochs-last-update"])
def test_a_fit_stopped_by_sigterm_resumes_to_the_uninterrupted_weights(tmp_path, whole, at):
    """A job's end (SIGTERM), then the job again: the same weights as a fit never stopped.  Stopped
    in an epoch's last update (16 updates an epoch), the epoch's row is written with the checkpoint:
    without it the resumed fit trained that epoch again (found on SLURM: 288 updates for 256)."""
    stopped = _run(tmp_path, int(signal.SIGTERM), at, tmp_path / "stopped.ckpt")
    assert stopped["error"] == "FitInterrupted" and "SIGTERM" in stopped["message"]
    assert stopped["n_updates"] == stopped["saved_updates"] == at + 1 and stopped["same_weights"]
    assert stopped["handler_back"] and stopped["allocated"] == []
    resumed = _run(tmp_path, int(signal.SIGTERM), -1, tmp_path / "stopped.ckpt")
    assert resumed["n_updates"] == whole["n_updates"] == 12 * 16
    assert resumed["weights"] == whole["weights"]
