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
    before = window.pair_label.text()
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": "big"}')
    window.load_pair({"id": f"local:{broken}", "name": "not-a-model", "target_dir": str(broken),
                      "plan": {"engine": "torch", "device": "auto", "dtype": None}})
    qtbot.waitUntil(lambda: window.load_error_box is not None, timeout=ANSWER_TIMEOUT_MS)
    box = window.load_error_box
    assert box.isVisible() and box.text() == "Could not load not-a-model."
    assert "Echo test pair is still loaded" in box.informativeText()
    assert window.session.ready and window.session.pair.id == "echo" and window.pair_label.text() == before
    assert chat_worker.pair_info["target"] == echo_pair["target_dir"]        # the worker's own answer
    assert not any(isinstance(w, ErrorBubble) for w in window.chat_view.messages)
    box.close()
    done = send_and_wait(qtbot, window, "def g(y):")
    assert done["event"] == "done" and window.chat_view.messages[-1].role_label.text().startswith("Echo test pair")
