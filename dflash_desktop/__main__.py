"""`dflash-desktop`: with no command it opens the app; engine commands (generate, bench, train-draft)
run in this process without Qt; `serve` runs the OpenAI-compatible server on a worker, without Qt or
torch in this process. The GUI path never imports torch."""
from __future__ import annotations

import sys

ENGINE_COMMANDS = {"generate", "bench", "train-draft"}


def main(argv: list[str] | None = None) -> int:
    from .worker_entry import run_worker_if_requested
    run_worker_if_requested([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])  # frozen app: --worker
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        from .server import main as serve
        return serve(argv[1:])
    if argv and argv[0] in ENGINE_COMMANDS:
        from engine.cli import main as engine_main
        return engine_main(argv)
    from ui.app import run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
