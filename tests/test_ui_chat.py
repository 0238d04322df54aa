"""The chat window driven through its real widgets against a real worker (echo pair, see
ui_chat_fixtures): send, stream, footer, stats, highlight, stop, regenerate, edit, new/delete chat,
persistence, settings, shortcuts, and a worker killed mid-answer. The kill test runs last."""
from __future__ import annotations

import os
import signal

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QApplication, QLineEdit, QMessageBox

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.pairs import PairRequest
from ui.errors import ErrorBubble
from ui.message_widget import MessageWidget

from .ui_chat_fixtures import (ANSWER_TIMEOUT_MS, answer_question, assert_sampled_length,  # noqa: F401
                               chat_worker, echo_pair, home, make_window, send_and_wait)


def answers(window) -> list[MessageWidget]:
    return [w for w in window.chat_view.messages if isinstance(w, MessageWidget) and w.role == "assistant"]


def drafted_backgrounds(widget: MessageWidget) -> set[bool]:
    """For each character of the rendered answer: is it tinted as drafted?"""
    doc = widget.browser.document()
    seen = set()
    cursor = QTextCursor(doc)
    for pos in range(1, doc.characterCount()):
        cursor.setPosition(pos)
        seen.add(bool(cursor.charFormat().property(QTextCharFormat.Property.UserProperty)))
    return seen


def test_send_streams_answer_with_footer_stats_and_calibrated_baseline(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    baseline = window.session.baseline()
    assert baseline is not None and baseline.tok_s > 0 and baseline.tokens == 64
    assert "plain decoding of the same target" in window.stats_panel.baseline_note.text()
    streamed: list[str] = []
    chat_worker.tokens.connect(lambda ev: streamed.append("".join(s[0] for s in ev["spans"])))
    done = send_and_wait(qtbot, window, "def f(x):")
    assert done["event"] == "done" and done["stop_reason"] == "length"
    assert streamed and "".join(streamed) == done["text"]
    answer = answers(window)[-1]
    assert answer.text == done["text"] != ""
    # a model without a chat template continues code: the answer renders after its prompt as one code block
    assert answer.code_blocks == ["def f(x):" + done["text"]]
    assert answer.browser.toPlainText() == "Copy code\ndef f(x):" + done["text"]
    stats = done["stats"]
    footer = answer.footer.text()
    assert f"{stats['decode_tok_s']:.1f} tok/s" in footer and f"{stats['generated_tokens']} tokens" in footer
    assert f"τ {stats['tau']:.2f}" in footer and "max tokens" in footer
    # the stats panel shows exactly the done event's numbers
    values = window.stats_panel.values
    assert values["dflash_tok_s"] == stats["decode_tok_s"] and values["tau"] == stats["tau"]
    assert values["acceptance_rate"] == stats["acceptance_rate"]
    assert values["position_rates"] == stats["position_rates"] and values["histogram"] == stats["histogram"]
    assert values["speedup"] == pytest.approx(stats["decode_tok_s"] / baseline.tok_s)
    assert window.stats_panel.tau_label.text() == f"{stats['tau']:.2f}"
    assert stats["tau"] > 4  # the echo pair accepts every draft
    # stored with its stats
    conv = window.store.conversations()[0]
    stored = window.store.messages(conv.id)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[0].content == "def f(x):"
    assert stored[1].content == done["text"] and stored[1].stop_reason == "length"
    measured = {k: stored[1].stats[k] for k in ("cpu_other", "cpu_wall_s")}   # + what the window measured
    model = stored[1].stats["model"]                                              # + who wrote it
    assert stored[1].stats == {**stats, **measured, "model": model} and 0 <= measured["cpu_other"] <= 1
    assert model == {"id": "echo", "name": "Echo test pair", "engine": "torch", "device": "cpu", "dtype": "float32",
                     "has_drafter": True, "chat": False, "baseline_key": window.session.baseline_key}
    assert stats["method"] == "dflash" and answer.role_label.text() == "Echo test pair  ·  DFlash"
    assert conv.title == "def f(x):"


def test_highlight_toggle_tints_drafted_text(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=24,
                                                                                highlight_drafted=False))
    send_and_wait(qtbot, window, "x = ")
    answer = answers(window)[-1]
    assert any(drafted for _, drafted in answer.spans) and not all(d for _, d in answer.spans)
    assert drafted_backgrounds(answer) == {False}
    window.highlight_action.trigger()
    assert window.highlight_action.isChecked()
    assert drafted_backgrounds(answer) == {True, False}
    drafted_chars = sum(len(t) for t, d in answer.spans if d)
    doc, cursor, tinted = answer.browser.document(), QTextCursor(answer.browser.document()), 0
    for pos in range(1, doc.characterCount()):
        cursor.setPosition(pos)
        tinted += bool(cursor.charFormat().property(QTextCharFormat.Property.UserProperty))
    assert tinted == drafted_chars
    window.highlight_action.trigger()
    assert drafted_backgrounds(answer) == {False}
    assert settings_mod.load().highlight_drafted is False


