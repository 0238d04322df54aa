"""A remote pair in the real window: Models… > Add a server, a chat streamed from the server, the stats
panel showing what the server reported (or "not reported"), and this computer's engine never started.
The servers are vLLM's and SGLang's responses on 127.0.0.1 (tests/remote_fakes.py)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.qt_worker import QtWorker
from tests.remote_fakes import FakeServer
from tests.test_remote import WORDS_TEXT
from tests.ui_chat_fixtures import ANSWER_TIMEOUT_MS, home  # noqa: F401


@pytest.fixture
def window(qtbot, home):
    from ui.main_window import MainWindow
    worker = QtWorker()   # never started by this test: a remote pair must not need it
    w = MainWindow(worker=worker, store=ChatStore(), settings=settings_mod.Settings(), autoload=False)
    qtbot.addWidget(w)
    w.show()
    yield w
    worker.shutdown(5)


def connect(qtbot, window, url: str, key: str = ""):
    picker = window.open_model_picker()
    dialog = picker.add_server()
    dialog.url.setCurrentText("not a url")
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert dialog.isVisible() and "http://HOST:PORT" in dialog.error.text()
    dialog.url.setCurrentText(url + "/v1")
    dialog.key.setText(key)
    with qtbot.waitSignal(window.session.pairLoaded, timeout=30_000):
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    qtbot.waitUntil(lambda: window.session.ready, timeout=10_000)


def send(qtbot, window, text: str) -> dict:
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.keyClicks(window.chat_view.input, text)
        qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
    return blocker.args[0]


def test_a_vllm_server_added_in_the_picker_runs_the_chat_and_fills_the_stats(qtbot, window):
    fake = FakeServer("vllm", api_key="secret-key")
    started: list[dict] = []
    window.worker.workerStarted.connect(started.append)
    try:
        connect(qtbot, window, fake.url, "secret-key")
        assert "Qwen/Qwen3-8B" in window.pair_label.text() and "vLLM at 127.0.0.1" in window.pair_label.text()
        done = send(qtbot, window, "Write a parser.")
        assert done["event"] == "done" and window.chat_view.messages[-1].text == WORDS_TEXT
        panel = window.stats_panel.values
        assert panel["acceptance_rate"] == pytest.approx(24 / 105) and panel["tau"] == pytest.approx(31 / 7)
        assert window.stats_panel.acceptance_label.text() == "23%" and not window.stats_panel.warning.isVisible()
        assert started == [] and not window.worker.running   # the local engine never started
        assert [r["path"] for r in fake.requests].count("/v1/chat/completions") == 1   # no baseline calibration
        saved = settings_mod.load()
        assert saved.remote_servers == [{"base_url": fake.url, "api_key": "secret-key"}]
        assert saved.last_pair["remote"]["base_url"] == fake.url and saved.last_pair["name"] == "Qwen/Qwen3-8B"
        window.toggle_demo(True)
        assert not window.demo.start("def f():\n", {}) and "runs on a server" in window.demo.error_label.text()
    finally:
        fake.close()


def test_a_server_that_reports_no_acceptance_shows_not_reported(qtbot, window):
    fake = FakeServer("sglang")
    try:
        connect(qtbot, window, fake.url)
        send(qtbot, window, "hi")
        panel = window.stats_panel
        assert panel.acceptance_label.text() == "not reported" and panel.tau_label.text() == "not reported"
        assert panel.values["acceptance_rate"] is None and panel.warning.isVisible()
        assert "SGLang reports acceptance for raw prompts" in panel.warning.text()
    finally:
        fake.close()
