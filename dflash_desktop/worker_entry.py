"""The frozen app's way into the worker: a PyInstaller build has no `python -m`, so the GUI starts
`<app> --worker` and the main entry hands over here before it creates any window."""
from __future__ import annotations

import sys

WORKER_FLAG = "--worker"


def run_worker_if_requested(argv: list[str] | None = None) -> None:
    """Call first thing in main(): when argv[1] is --worker, run the engine worker and exit.
    engine.worker is imported only here, so the GUI process never loads it (or torch)."""
    argv = sys.argv if argv is None else argv
    if len(argv) > 1 and argv[1] == WORKER_FLAG:
        from engine.worker import main
        sys.exit(main(argv[2:]))