def test_stop_mid_generation_keeps_partial_answer(qtbot, home, chat_worker, echo_pair):
    # the echo pair repeats one token: a loop guard would end its long answer early
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=1500,
                                                                              block_size=2, loop_guard=0))
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.keyClicks(window.chat_view.input, "a")
        qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: bool(answers(window)) and bool(answers(window)[-1].text), timeout=ANSWER_TIMEOUT_MS)
        assert window.chat_view.send_button.text() == "Stop"
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    done = blocker.args[0]
    assert done["stop_reason"] == "cancelled" and 0 < done["stats"]["generated_tokens"] < 1500
    assert "stopped" in answers(window)[-1].footer.text()
    assert window.chat_view.send_button.text() == "Send"
    stored = window.store.messages(window.controller.conversation_id)[-1]
    assert stored.stop_reason == "cancelled" and stored.content == done["text"]


def visible_question(window) -> QMessageBox | None:
    return next((b for b in window.findChildren(QMessageBox) if b.isVisible()), None)


def test_regenerate_and_edit_keep_versions_browsed_by_keyboard_and_kept_after_a_restart(
        qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=8))
    send_and_wait(qtbot, window, "first")
    conv_id = window.controller.conversation_id
    first = window.store.messages(conv_id)[-1]
    answer = answers(window)[-1]
    assert answer.regenerate_button.isVisibleTo(window) and not answer.next_button.isVisibleTo(window)

    # greedy: the user is told it gives the same answer; Cancel changes nothing
    qtbot.mouseClick(answer.regenerate_button, Qt.MouseButton.LeftButton)
    question = visible_question(window)
    assert question is not None and "gives the same answer again" in question.text()
    answer_question(window, "Cancel")
    assert window.store.message(first.id).versions is None and not window.controller.generating
    # sampling this once: a second version of the same message, the first kept
    qtbot.mouseClick(answer.regenerate_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS):
        answer_question(window, "Sample at temperature 0.7")
    stored = window.store.messages(conv_id)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[-1].id == first.id
    assert stored[-1].version == 1 and stored[-1].versions[0]["content"] == first.content
    assert stored[-1].content != first.content    # sampled: the echo pair's flat logits give other tokens
    assert_sampled_length(stored[-1].stats["generated_tokens"], stored[-1].stop_reason, 8)
    assert len(answers(window)) == 1
    assert answers(window)[-1].version_label.text() == "2/2" and answers(window)[-1].previous_button.isEnabled()

    # edit-and-resend: a third version, answering the edited question
    user = window.chat_view.messages[0]
    qtbot.mouseClick(user.edit_button, Qt.MouseButton.LeftButton)
    assert user.editor is not None
    user.editor.setPlainText("second, a much longer question than the first one was")
    send = next(b for b in user.findChildren(type(window.chat_view.send_button)) if b.text() == "Send")
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(send, Qt.MouseButton.LeftButton)
    stored = window.store.messages(conv_id)
    assert [(m.role, m.content) for m in stored][0] == ("user", "second, a much longer question than the first one was")
    assert len(stored) == 2 and len(stored[-1].versions) == 3
    qtbot.waitUntil(lambda: len(window.chat_view.messages) == 2, timeout=5000)
    assert answers(window)[-1].version_label.text() == "3/3"

    # back to version 1 with the keyboard: the question it answered comes back, the focus stays on the arrows
    previous = answers(window)[-1].previous_button
    assert previous.accessibleName() and previous.toolTip() and previous.focusPolicy() & Qt.FocusPolicy.TabFocus
    window.activateWindow()    # the question box had the focus
    qtbot.waitUntil(window.isActiveWindow)
    previous.setFocus()
    qtbot.keyClick(previous, Qt.Key.Key_Space)
    assert answers(window)[-1].version_label.text() == "2/3" and QApplication.focusWidget() is previous
    qtbot.keyClick(previous, Qt.Key.Key_Space)
    shown = answers(window)[-1]
    assert shown.version_label.text() == "1/3" and shown.text == first.content
    assert window.chat_view.messages[0].text == "first" and QApplication.focusWidget() is shown.next_button
    # the shown version is what later turns are sent with
    short = send_and_wait(qtbot, window, "more")["stats"]["prompt_tokens"]
    assert [m.content for m in window.store.messages(conv_id)[:2]] == ["first", first.content]
    window.controller.show_version(first.id, 2)
    assert window.chat_view.messages[0].text.startswith("second")
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as rewritten:
        window.regenerate_action.trigger()
        answer_question(window, "Regenerate anyway")
        window.controller.show_version(first.id, 0)     # refused while an answer is being written
        assert window.store.message(first.id).version == 2 and "Wait for the answer" in window.status_label.text()
    assert rewritten.args[0]["stats"]["prompt_tokens"] > short   # sent with the longer question
    more = window.store.messages(conv_id)[-1]
    assert more.versions[1]["content"] == more.versions[0]["content"] != ""     # greedy: the same text again
    window.close()

    again = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=8),
                        store=ChatStore(), wait_ready=False)
    again.controller.open_conversation(conv_id)
    restored = answers(again)[0]
    assert restored.version_label.text() == "3/3"
    qtbot.waitUntil(lambda: restored.previous_button.isVisibleTo(again))   # the layout shows new bubbles next turn
    assert again.chat_view.messages[0].text == "second, a much longer question than the first one was"
    answers(again)[-1].copy_button.click()
    assert QGuiApplication.clipboard().text() == again.store.messages(conv_id)[-1].content


