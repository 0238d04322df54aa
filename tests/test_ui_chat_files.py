"""The chats list's search, export and import from the window, and per-chat settings, driven through the real
widgets (a real worker answers where the settings must reach it): see ui_chat_fixtures."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from ui.chat_settings_dialog import ChatSettingsDialog

from .ui_chat_fixtures import assert_sampled_length, chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401


def visible_messages(window) -> list[str]:
    return [b.text() for b in window.findChildren(QMessageBox) if b.isVisible()]


def listed(window) -> list[str]:
    model = window.sidebar.model
    return [model.index(row).data() for row in range(model.rowCount())]


def filled_store(tmp_path) -> ChatStore:
    store = ChatStore(tmp_path / "chats.sqlite3")
    sorting = store.create_conversation("Sorting lists")
    store.add_message(sorting.id, "user", "how?")
    answer = store.add_message(sorting.id, "assistant", "use sorted()", stats={"tau": 2.0}, stop_reason="eos")
    store.new_version(answer.id, "how?")
    store.update_message(answer.id, content="list.sort() works in place", stats={"tau": 3.0}, stop_reason="eos")
    other = store.create_conversation("Regular expressions")
    store.add_message(other.id, "user", "match a date like 2024-01-31")
    return store


def test_search_filters_titles_and_text_live_ctrl_f_focuses_and_escape_clears(qtbot, home, chat_worker, echo_pair,
                                                                                tmp_path):
    window = make_window(qtbot, chat_worker, echo_pair, store=filled_store(tmp_path), wait_ready=False)
    assert listed(window) == ["Regular expressions", "Sorting lists"]
    qtbot.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    search = window.sidebar.search
    assert QApplication.focusWidget() is search and search.accessibleName() and search.toolTip()
    qtbot.keyClicks(search, "SORT")
    assert listed(window) == ["Sorting lists"]                # a title, ignoring case
    search.clear()
    qtbot.keyClicks(search, "2024-01")
    assert listed(window) == ["Regular expressions"]          # message text
    search.clear()
    qtbot.keyClicks(search, "sorted()")
    assert listed(window) == ["Sorting lists"]                # an earlier version of an answer
    qtbot.keyClicks(search, " nowhere")
    assert listed(window) == [] and window.sidebar.no_match.isVisibleTo(window)
    assert "sorted() nowhere" in window.sidebar.no_match.text()
    qtbot.keyClick(search, Qt.Key.Key_Escape)
    assert search.text() == "" and listed(window) == ["Regular expressions", "Sorting lists"]
    assert not window.sidebar.no_match.isVisibleTo(window)


def test_export_and_import_from_the_window_round_trip_and_refuse_a_bad_file(qtbot, home, chat_worker, echo_pair,
                                                                           tmp_path):
    store = filled_store(tmp_path)
    window = make_window(qtbot, chat_worker, echo_pair, store=store, wait_ready=False)
    assert window.export_chat(tmp_path / "none.json") is None and "Nothing to export" in window.status_label.text()
    assert not (tmp_path / "none.json").exists()
    sorting = next(c for c in store.conversations() if c.title == "Sorting lists")
    window.controller.open_conversation(sorting.id)
    assert window.export_action in window.menus["File"].actions() and window.import_action.shortcut().toString()

    markdown = window.export_chat(tmp_path / "sorting.md")
    assert "list.sort() works in place" in markdown.read_text(encoding="utf-8")
    exported = window.export_chat(tmp_path / "sorting.json")
    assert json.loads(exported.read_text(encoding="utf-8"))["messages"][1]["versions"][0]["content"] == "use sorted()"

    imported = window.import_chat(exported)
    assert imported is not None and len(store.conversations()) == 3
    assert window.controller.conversation_id == imported.id and "Imported" in window.status_label.text()
    answer = [w for w in window.chat_view.messages if w.role == "assistant"][0]
    assert answer.version_label.text() == "2/2" and answer.text == "list.sort() works in place"

    data = json.loads(exported.read_text(encoding="utf-8"))
    data["messages"][0]["role"] = "admin"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    assert window.import_chat(bad) is None
    shown = visible_messages(window)
    assert any("bad.json" in text and "'admin'" in text and "Nothing was added" in text for text in shown)
    assert len(store.conversations()) == 3

    missing_folder = tmp_path / "no such folder" / "chat.md"
    assert window.export_chat(missing_folder) is None
    assert any("could not be exported" in text and "no such folder" in text for text in visible_messages(window))


def test_a_chat_overrides_max_tokens_shows_it_and_resets_to_global(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=8))
    header = window.chat_view.chat_settings
    assert header.text() == "Chat settings" and "global" in header.toolTip()
    # chosen before the chat's first message: kept for the chat it starts
    qtbot.mouseClick(header, Qt.MouseButton.LeftButton)
    dialog = next(d for d in window.findChildren(ChatSettingsDialog) if d.isVisible())
    assert not dialog.boxes["max_new_tokens"].isEnabled() and dialog.boxes["max_new_tokens"].value() == 8
    dialog.own["max_new_tokens"].setChecked(True)
    dialog.boxes["max_new_tokens"].setValue(3)
    dialog.accept()
    assert header.text() == "Chat: max 3 tokens" and "instead of the global" in header.toolTip()
    done = send_and_wait(qtbot, window, "short")
    assert done["stats"]["generated_tokens"] == 3 and window.settings.max_new_tokens == 8
    chat = window.controller.conversation_id
    assert window.store.conversation(chat).overrides == {"max_new_tokens": 3}

    window.controller.new_chat()
    assert header.text() == "Chat settings"
    assert send_and_wait(qtbot, window, "global")["stats"]["generated_tokens"] == 8
    window.controller.open_conversation(chat)
    assert header.text() == "Chat: max 3 tokens"

    # a chat that samples regenerates without the greedy question; Ctrl+[ and Ctrl+] browse the versions
    window.controller.set_chat_overrides({"temperature": 0.5, "max_new_tokens": 3})
    assert header.text() == "Chat: temperature 0.5, max 3 tokens"
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    with qtbot.waitSignal(window.controller.answerFinished, timeout=60_000) as rewritten:
        qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
        assert not visible_messages(window)
    assert_sampled_length(rewritten.args[0]["stats"]["generated_tokens"], rewritten.args[0]["stop_reason"], 3)
    answer = [w for w in window.chat_view.messages if w.role == "assistant"][-1]
    assert answer.version_label.text() == "2/2"
    qtbot.keyClick(window, Qt.Key.Key_BracketLeft, Qt.KeyboardModifier.ControlModifier)
    assert answer.version_label.text() == "1/2" and window.store.messages(chat)[-1].version == 0
    qtbot.keyClick(window, Qt.Key.Key_BracketRight, Qt.KeyboardModifier.ControlModifier)
    assert answer.version_label.text() == "2/2"
    window.controller.new_chat()
    qtbot.keyClick(window, Qt.Key.Key_BracketLeft, Qt.KeyboardModifier.ControlModifier)
    assert "one version" in window.status_label.text()
    window.controller.open_conversation(chat)

    dialog = window.open_chat_settings()
    assert dialog.own["max_new_tokens"].isChecked() and dialog.boxes["max_new_tokens"].value() == 3
    assert dialog.own["temperature"].isChecked() and dialog.boxes["temperature"].value() == 0.5
    dialog.reset_button.click()
    assert dialog.boxes["max_new_tokens"].value() == 8 and not dialog.boxes["max_new_tokens"].isEnabled()
    assert dialog.boxes["temperature"].value() == 0.0 and not dialog.own["temperature"].isChecked()
    dialog.accept()
    assert window.store.conversation(chat).overrides == {} and header.text() == "Chat settings"
    assert "follows the global" in window.status_label.text()


def test_an_export_with_wrong_types_inside_is_refused_and_a_stored_one_does_not_stop_the_window(
        qtbot, home, chat_worker, echo_pair, tmp_path):
    """The import refuses a crafted file naming the field ("stats": {"decode_tok_s": "fast"} made the window
    raise in the footer); a chat already stored that way (an import before this check) stays closed with a
    notice, and the window goes on."""
    store = filled_store(tmp_path)
    window = make_window(qtbot, chat_worker, echo_pair, store=store, wait_ready=False)
    sorting = next(c for c in store.conversations() if c.title == "Sorting lists")
    window.controller.open_conversation(sorting.id)
    data = json.loads(window.export_chat(tmp_path / "sorting.json").read_text(encoding="utf-8"))
    data["messages"][1]["stats"] = {"decode_tok_s": "fast"}
    crafted = tmp_path / "crafted.json"
    crafted.write_text(json.dumps(data), encoding="utf-8")
    assert window.import_chat(crafted) is None
    assert any("crafted.json" in t and "stats.decode_tok_s" in t and "Nothing was added" in t
               for t in visible_messages(window))
    assert len(store.conversations()) == 2

    broken = store.create_conversation("Stored before the check")
    store.add_message(broken.id, "user", "hi")
    store.add_message(broken.id, "assistant", "hello", stats={"decode_tok_s": "fast"}, stop_reason="eos")
    window.controller.open_conversation(broken.id)
    assert window.controller.conversation_id is None and window.chat_view.messages == []
    status = window.status_label.text()
    assert "Stored before the check" in status and "could not be shown" in status
    qtbot.waitUntil(lambda: any("could not be shown" in t for t in visible_messages(window)))
    assert broken.id in [c.id for c in store.conversations()]      # kept, to delete or export
    window.controller.open_conversation(sorting.id)               # the others still open
    assert [w.text for w in window.chat_view.messages if w.role == "assistant"] == ["list.sort() works in place"]
