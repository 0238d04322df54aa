"""The window from 800x600 to 2560x1440 at font sizes 9 and 16, with a real answer and its stats: no
visible label is cut (each one's text fits its width, a wrapped one its height), the chat keeps room,
the toolbar hides what does not fit (the menu bar carries every action); size, splitter and the last chat
come back at the next start; keyboard: Tab leaves the message box, Ctrl+Tab inserts a tab, every action
has a shortcut in a menu, the per-message actions are reachable with Tab."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QLabel, QToolButton

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from ui import theme
from ui.message_widget import MessageWidget

from .ui_chat_fixtures import answer_question, chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401


def cut_labels(window) -> list[str]:
    """Visible labels whose text does not fit: wider than the label (one line) or taller (wrapped)."""
    bad = []
    for label in window.findChildren(QLabel):
        if not label.isVisible() or not label.text() or label.width() <= 0:
            continue
        if label.wordWrap():
            need = label.heightForWidth(label.width())
            if need > label.height() + 1:
                bad.append(f"{label.objectName() or label.accessibleName()}: {label.text()[:40]!r} needs {need} px "
                           f"high, has {label.height()}")
        elif label.sizeHint().width() > label.width() + 1:
            bad.append(f"{label.objectName() or label.accessibleName()}: {label.text()[:40]!r} needs "
                       f"{label.sizeHint().width()} px wide, has {label.width()}")
    return bad


@pytest.mark.parametrize("font_size", [9, 16])
def test_no_label_is_cut_from_800x600_to_2560x1440(qtbot, home, chat_worker, echo_pair, font_size):
    app = QApplication.instance()
    old_font = app.font()
    theme.apply(app, "light", font_size)
    try:
        window = make_window(qtbot, chat_worker, echo_pair,
                             settings_mod.Settings(max_new_tokens=24, draft_cutoff=0.0, font_size=font_size))
        send_and_wait(qtbot, window, "def f(x):")
        window.session.record_baseline(window.session.baseline())   # a figure in every metric
        for size in ((800, 600), (1024, 700), (2560, 1440)):
            window.resize(*size)
            qtbot.waitUntil(lambda: window.size().toTuple() == size)
            QApplication.processEvents()
            assert cut_labels(window) == [], (size, font_size)
            assert window.chat_view.width() >= window.width() // 2, "the chat keeps at least half the window"
            bar = window.toolbar
            for action in bar.actions():
                w = bar.widgetForAction(action)
                if w is not None and w.isVisible() and not action.isSeparator():
                    assert bar.rect().contains(w.geometry()), f"{action.text()} is cut at {size}"
            hidden = [a for a in bar.actions() if bar.widgetForAction(a) is not None and not a.isSeparator()
                      and not bar.widgetForAction(a).isVisible()]
            more = bar.findChild(QToolButton, "qt_toolbar_ext_button")
            assert not hidden or (more.isVisible() and bar.rect().contains(more.geometry())), "no » for hidden items"
            menu_actions = {a for m in window.menus.values() for a in m.actions()}
            assert all(a in menu_actions for a in bar.actions() if not a.isSeparator())
        assert window.sidebar.isVisible()          # room again at 2560: the chats list is back
        window.resize(800, 600)
        qtbot.waitUntil(lambda: window.sidebar.isHidden())
        window.sidebar_action.trigger()            # the user may still open it
        assert window.sidebar.isVisible()
    finally:
        app.setFont(old_font)
        theme.apply(app, "light", old_font.pointSize())


def test_size_splitter_and_last_chat_come_back(qtbot, home, chat_worker, echo_pair):
    settings = settings_mod.Settings(max_new_tokens=8, draft_cutoff=0.0)
    store = ChatStore(home / "chats.sqlite3")
    window = make_window(qtbot, chat_worker, echo_pair, settings, store=store)
    send_and_wait(qtbot, window, "a = ")
    first = window.controller.conversation_id
    window.new_chat_action.trigger()
    send_and_wait(qtbot, window, "b = ")
    window.controller.open_conversation(first)
    window.splitter.setSizes([300, 600])
    window.resize(790, 590)      # the offscreen screen is 800x600: a restored window is kept on screen
    qtbot.waitUntil(lambda: window.size().toTuple() == (790, 590))
    splitter_state = bytes(window.splitter.saveState().toBase64()).decode()
    window.close()
    saved = settings_mod.load()
    assert saved.last_conversation == first and saved.window_geometry and saved.splitter_state == splitter_state
    from ui.main_window import MainWindow
    again = MainWindow(worker=chat_worker, store=ChatStore(home / "chats.sqlite3"), settings=saved, autoload=False)
    qtbot.addWidget(again)
    assert bytes(again.splitter.saveState().toBase64()).decode() == splitter_state
    again.show()
    qtbot.waitUntil(lambda: again.size().toTuple() == (790, 590))
    assert again.controller.conversation_id == first
    assert again.chat_view.messages[0].text == "a = "
    assert again.sidebar.selected_id() == first


def test_keyboard_tab_leaves_the_box_and_every_action_has_a_shortcut(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    box = window.chat_view.input
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    qtbot.keyClick(box, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert box.toPlainText() == "\t"
    qtbot.keyClick(box, Qt.Key.Key_Tab)
    assert not box.hasFocus() and box.toPlainText() == "\t"
    box.clear()
    for name, menu in window.menus.items():
        for action in menu.actions():
            if not action.isSeparator() and action is not window.about_action:
                assert not action.shortcut().isEmpty(), f"{name} > {action.text()} has no shortcut"
    assert window.quit_action.shortcut().toString() == "Ctrl+Q"
    assert set(window.menus) == {"File", "Edit", "View", "Model", "Help"}
    send_and_wait(qtbot, window, "c = ")
    # the per-message actions: shortcuts on the newest message, and Tab reaches each button
    QGuiApplication.clipboard().clear()
    window.copy_answer_action.trigger()
    answer = [w for w in window.chat_view.messages if isinstance(w, MessageWidget) and w.role == "assistant"][-1]
    assert QGuiApplication.clipboard().text() == answer.text
    window.copy_code_action.trigger()
    assert QGuiApplication.clipboard().text() == answer.code_blocks[-1]
    reached = set()
    window.chat_view.input.setFocus()
    for _ in range(60):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        w = QApplication.focusWidget()
        if isinstance(w, QToolButton) and w.objectName() == "msgAction":
            reached.add((id(w.parent()), w.text()))
    assert {t for _, t in reached} >= {"Copy", "Edit", "Regenerate"}
    with qtbot.waitSignal(window.controller.answerFinished, timeout=60_000):
        window.regenerate_action.trigger()
        answer_question(window, "Regenerate anyway")   # greedy: asked first
    window.edit_last_action.trigger()
    user = [w for w in window.chat_view.messages if isinstance(w, MessageWidget) and w.role == "user"][-1]
    assert user.editor is not None


def test_tab_reads_the_window_in_order_and_the_status_bar_comes_last(qtbot, home, chat_worker, echo_pair):
    """From Send, Tab goes to the stats panel, then the status bar's server switch, then round to the model bar
    and the chats list: never to the status bar before the messages."""
    window = make_window(qtbot, chat_worker, echo_pair)
    send_and_wait(qtbot, window, "def f(x):")

    def chain(start, steps: int) -> list:
        out, w = [], start
        while len(out) < steps:
            w = w.nextInFocusChain()
            if w.isVisible() and w.isEnabled() and w.focusPolicy() & Qt.FocusPolicy.TabFocus:
                out.append(w)
        return out
    after_send = chain(window.chat_view.send_button, 12)
    order = [after_send.index(w) for w in (window.stats_panel.remeasure_button, window.server_status.switch,
                                           window.model_bar.switch_button, window.sidebar.new_button)]
    assert order == sorted(order), [type(w).__name__ for w in after_send]
    answer = next(w for w in window.chat_view.messages if isinstance(w, MessageWidget) and w.role == "assistant")
    before_input = chain(window.model_bar.switch_button, 30)
    assert before_input.index(answer.copy_button) < before_input.index(window.chat_view.input) < \
        before_input.index(window.server_status.switch)
