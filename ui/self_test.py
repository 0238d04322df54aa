"""`dflash-desktop --self-test`: a user's first start, checked end to end, for installers and CI.

It opens the real window in a fresh, temporary data folder (the user's chats and settings are never
touched), lets it load the embedded demo pair through its own worker (in an installed app: the app's
executable run as `--worker`), sends one prompt through the chat as a user would, then asks the worker
for the same greedy continuation with DFlash and with plain decoding, which must be token-identical.
Last, this (window) process must not have loaded an engine library: its memory map, not only
sys.modules, is searched for torch, tokenizers, mlx and llama.cpp.

Prints one JSON report on stdout and exits 0 when every check passed, 1 otherwise (the report says which
check failed, with the worker log's tail). Options: --timeout SECONDS (default 600).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "def read_config(path):\n"
HEAVY_MODULES = ("torch", "transformers", "tokenizers", "mlx", "llama_cpp", "triton")
# folders (packages) and library name prefixes that belong to an engine, never to the window process
HEAVY_DIRS = {"torch", "tokenizers", "mlx", "llama_cpp", "triton"}
HEAVY_LIB_PREFIXES = ("libtorch", "torch_", "libc10", "c10", "libmlx", "libllama", "llama", "libggml", "ggml")
GREEDY = {"max_new_tokens": 48, "temperature": 0.0, "plain_fallback": False}


def mapped_files(pid: int) -> list[str]:
    """Files mapped into a process: /proc on Linux, psutil on Windows, lsof on macOS."""
    if sys.platform.startswith("linux"):
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        return sorted({line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6})
    if sys.platform == "darwin":
        out = subprocess.run(["lsof", "-p", str(pid), "-Fn"], capture_output=True, text=True, check=True).stdout
        return sorted({line[1:] for line in out.splitlines() if line.startswith("n/")})
    import psutil
    return sorted({m.path for m in psutil.Process(pid).memory_maps() if m.path})


def heavy_libraries(files: list[str]) -> list[str]:
    """The engine libraries among mapped files."""
    heavy = []
    for name in files:
        parts = Path(name).parts
        base = parts[-1].lower() if parts else ""
        if HEAVY_DIRS.intersection(parts[:-1]) or base.startswith(HEAVY_LIB_PREFIXES):
            heavy.append(name)
    return heavy


def parse_args(argv: list[str]) -> tuple[float, str]:
    """--timeout SECONDS (default 600) and --engine NAME (default auto: the plan's engine), in any order."""
    options = {"--timeout": "600", "--engine": "auto"}
    rest = list(argv)
    while len(rest) >= 2 and rest[0] in options:
        key = rest.pop(0)
        options[key] = rest.pop(0)
    if rest:
        raise SystemExit("usage: dflash-desktop --self-test [--timeout SECONDS] [--engine auto|torch|llamacpp|mlx]")
    return float(options["--timeout"]), options["--engine"]


def run(argv: list[str]) -> int:
    timeout, engine = parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="dflash-self-test-"))
    os.environ["DFLASH_DESKTOP_HOME"] = str(home)   # before anything reads a path: a fresh user
    os.environ["HF_HUB_OFFLINE"] = "1"               # the demo pair is embedded; nothing is fetched
    try:
        report = _Check(timeout, engine).run()
    finally:
        os.environ.pop("DFLASH_DESKTOP_HOME")
    if report["ok"]:
        shutil.rmtree(home, ignore_errors=True)
    else:
        report["kept_home"] = str(home)
    print(json.dumps(report, indent=1), flush=True)
    return 0 if report["ok"] else 1


