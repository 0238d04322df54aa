"""`dflash-desktop --self-test` (ui/self_test.py), the check every installer runs on the installed app,
here from source: window, demo pair, one prompt through a real worker, greedy DFlash equal to plain
decoding, and no engine library in the window process. The frozen app runs the same code
(tests/test_installers_linux.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ui.self_test import heavy_libraries, mapped_files

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("engine", ["auto", "torch"])
def test_self_test_passes_from_source(tmp_path, engine):
    """The plan's engine (llama.cpp on a CPU where it is built), and torch as Windows' installer check asks
    (`--engine torch`: the engine Settings > Engine prefers is used from the first load)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"}
    run = subprocess.run([sys.executable, "-m", "dflash_desktop", "--self-test", "--timeout", "280",
                          "--engine", engine], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    report = json.loads(run.stdout[run.stdout.index("{"):])
    assert report["ok"] and not report["frozen"] and report["worker_command"][1:] == ["-m", "engine.worker"]
    steps = {s["step"]: s for s in report["steps"]}
    assert engine == "auto" or steps["demo pair loaded"]["engine"] == engine
    import psutil
    left = [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "llama-server"
            and any(str(tmp_path) in a or "dflash-self-test" in a for a in p.info["cmdline"] or ())]
    assert not left, "the self-test left a llama-server running"
    assert steps["chat answered"]["accepted"] > 0 and steps["greedy DFlash vs plain decoding"]["identical"]
    assert steps["window process checked"]["heavy_libraries"] == []


def maps_of(code: str) -> list[str]:
    """The mapped files of a real Python process once it has run `code`."""
    proc = subprocess.Popen([sys.executable, "-c", code + "\nimport sys, time\nprint('ready', flush=True)\n"
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        return mapped_files(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_memory_map_check_sees_torch_and_not_qt():
    torch_maps = heavy_libraries(maps_of("import torch"))
    assert any("libtorch" in name for name in torch_maps), torch_maps
    assert heavy_libraries(maps_of("from PySide6 import QtWidgets")) == []
