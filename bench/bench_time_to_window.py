"""Time to window: launch `python -m dflash_desktop` the way a user does and measure, from just before
the process is spawned, until the main window's first frame (the app prints the wall-clock time).
Runs with a fresh DFLASH_DESKTOP_HOME each time; the model load that follows is not counted."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def once() -> float:
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, DFLASH_DESKTOP_HOME=home, DFLASH_DESKTOP_TIMING="1",
                   DFLASH_DESKTOP_EXIT_AFTER_MS="300", PYTHONPATH=str(ROOT))
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "dflash_desktop"], env=env, capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        shown = next(float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("window-shown-at"))
        return shown - t0


if __name__ == "__main__":
    runs = [once() for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5)]
    print("time to window (s): " + ", ".join(f"{r:.3f}" for r in runs))
    print(f"median {statistics.median(runs):.3f} s, best {min(runs):.3f} s")