def test_new_and_delete_chat_and_persistence(qtbot, home, chat_worker, echo_pair, monkeypatch):
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=4))
    window.chat_view.system_prompt.setText("You write Python.")
    window.chat_view.system_prompt.editingFinished.emit()
    send_and_wait(qtbot, window, "one")
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.controller.conversation_id is None and window.chat_view.empty.isVisibleTo(window)
    send_and_wait(qtbot, window, "two")
    titles = [c.title for c in window.store.conversations()]
    assert titles == ["two", "one"] and window.sidebar.model.rowCount() == 2
    assert window.store.conversations()[1].system_prompt == "You write Python."

    # rename "one" in place with F2: saved, shown, and the order stays
    window.sidebar.view.setCurrentIndex(window.sidebar.model.index(1))
    qtbot.keyClick(window.sidebar.view, Qt.Key.Key_F2)
    editor = window.sidebar.view.findChild(QLineEdit)
    assert editor is not None and editor.text() == "one"
    editor.selectAll()
    qtbot.keyClicks(editor, "Python helpers")
    qtbot.keyClick(editor, Qt.Key.Key_Return)   # the view commits on its next event loop turn
    qtbot.waitUntil(lambda: [c.title for c in window.store.conversations()] == ["two", "Python helpers"])
    assert window.sidebar.model.index(1).data() == "Python helpers"

    # delete "two" after confirming
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    window.sidebar.view.setCurrentIndex(window.sidebar.model.index(0))
    qtbot.mouseClick(window.sidebar.delete_button, Qt.MouseButton.LeftButton)
    assert [c.title for c in window.store.conversations()] == ["Python helpers"]
    # cancelling the confirmation deletes nothing
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    window.sidebar.confirm_delete(window.store.conversations()[0].id)
    assert len(window.store.conversations()) == 1
    window.close()

    # a new window on the same home finds the conversation, messages and stats
    again = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=4), store=ChatStore(),
                        wait_ready=False)
    assert again.sidebar.model.rowCount() == 1
    index = again.sidebar.model.index(0)
    qtbot.mouseClick(again.sidebar.view.viewport(), Qt.MouseButton.LeftButton,
                     pos=again.sidebar.view.visualRect(index).center())
    assert [w.role for w in again.chat_view.messages] == ["user", "assistant"]
    assert again.chat_view.system_prompt.text() == "You write Python."
    assert "tok/s" in again.chat_view.messages[1].footer.text()
    qtbot.waitUntil(lambda: again.session.ready, timeout=60_000)


