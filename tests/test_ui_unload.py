"""Model > Unload frees the model in the real worker (the worker itself says nothing is loaded), the status
bar says so with the engine process's memory before and after, and the next message loads it again; the
ready line gives the wait the user really had."""
from __future__ import annotations

import re

from .ui_chat_fixtures import ANSWER_TIMEOUT_MS, chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401


def test_unload_frees_the_pair_and_the_next_message_loads_it_again(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    assert re.search(r"ready \d+\.\d s after you asked; reading the model took \d+\.\d s", window.session.ready_text)
    with qtbot.waitSignal(window.session.pairUnloaded, timeout=ANSWER_TIMEOUT_MS):
        window.unload_action.trigger()
    assert chat_worker.pair_info is None and window.session.loaded is None          # the worker's own answer
    assert window.status_label.text().startswith("Model unloaded: its memory is freed.")
    assert re.search(r"went from [\d,]+ MB to [\d,]+ MB", window.status_label.text())
    assert window.pair_label.text().endswith("unloaded")
    done = send_and_wait(qtbot, window, "def g():")
    assert done["event"] == "done" and chat_worker.pair_info is not None


def test_a_failed_load_keeps_the_model_that_was_working(qtbot, home, chat_worker, echo_pair, tmp_path):
    """Opening a folder that is not a model while a chat runs: a dialog says so and that the loaded model is
    still there; nothing lands in the chat, and the next message is answered by the model loaded before."""
    from ui.errors import ErrorBubble
    window = make_window(qtbot, chat_worker, echo_pair)
    send_and_wait(qtbot, window, "def f(x):")
    before = window.pair_label.text().split(",")[0]       # name, engine and device (the memory may move)
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": "big"}')
    window.load_pair({"id": f"local:{broken}", "name": "not-a-model", "target_dir": str(broken),
                      "plan": {"engine": "torch", "device": "auto", "dtype": None}})
    qtbot.waitUntil(lambda: window.load_error_box is not None, timeout=ANSWER_TIMEOUT_MS)
    box = window.load_error_box
    assert box.isVisible() and box.text() == "Could not load not-a-model."
    assert "Echo test pair is still loaded" in box.informativeText()
    assert window.session.ready and window.session.pair.id == "echo" and window.pair_label.text().startswith(before)
    assert chat_worker.pair_info["target"] == echo_pair["target_dir"]        # the worker's own answer
    assert not any(isinstance(w, ErrorBubble) for w in window.chat_view.messages)
    assert window.status_label.text().startswith("Could not load not-a-model")
    box.close()
    assert window.status_label.text() == window.session.ready_text != ""   # not the error, once the dialog is read
    done = send_and_wait(qtbot, window, "def g(y):")
    assert done["event"] == "done" and window.chat_view.messages[-1].role_label.text().startswith("Echo test pair")


def test_my_models_remember_a_model_opened_from_disk_across_a_restart(qtbot, home, chat_worker, echo_pair):
    """The model bar's menu: a pair opened from disk is there after the app starts again, named, with its path,
    checked while loaded, and one click loads it; a model whose files went away is shown but cannot be chosen."""
    from dflash_desktop import settings as settings_mod
    from ui.main_window import MainWindow
    opened = {**echo_pair, "id": f"local:{echo_pair['target_dir']}", "name": "My echo"}
    window = make_window(qtbot, chat_worker, opened)
    window.close()                                            # saves the settings, as quitting does
    settings = settings_mod.load()
    assert settings.recent_pairs[0]["id"] == opened["id"]
    settings.recent_pairs.append({"id": "local:/gone", "name": "Gone", "target_dir": "/no/such/folder"})
    again = MainWindow(worker=chat_worker, settings=settings, autoload=False)
    qtbot.addWidget(again)
    again.show()
    bar = again.model_bar
    bar.menu.aboutToShow.emit()                               # what opening the menu fills in
    actions = {a.text(): a for a in bar.menu.actions() if a.text()}
    assert "My echo" in actions and actions["My echo"].toolTip() == echo_pair["target_dir"]
    assert not actions["Gone  (files missing)"].isEnabled()
    from ui.main_window import demo_pair
    builtin = demo_pair()
    assert builtin is None or builtin.name in actions         # the built-in pairs come first
    with qtbot.waitSignal(again.session.pairLoaded, timeout=ANSWER_TIMEOUT_MS):
        actions["My echo"].trigger()
    assert again.session.pair.id == opened["id"] and again.pair_label.text().startswith("My echo  ·  torch on cpu")
    bar.menu.aboutToShow.emit()
    assert next(a for a in bar.menu.actions() if a.text() == "My echo").isChecked()