class _Check:
    def __init__(self, timeout: float, engine: str = "auto"):
        self.timeout, self.engine = timeout, engine
        self.report: dict = {"ok": False, "gui_pid": os.getpid(), "frozen": bool(getattr(sys, "frozen", False)),
                             "executable": sys.executable, "steps": []}
        self.t0 = time.monotonic()
        self.pending: dict[str, str] = {}   # request id -> "dflash" or "baseline"
        self.greedy: dict[str, list[int]] = {}

    def step(self, name: str, **facts) -> None:
        self.report["steps"].append({"step": name, "at_s": round(time.monotonic() - self.t0, 2), **facts})

    def run(self) -> dict:
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication

        from dflash_desktop import settings as settings_mod

        from .main_window import MainWindow, demo_pair

        self.app = QApplication.instance() or QApplication([sys.argv[0]])
        settings = settings_mod.load()
        settings.max_new_tokens = 64   # a short first answer: the check is that it comes, not its length
        settings.plain_fallback = False  # DFlash itself is checked, even where an engine measured plain faster
        settings.engine = self.engine    # "auto", or the engine to check (Windows checks torch and llama.cpp)
        self.window = MainWindow(settings=settings, pair=demo_pair())
        self.window.show()
        self.step("window shown", platform=self.app.platformName())
        controller, worker = self.window.controller, self.window.worker
        self.window.session.pairLoaded.connect(self.on_loaded)
        controller.answerFinished.connect(self.on_answer)
        worker.workerStarted.connect(lambda ev: self.report.update(worker_pid=ev.get("pid"),
                                                                   worker_command=ev.get("command")))
        worker.hello.connect(lambda ev: self.report.update(engine_packs=ev.get("engine_packs")))
        worker.done.connect(self.on_greedy)
        worker.error.connect(lambda ev: self.fail(f"the worker reported {ev.get('code')}: {ev.get('message')}"))
        QTimer.singleShot(int(self.timeout * 1000), lambda: self.fail(f"no result within {self.timeout:.0f} s"))
        self.app.exec()
        self.report["seconds"] = round(time.monotonic() - self.t0, 2)
        return self.report

    def on_loaded(self, loaded) -> None:
        if self.engine != "auto" and loaded.engine != self.engine:
            return self.fail(f"the demo pair loaded with {loaded.engine}, not the {self.engine} engine asked for")
        self.step("demo pair loaded", engine=loaded.engine, device=loaded.device, dtype=loaded.dtype,
                  load_s=loaded.load_s)
        self.window.controller.send(PROMPT)

    def on_answer(self, ev: dict) -> None:
        stats = ev.get("stats") or {}
        shown = self.window.chat_view.messages[-1].text
        self.step("chat answered", stop_reason=ev.get("stop_reason"), chars=len(ev.get("text") or ""),
                  tokens=stats.get("generated_tokens"), accepted=stats.get("accepted"), tau=stats.get("tau"))
        if ev.get("event") != "done" or not (ev.get("text") or "").strip():
            return self.fail("the chat got no answer")
        if shown != ev["text"]:
            return self.fail("the window does not show the answer the engine wrote")
        if not stats.get("accepted"):
            return self.fail("DFlash accepted no drafted token: the drafter did not run")
        self.greedy_run("dflash")

    def greedy_run(self, mode: str) -> None:
        """One at a time: the worker runs a single generation."""
        self.pending[self.window.worker.generate(prompt=PROMPT, raw=True, mode=mode, settings=GREEDY)] = mode

    def on_greedy(self, ev: dict) -> None:
        mode = self.pending.pop(ev.get("id"), None)
        if mode is None:
            return
        self.greedy[mode] = ev.get("token_ids") or []
        if mode == "dflash":
            return self.greedy_run("baseline")
        same = self.greedy["dflash"] == self.greedy["baseline"]
        self.step("greedy DFlash vs plain decoding", tokens=len(self.greedy["dflash"]), identical=same)
        if not same or not self.greedy["dflash"]:
            return self.fail("greedy DFlash and plain decoding differ")
        self.check_window_process()

    def check_window_process(self) -> None:
        modules = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY_MODULES))
        libraries = heavy_libraries(mapped_files(os.getpid()))
        self.step("window process checked", heavy_modules=modules, heavy_libraries=libraries)
        if modules or libraries:
            return self.fail(f"the window process loaded engine code: {modules + libraries}")
        self.report["ok"] = True
        self.window.close()

    def fail(self, reason: str) -> None:
        if self.report.get("failure") or self.report["ok"]:
            return
        self.report["failure"] = reason
        log = self.window.worker.log_path
        if log and Path(log).is_file():
            self.report["worker_log"] = str(log)
            self.report["worker_log_tail"] = Path(log).read_text(errors="replace").splitlines()[-40:]
        self.window.close()
