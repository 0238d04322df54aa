"""`dflash-desktop`: with no command it opens the app; engine commands (generate, bench, train-draft)
run in this process without Qt; `serve` runs the OpenAI-compatible server on a worker, without Qt or
torch in this process. The GUI path never imports torch.

`--version` prints the version; `--self-test` opens the window on the demo pair, answers one prompt
through the worker and exits with 0 when all went well (ui/self_test.py)."""
from __future__ import annotations

import sys

ENGINE_COMMANDS = {"generate", "bench", "train-draft"}
USAGE = """usage: dflash-desktop [COMMAND] [--help]

With no command, opens the app. Commands:
  generate      decode one prompt with DFlash (or --baseline), streamed
  bench         DFlash against plain decoding on a pair, interleaved
  train-draft   train a DFlash drafter for a target on your own texts
  serve         an OpenAI-compatible server on 127.0.0.1
  --self-test   open the window on the demo pair, answer one prompt, exit 0 when all went well
  --version     print the version
`dflash-desktop COMMAND --help` describes a command's options."""


def main(argv: list[str] | None = None) -> int:
    from .worker_entry import default_engine_packs, run_worker_if_requested
    run_worker_if_requested([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])  # frozen app: --worker
    argv = list(sys.argv[1:] if argv is None else argv)
    from .stdio import ensure_stdio
    ensure_stdio(console_wanted=bool(argv))  # a windowed build may start without stdout/stderr
    if argv[:1] in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if argv[:1] == ["--version"]:
        from engine.worker import app_version
        print(f"dflash-desktop {app_version()}")
        return 0
    if argv and argv[0] == "serve":
        from .server import main as serve
        return serve(argv[1:])
    if argv and argv[0] in ENGINE_COMMANDS:
        from engine import packs
        default_engine_packs()
        packs.activate(packs.root_from_env())
        from engine.cli import main as engine_main
        return engine_main(argv)
    if argv[:1] == ["--self-test"]:
        from ui.self_test import run as self_test
        return self_test(argv[1:])
    from ui.app import run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
