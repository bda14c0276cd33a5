"""Kill one worker at chosen updates of a long fit; print the difference to the undisturbed weights
and how soon the nanny's replacement registers and takes part.

    .venv/bin/python tests/system/stress/kill_and_rejoin.py 660,1090,2310,2330,4110,5350

The workload is issue 27's: 3 single-threaded workers (nanny on), an MLP 20-64-1 regressor, SGD lr
0.01 momentum 0.9, batch 128, 40 epochs on 20,000 rows of make_regression (6,280 updates).  Each
kill is in a new fit on the same cluster.  The parameter server must end bitwise equal; a
replacement should take part within 2 s of registering (docs: elasticity).
"""

import logging
import os
import signal
import sys
import threading
import time

import numpy as np
import torch
from distributed import Client, LocalCluster
from kill_workers import weights  # tests/system/stress: the parameters (and BatchNorm statistics), flat
from sklearn.datasets import make_regression

from adadamp import DaskRegressor
from adadamp.callbacks import Callback


class Kill(Callback):
    def __init__(self, at=None, address=None):
        self.at, self.address = at, address

    def on_update_end(self, est, record=None, **info):
        self.log = getattr(self, "log", [])
        self.log.append((time.time(), record["n_workers"]))
        if len(self.log) == self.at:
            c = Client(self.address, set_as_default=False)
            pid = sorted(c.run(os.getpid).values())[1]
            c.close()
            self.killed = time.time()
            os.kill(pid, signal.SIGKILL)


def watch(address, seen, stop):
    c = Client(address, set_as_default=False)
    while not stop.is_set():
        for a in c.scheduler_info(n_workers=-1)["workers"]:
            seen.setdefault(a, time.time())
        time.sleep(0.01)
    c.close()


if __name__ == "__main__":
    X, y = make_regression(n_samples=20000, n_features=20, noise=5, random_state=0)
    X = X.astype(np.float32)
    y = ((y - y.mean()) / y.std()).astype(np.float32)
    p = {
        "module__hidden": (64,),
        "optimizer": torch.optim.SGD,
        "optimizer__lr": 0.01,
        "optimizer__momentum": 0.9,
        "batch_size": 128,
        "max_epochs": 40,
        "random_state": 0,
    }
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None, silence_logs=logging.CRITICAL) as c,
        Client(c) as client,
    ):
        calm = DaskRegressor(client=client, **p).fit(X, y)
        for k in [int(a) for a in sys.argv[1].split(",")]:
            client.wait_for_workers(3, timeout=120)
            seen, stop = {}, threading.Event()
            t = threading.Thread(target=watch, args=(client.scheduler.address, seen, stop))
            t.start()
            time.sleep(0.3)
            before = set(seen)
            cb = Kill(k, client.scheduler.address)
            hurt = DaskRegressor(client=client, callbacks=[("k", cb)], **p).fit(X, y)
            stop.set()
            t.join()
            cb = dict(hurt.callbacks_)["k"] if hasattr(hurt, "callbacks_") else cb
            reg = sorted(v for a, v in seen.items() if a not in before)
            back = next((t_ for t_, n in cb.log if reg and t_ > reg[0] and n == 3), None)
            print(
                f"kill at update {k}: max|dw| {np.abs(weights(hurt) - weights(calm)).max():.2e}; replacement registered "
                f"{(reg[0] - cb.killed) if reg else float('nan'):.2f} s after the kill, first update with it "
                f"{(back - reg[0]) if back else float('nan'):.2f} s after registering",
                flush=True,
            )