def test_settings_dialog_validates_and_applies(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    dialogs = []
    window.settings_action.triggered.connect(lambda: dialogs.append(window.findChildren(
        __import__("ui.settings_dialog", fromlist=["SettingsDialog"]).SettingsDialog)[-1]))
    qtbot.keyClick(window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    assert dialogs, "Ctrl+, did not open the settings"
    dialog = dialogs[-1]
    assert dialog.block_size.maximum() == 8   # the drafter's block size from pair_info
    assert dialog.temperature.maximum() == 2.0 and "greedy" in dialog.temperature.toolTip()   # the limits table
    dialog.top_p.setValue(0.0)
    dialog.accept()
    assert dialog.isVisible() and "Top-p must be above 0 and at most 1" in dialog.error.text()
    dialog.top_p.setValue(1.0)
    dialog.plain_fallback.setChecked(False)
    dialog.temperature.setValue(0.7)
    dialog.top_k.setValue(40)
    dialog.block_size.setValue(4)
    dialog.theme.setCurrentIndex(2)   # dark
    assert dialog.draft_cutoff.value() == 0.0 and dialog.draft_cutoff.text() == "0.00"
    dialog.draft_cutoff.setValue(0.1)
    dialog.accept()
    assert not dialog.isVisible()
    saved = settings_mod.load()
    assert (saved.temperature, saved.top_k, saved.block_size, saved.theme) == (0.7, 40, 4, "dark")
    assert window.settings.generation(8) == {"temperature": 0.7, "top_p": 1.0, "top_k": 40, "max_new_tokens": 24,
                                             "min_p": 0.05, "repeat_penalty": 1.1, "loop_guard": 64,
                                             "block_size": 4, "draft_cutoff": 0.1, "plain_fallback": False}
    done = send_and_wait(qtbot, window, "y")
    assert done["stats"]["block_size"] == 4
    # its lowest step reads "automatic" and gives the choice back to the engine
    window.settings_action.trigger()
    dialog = dialogs[-1]
    assert dialog.draft_cutoff.value() == 0.1
    dialog.draft_cutoff.setValue(dialog.draft_cutoff.minimum())
    assert dialog.draft_cutoff.text() == "automatic"
    dialog.accept()
    assert settings_mod.load().draft_cutoff is None and "draft_cutoff" not in window.settings.generation(8)


def test_shortcuts_trigger_their_actions(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair, wait_ready=False)
    expected = {"new_chat_action": "Ctrl+N", "models_action": "Ctrl+M", "demo_action": "Ctrl+D",
                "settings_action": "Ctrl+,", "stop_action": "Esc", "send_action": "Ctrl+Return"}
    for name, keys in expected.items():
        assert getattr(window, name).shortcut().toString() == keys, name
    # Shift+Enter adds a line; it does not send
    sent = []
    window.chat_view.sendRequested.connect(sent.append)
    qtbot.keyClicks(window.chat_view.input, "a")
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.chat_view.input, "b")
    assert window.chat_view.input.toPlainText() == "a\nb" and sent == []
    window.chat_view.input.clear()
    fired = []
    window.demo_action.toggled.connect(lambda on: fired.append(on))
    qtbot.keyClick(window, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
    assert fired == [True] and window.stack.currentWidget() is window.demo
    qtbot.keyClick(window, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
    assert window.stack.currentWidget() is window.chat_view
    qtbot.keyClick(window, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)   # a new chat leaves the demo
    assert window.stack.currentWidget() is window.chat_view and not window.demo_action.isChecked()
    # every toolbar button and chat control has an accessible name
    from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QLineEdit, QPlainTextEdit
    controls = [w for kind in (QAbstractButton, QLineEdit, QPlainTextEdit, QAbstractSpinBox)
                for w in window.findChildren(kind)]
    assert len(controls) > 10
    for widget in controls:
        if widget.isVisibleTo(window) and not widget.objectName().startswith("qt_") and not (
                window.demo and window.demo.isAncestorOf(widget)):   # the demo widget has its own tests
            assert widget.accessibleName(), f"{type(widget).__name__} {widget.objectName()!r} has no accessible name"
    qtbot.waitUntil(lambda: window.session.ready, timeout=60_000)


def test_models_action_opens_picker_and_loads_the_chosen_pair(qtbot, home, chat_worker, echo_pair):
    from ui.model_picker import ModelPicker
    window = make_window(qtbot, chat_worker, echo_pair)
    qtbot.keyClick(window, Qt.Key.Key_M, Qt.KeyboardModifier.ControlModifier)
    pickers = window.findChildren(ModelPicker)
    assert len(pickers) == 1 and pickers[0].isVisible()
    chosen = {**echo_pair, "id": "echo-again", "name": "Echo again"}
    with qtbot.waitSignal(window.session.pairLoaded, timeout=60_000):
        pickers[0].pairChosen.emit(chosen)
    qtbot.waitUntil(lambda: window.session.ready, timeout=60_000)
    assert window.session.pair == PairRequest.of(chosen)
    assert PairRequest.of(settings_mod.load().last_pair) == window.session.pair
    assert window.session.baseline() is not None   # a new pair gets its own baseline
    pickers[0].reject()


def test_worker_killed_mid_answer_shows_error_and_keeps_conversation(qtbot, home, chat_worker, echo_pair):
    """Runs last in this module: it kills the shared worker."""
    # the echo pair repeats one token: a loop guard would end its long answer early
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=1500,
                                                                              block_size=2, loop_guard=0))
    send_and_wait(qtbot, window, "kept")   # an earlier exchange that must survive
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.keyClicks(window.chat_view.input, "b")
        qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: bool(answers(window)[-1].text), timeout=ANSWER_TIMEOUT_MS)
        os.kill(chat_worker.client.pid, signal.SIGKILL)
    error = blocker.args[0]
    assert error["event"] == "error" and error["code"] == "worker_crashed" and error["signal"] == "SIGKILL"
    bubble = next(w for w in window.chat_view.messages if isinstance(w, ErrorBubble))
    assert "killed" in bubble.message.text()
    bubble.copy_button.click()
    diagnostics = QGuiApplication.clipboard().text()
    for part in ("code: worker_crashed", "signal: SIGKILL", "log: ", "PySide6: ", error["message"]):
        assert part in diagnostics
    assert "Open logs" == bubble.open_logs_button.text()
    assert "Error:" in window.status_label.text()
    stored = window.store.messages(window.controller.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[1].stop_reason == "length" and stored[3].stop_reason == "error"
    assert stored[3].error["code"] == "worker_crashed" and stored[3].content == answers(window)[-1].text
    assert window.chat_view.send_button.text() == "Send"


def test_the_edit_box_sends_with_enter_and_closes_with_escape(qtbot, home, chat_worker, echo_pair):
    """Ctrl+Shift+E edits the newest message from the keyboard: Esc leaves it as it was, Enter sends the
    edited text (Shift+Enter adds a line), and the answer is written again as a new version."""
    window = make_window(qtbot, chat_worker, echo_pair)
    send_and_wait(qtbot, window, "first")
    user = window.chat_view.messages[0]
    qtbot.keyClick(window, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert user.editor is not None
    qtbot.waitUntil(lambda: QApplication.focusWidget() is user.editor, timeout=2000)   # ready to type in
    qtbot.keyClick(user.editor, Qt.Key.Key_Escape)
    assert user.editor is None and user.text == "first" and window.controller.generating is False
    window.edit_last_action.trigger()
    user.editor.selectAll()
    qtbot.keyClicks(user.editor, "second")
    qtbot.keyClick(user.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(user.editor, "line")
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.keyClick(user.editor, Qt.Key.Key_Return)
    stored = window.store.messages(window.controller.conversation_id)
    assert stored[0].content == "second\nline" and len(stored[1].versions) == 2
