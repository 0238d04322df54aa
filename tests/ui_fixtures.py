"""Fixtures shared by the UI tests: a random model pair on disk and a real worker that has it loaded.

The worker is a real subprocess (no mocks): starting it and importing torch costs seconds, so one
worker serves a whole test module.
"""
from __future__ import annotations

import pytest

from dflash_desktop.qt_worker import QtWorker

LOAD_TIMEOUT_S = 120


def run_app_briefly(home, exit_after_ms: int = 2500):
    """`python -m dflash_desktop` as a user starts it, on the profile in `home`, quitting by itself after
    `exit_after_ms`: the finished process (exit code, stdout, stderr)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DFLASH_DESKTOP_HOME=str(home), PYTHONPATH=str(root), QT_QPA_PLATFORM="offscreen",
               DFLASH_DESKTOP_EXIT_AFTER_MS=str(exit_after_ms))
    return subprocess.run([sys.executable, "-m", "dflash_desktop"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def hub_window(qtbot, tmp_path, monkeypatch, hub):
    """The real window on a fresh profile, online to the local hub (tests/hub_server.py) alone; its worker is shut
    down after the test."""
    from huggingface_hub import constants

    from dflash_desktop import settings as settings_mod
    from dflash_desktop.chat_store import ChatStore
    from ui.main_window import MainWindow
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    w = MainWindow(worker=QtWorker(), store=ChatStore(), settings=settings_mod.Settings(), autoload=False)
    qtbot.addWidget(w)
    w.show()
    yield w
    w.worker.shutdown()


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory):
    from tests.tiny_torch import save_random_pair
    return save_random_pair(tmp_path_factory.mktemp("pair"), hidden=64, layers=4, block_size=8)


@pytest.fixture(scope="module")
def loaded_worker(qapp, random_pair, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("home")))
        worker = QtWorker()
        result = worker.client.wait(worker.load_pair(*random_pair), LOAD_TIMEOUT_S)
        assert result["event"] == "loaded", result
        yield worker
        worker.shutdown(10)
