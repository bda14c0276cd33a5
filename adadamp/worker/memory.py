"""A worker's peak memory over one share of an update, which each gradient reply reports.

What runs out first: on a CUDA worker the device's memory (``torch.cuda.max_memory_allocated``),
elsewhere the process's resident memory (Linux's ``VmHWM``).  Each reading resets the peak, so a
reply's figure is the peak since the worker's last reply: the share's forward and backward pass,
which is what grows with the batch.  Other fits computing on the same worker process between two
replies count in it too.  Where neither is available the figure is 0 (unknown).
"""

from __future__ import annotations

import contextlib

import torch

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def peak_since_last(device: torch.device) -> int:
    """Bytes at the peak since the last call (on this device, or this process), then reset."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open(_STATUS) as f:
            peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")  # the peak resident size starts again from the current one
        return peak
    return 0
