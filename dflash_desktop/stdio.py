"""Working standard streams for a windowed app.

A Windows build made with ``console=False``, or an app started from Finder or a desktop menu, can start
with ``sys.stdin``, ``sys.stdout`` or ``sys.stderr`` set to None (Python found no valid handle). Then a
traceback, a ``logging`` handler, ``faulthandler`` or a library's ``sys.stderr.write`` fails or vanishes.
``ensure_stdio`` gives every missing stream a working substitute before anything else runs.

Never called in the worker: there stdin and stdout are the protocol pipes, which always exist.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

OUTPUT_LOG = "app-output.log"


def ensure_stdio(console_wanted: bool) -> Path | None:
    """Replace the missing streams. ``console_wanted`` (a command-line command, ``--version``,
    ``--self-test``): on Windows first attach to the console the app was started from, so its output
    shows there. Otherwise missing output streams go to ``<logs>/app-output.log``, and a missing stdin
    reads as empty. Returns that log's path when it is used."""
    if sys.stdin is not None and sys.stdout is not None and sys.stderr is not None:
        return None
    if console_wanted and _attach_parent_console():
        sys.stdin = sys.stdin or open("CONIN$", encoding="utf-8", errors="replace")
        sys.stdout = sys.stdout or open("CONOUT$", "w", buffering=1, encoding="utf-8", errors="replace")
        sys.stderr = sys.stderr or open("CONOUT$", "w", buffering=1, encoding="utf-8", errors="replace")
        return None
    if sys.stdin is None:
        sys.stdin = open(os.devnull, encoding="utf-8")
    if sys.stdout is not None and sys.stderr is not None:
        return None
    from . import paths
    log = paths.logs_dir() / OUTPUT_LOG
    stream = open(log, "a", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout = sys.stdout or stream
    sys.stderr = sys.stderr or stream
    return log


def _attach_parent_console() -> bool:
    """Windows only: attach this (windowed) process to its parent's console, if it has one."""
    if sys.platform != "win32":
        return False
    import ctypes
    attach_parent_process = -1
    return bool(ctypes.windll.kernel32.AttachConsole(attach_parent_process))
