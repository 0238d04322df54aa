"""The frozen app's way into the worker: a PyInstaller build has no `python -m`, so the GUI starts
`<app> --worker` and the main entry hands over here before it creates any window. The llama.cpp engine's
GGUF converter runs the same way, as `<app> --convert-gguf CONVERTER ARGS...`
(engine/backends/llamacpp/convert.py)."""
from __future__ import annotations

import os
import sys

WORKER_FLAG = "--worker"
CONVERT_FLAG = "--convert-gguf"


def run_worker_if_requested(argv: list[str] | None = None) -> None:
    """Call first thing in main(): when argv[1] is --worker, run the engine worker and exit.
    engine.worker is imported only here, so the GUI process never loads it (or torch)."""
    argv = sys.argv if argv is None else argv
    if len(argv) > 1 and argv[1] == WORKER_FLAG:
        default_engine_packs()
        from engine.worker import main
        sys.exit(main(argv[2:]))
    if len(argv) > 1 and argv[1] == CONVERT_FLAG:
        default_engine_packs()
        from engine import packs
        packs.activate(packs.root_from_env())  # the converter imports torch: the same one the worker runs
        from engine.backends.llamacpp.convert_main import main as convert
        sys.argv = [argv[0], *argv[2:]]
        convert()
        sys.exit(0)


def default_engine_packs() -> None:
    """A frozen app's engine looks for engine packs (engine/packs.py) in the user's data folder. A source
    checkout uses its own Python environment, unless DFLASH_DESKTOP_ENGINE_PACKS names a folder."""
    if getattr(sys, "frozen", False):
        from engine.packs import ROOT_ENV

        from .paths import engine_packs_dir
        os.environ.setdefault(ROOT_ENV, str(engine_packs_dir()))
