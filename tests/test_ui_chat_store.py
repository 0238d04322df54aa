"""The window with a damaged, newer or unusable chat store: it opens, says once what happened (a dialog,
shown by ui/app.py after the window), and a refused write (send, rename, delete) shows the store's
message instead of a traceback. Real widgets; no worker process is started (nothing here needs a model)."""
from __future__ import annotations

import os
import sqlite3
import sys

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import SCHEMA_VERSION, ChatStore, default_path
from dflash_desktop.qt_worker import QtWorker


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    return tmp_path


def open_window(qtbot):
    """The window as ui/app.py builds it: no store given, so it opens (and owns) the default one."""
    from ui.main_window import MainWindow
    window = MainWindow(worker=QtWorker(), settings=settings_mod.Settings(), autoload=False)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def message_boxes(window) -> list[str]:
    return [box.text() for box in window.findChildren(QMessageBox) if box.isVisible()]


def newer_chat_file() -> int:
    """The default chat file with one chat, then marked as written by a newer version; returns the chat id."""
    store = ChatStore(default_path())
    conv = store.create_conversation("kept chat")
    store.add_message(conv.id, "user", "hello")
    store.close()
    db = sqlite3.connect(default_path())
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    return conv.id


def test_damaged_chat_file_does_not_stop_the_window_and_the_notice_says_where_it_went(home, qtbot):
    path = default_path()
    path.write_bytes(os.urandom(4096))
    window = open_window(qtbot)
    moved = next(p for p in path.parent.iterdir() if p.name.startswith("chats.damaged-"))
    assert "damaged" in window.store_notice and str(moved) in window.store_notice
    box = window.show_store_notice()
    assert box.isVisible() and box.text() == window.store_notice
    assert message_boxes(window) == [window.store_notice]
    assert not window.read_only_label.isVisible()
    assert window.store.conversations() == []


def test_healthy_store_shows_no_notice(home, qtbot):
    window = open_window(qtbot)
    assert window.store_notice is None and window.show_store_notice() is None
    assert message_boxes(window) == []


@pytest.fixture
def store_error_hook():
    """ui/app.py's hook, installed for one window and removed again (pytest-qt's own hook stays underneath)."""
    from ui.app import install_store_error_hook
    previous = sys.excepthook
    yield install_store_error_hook
    sys.excepthook = previous


def test_read_only_store_shows_chats_and_refused_writes_show_a_message(home, qtbot, store_error_hook):
    """Send, rename and delete on chats written by a newer version: each shows why nothing was saved; the
    window keeps running and the list still shows what is stored."""
    conv_id = newer_chat_file()
    window = open_window(qtbot)
    store_error_hook(window)
    assert "newer version" in window.store_notice
    assert window.read_only_label.isVisible() and window.read_only_label.toolTip() == window.store.read_only
    assert [c.title for c in window.store.conversations()] == ["kept chat"]

    qtbot.keyClicks(window.chat_view.input, "a new question")
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
    window.sidebar.renameRequested.emit(conv_id, "renamed")
    window.sidebar.deleteRequested.emit(conv_id)

    shown = message_boxes(window)
    assert len(shown) == 3 and all(t.startswith("Nothing was saved.") and "newer version" in t for t in shown)
    assert "Nothing was saved." in window.status_label.text()
    assert [(c.id, c.title) for c in window.store.conversations()] == [(conv_id, "kept chat")]
    assert [m.content for m in window.store.messages(conv_id)] == ["hello"]
    assert window.chat_view.messages == []  # the refused question did not appear as if sent


def test_store_error_hook_passes_other_exceptions_on(qtbot, store_error_hook):
    from ui.main_window import MainWindow
    seen = []
    sys.excepthook = lambda kind, value, tb: seen.append(value)
    window = MainWindow(worker=QtWorker(), store=ChatStore(":memory:"), settings=settings_mod.Settings(),
                        autoload=False)
    qtbot.addWidget(window)
    store_error_hook(window)
    error = RuntimeError("not a store problem")
    sys.excepthook(RuntimeError, error, None)
    assert seen == [error] and message_boxes(window) == []


def test_bring_to_front_restores_a_minimized_window(home, qtbot):
    window = open_window(qtbot)
    window.showMinimized()
    qtbot.waitUntil(window.isMinimized)
    window.bring_to_front()
    assert not window.isMinimized() and window.isVisible()


def test_a_message_a_read_only_store_refuses_stays_in_the_box(home, qtbot, store_error_hook):
    newer_chat_file()
    window = open_window(qtbot)
    store_error_hook(window)
    qtbot.keyClicks(window.chat_view.input, "typed with care")
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
    assert any(t.startswith("Nothing was saved.") for t in message_boxes(window))
    assert window.chat_view.input.toPlainText() == "typed with care"   # to send again once the store is writable


def unreadable_last_chat() -> settings_mod.Settings:
    """The default chat file with a chat whose stored stats the window cannot draw (an import before the
    import checked types did that), left on screen at the last quit; returns the settings saying so."""
    store = ChatStore(default_path())
    conv = store.create_conversation("fast chat")
    store.add_message(conv.id, "user", "hi")
    store.add_message(conv.id, "assistant", "hello", stats={"decode_tok_s": "fast"}, stop_reason="eos")
    store.close()
    settings = settings_mod.Settings(last_conversation=conv.id)
    settings_mod.save(settings)
    return settings


def test_a_last_chat_that_cannot_be_drawn_is_skipped_with_a_notice(home, qtbot):
    from ui.main_window import MainWindow
    settings = unreadable_last_chat()
    window = MainWindow(worker=QtWorker(), settings=settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: any("“fast chat” could not be shown" in t for t in message_boxes(window)))
    assert window.controller.conversation_id is None and window.chat_view.messages == []
    assert [c.title for c in window.store.conversations()] == ["fast chat"]
    window.close()
    assert settings_mod.load().last_conversation is None      # the next start does not try it again


def test_the_app_starts_and_quits_cleanly_with_that_chat_last_on_screen(home):
    """`python -m dflash_desktop` as a user starts it: the start used to exit 1 with a traceback, every time."""
    from tests.ui_fixtures import run_app_briefly
    unreadable_last_chat()
    out = run_app_briefly(home)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "could not be shown" in out.stderr   # the log says why
