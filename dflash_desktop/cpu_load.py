"""How much of the machine other programs took while the engine worked, measured, not guessed.

A DFlash step on a CPU is several matrix products over all cores; another program spinning on one of
them slows it (and a baseline measured meanwhile) directly. ``CpuMeter`` reads the whole machine's busy
CPU time and the CPU time of our own processes (the window, the engine worker and every process they started, such as
llama.cpp's server) before and after a run; the difference is what every other process used, as a share of the machine's capacity over the
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


def _family_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each of these processes and of every live process below them (a worker's llama-server),
    each with what its finished children used."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except (psutil.Error, OSError):
            continue
        for proc in family:
            try:
                t = proc.cpu_times()
            except (psutil.Error, OSError):
                continue
            out[proc.pid] = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return out


class CpuMeter:
    """start(pids) ... stop() -> share (0-1) of the CPU capacity used by processes other than ``pids`` and
    their descendants (this process is always counted as ours; a process started during the run counts whole). None when it cannot be measured. The kernel counts CPU time in
    ticks (10 ms on Linux), so a run of a few tens of milliseconds gives a coarse share: see wall_s."""

    def __init__(self, pids: list[int | None] | None = None):
        self.pids = sorted({os.getpid(), *(p for p in (pids or []) if p)})
        self.cpus = psutil.cpu_count() or 1
        self._start: tuple[float, float, dict[int, float]] | None = None
        self.other_s: float | None = None    # CPU seconds other processes used (after stop)
        self.wall_s: float | None = None

    def start(self) -> "CpuMeter":
        try:
            self._start = (time.monotonic(), _busy_seconds(), _family_seconds(self.pids))
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
            ours = sum(max(seconds - ours0.get(pid, 0.0), 0.0) for pid, seconds in _family_seconds(self.pids).items())
        except (psutil.Error, OSError):
            return None
        if wall <= 0:
            return None
        self.wall_s, self.other_s = wall, max(busy - ours, 0.0)
        return min(self.other_s / (wall * self.cpus), 1.0)
