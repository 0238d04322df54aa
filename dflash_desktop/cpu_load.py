"""How much of the machine other programs took while the engine worked, measured, not guessed.

A DFlash step on a CPU is several matrix products over all cores; another program spinning on one of
them slows it (and a baseline measured meanwhile) directly. ``CpuMeter`` reads the whole machine's busy
CPU time and the CPU time of our own processes (the window and the engine worker) before and after a
run; the difference is what every other process used, as a share of the machine's capacity over the
same wall time. A few system calls each: cheap enough for the GUI thread.
"""
from __future__ import annotations

import os
import time

import psutil


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return (sum(t) - t.idle - getattr(t, "iowait", 0.0)   # guest time is already counted in user (Linux)
            - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def _process_seconds(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    except (psutil.Error, OSError):
        return 0.0


class CpuMeter:
    """start(pids) ... stop() -> share (0-1) of the CPU capacity used by processes other than ``pids``
    (this process is always counted as ours). None when it cannot be measured. The kernel counts CPU time in
    ticks (10 ms on Linux), so a run of a few tens of milliseconds gives a coarse share: see wall_s."""

    def __init__(self, pids: list[int | None] | None = None):
        self.pids = sorted({os.getpid(), *(p for p in (pids or []) if p)})
        self.cpus = psutil.cpu_count() or 1
        self._start: tuple[float, float, dict[int, float]] | None = None
        self.other_s: float | None = None    # CPU seconds other processes used (after stop)
        self.wall_s: float | None = None

    def start(self) -> "CpuMeter":
        try:
            self._start = (time.monotonic(), _busy_seconds(), {p: _process_seconds(p) for p in self.pids})
        except (psutil.Error, OSError):
            self._start = None
        return self

    def stop(self) -> float | None:
        if self._start is None:
            return None
        t0, busy0, ours0 = self._start
        self._start = None
        try:
            wall, busy = time.monotonic() - t0, _busy_seconds() - busy0
            ours = sum(max(_process_seconds(p) - s, 0.0) for p, s in ours0.items())
        except (psutil.Error, OSError):
            return None
        if wall <= 0:
            return None
        self.wall_s, self.other_s = wall, max(busy - ours, 0.0)
        return min(self.other_s / (wall * self.cpus), 1.0)
