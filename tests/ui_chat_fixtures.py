"""Fixtures for the chat window tests: a real worker subprocess per test module and a fresh app home
(settings + chat database) per test. No mocks: every answer comes from a real engine.

The "echo" pair is a random pair whose final norms are zeroed, so target and drafter both always
predict token 0 ('!'): every draft is accepted, which gives text with drafted spans (for the
highlighting tests) and a high tau, quickly.
"""
from __future__ import annotations

import pytest

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.qt_worker import QtWorker

LOAD_TIMEOUT_MS = 120_000
ANSWER_TIMEOUT_MS = 60_000


def save_echo_pair(root, block_size: int = 8):
    from tests.tiny_torch import save_random_pair
    from safetensors.torch import load_file, save_file
    target, draft = save_random_pair(root, block_size=block_size)
    for folder, key in ((target, "model.norm.weight"), (draft, "norm.weight")):
        path = next(folder.glob("*.safetensors"))
        tensors = load_file(str(path))
        tensors[key] = tensors[key] * 0
        save_file(tensors, str(path), metadata={"format": "pt"})
    return target, draft


@pytest.fixture(scope="module")
def echo_pair(tmp_path_factory):
    target, draft = save_echo_pair(tmp_path_factory.mktemp("echo"))
    # the torch engine by name: llama.cpp's converter does not know the random tokenizer (under "auto" the
    # worker would try it first, then fall back: tests/test_llamacpp_engine.py)
    return {"id": "echo", "name": "Echo test pair", "target_dir": str(target), "draft_dir": str(draft),
            "plan": {"engine": "torch", "device": "auto", "dtype": None}}


@pytest.fixture(scope="module")
def chat_worker(qapp, tmp_path_factory):
    """One worker for the module; the window under test loads its pair into it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("worker-home")))
        worker = QtWorker()
        worker.start()
        yield worker
        worker.shutdown(10)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    return tmp_path


def make_window(qtbot, worker, pair, settings=None, store=None, wait_ready=True):
    from ui.main_window import MainWindow
    # the echo drafter's logits are flat, so it is never confident: verify whole blocks regardless
    settings = settings or settings_mod.Settings(max_new_tokens=24, draft_cutoff=0.0)
    window = MainWindow(worker=worker, store=store or ChatStore(), settings=settings, pair=pair)
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()
    # shortcuts reach the active window only (a failed load's dialog may take it first: it is window-modal)
    qtbot.waitUntil(lambda: window.isActiveWindow() or window.load_error_box is not None, timeout=5000)
    if wait_ready:
        qtbot.waitUntil(lambda: window.session.ready, timeout=LOAD_TIMEOUT_MS)
    return window


def send_and_wait(qtbot, window, text: str) -> dict:
    """Type into the composer, press Enter, wait for the answer's done (or error) event."""
    from PySide6.QtCore import Qt
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.keyClicks(window.chat_view.input, text)
        qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
    return blocker.args[0]


def answer_question(window, button_text: str) -> None:
    """Click a button of the window-modal question box now open on the window (the greedy-regenerate one)."""
    from PySide6.QtWidgets import QMessageBox
    box = next(b for b in window.findChildren(QMessageBox) if b.isVisible())
    next(b for b in box.buttons() if b.text() == button_text).click()


def assert_sampled_length(n: int, stop_reason: str | None, limit: int) -> None:
    """A sampled echo answer runs to its limit, unless its flat logits drew the end-of-text token or a stop
    string (a few percent of answers): then it ends early, saying so."""
    assert n == limit or (n < limit and stop_reason in ("eos", "stop_string")), (n, stop_reason)
