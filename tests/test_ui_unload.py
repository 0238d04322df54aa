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
