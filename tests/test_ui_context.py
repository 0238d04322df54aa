"""The context meter against the worker's own token count, updated as you type (debounced), and a chat that
outgrew the model's context: a normal notice offering to drop the oldest turns, which then works. Real
window, real worker (echo pair, context 2048 tokens)."""
from __future__ import annotations

import math

from PySide6.QtCore import Qt

from ui.errors import ErrorBubble

from .ui_chat_fixtures import ANSWER_TIMEOUT_MS, chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401


def send(qtbot, window, text: str) -> dict:
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        window.chat_view.input.setPlainText(text)
        window.chat_view.submit()
    return blocker.args[0]


def test_the_meter_shows_the_workers_count_and_follows_typing(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    view = window.chat_view
    limit = window.controller.pair_info["max_positions"]
    assert view.context_limit == limit and view.context_meter.text().startswith(f"0 / {limit:,} tokens")
    stats = send_and_wait(qtbot, window, "def f(x):")["stats"]
    used = stats["prompt_tokens"] + stats["generated_tokens"]      # counted by the engine
    assert view.context_used == used and view.context_meter.text().startswith(f"{used:,} / {limit:,}")
    qtbot.keyClicks(view.input, "return x + 1")
    qtbot.waitUntil(lambda: view.context_meter.text().startswith("≈"))
    assert view.context_meter.text().startswith(f"≈{used + view.typed_estimate():,} / ")
    assert view.context_meter.toolTip()
    window.new_chat_action.trigger()
    view.input.clear()
    qtbot.waitUntil(lambda: view.context_meter.text().startswith("0 / "))


def test_a_chat_too_long_for_the_context_offers_to_drop_its_oldest_turns(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    c, view = window.controller, window.chat_view
    line = "value = compute(value)\n"
    probe = send(qtbot, window, line * 10)["stats"]["prompt_tokens"]
    copies = math.ceil(1100 / (probe / 10))             # about 1,100 tokens: two of them overflow 2,048
    window.new_chat_action.trigger()
    first = send(qtbot, window, line * copies)
    assert first["event"] == "done"
    second = send(qtbot, window, "# again\n" + line * copies)
    assert second["event"] == "error" and second["code"] == "prompt_too_long"
    bubble = next(w for w in view.messages if isinstance(w, ErrorBubble))
    title = bubble.findChildren(type(view.context_meter))[0].text()
    assert title == "This chat is longer than the model can read" and "Something went wrong" not in title
    assert "drop its oldest turns" in window.status_label.text()
    assert bubble.action_button.text() == "Drop the oldest turns and retry"
    with qtbot.waitSignal(c.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(bubble.action_button, Qt.MouseButton.LeftButton)
    assert blocker.args[0]["event"] == "done"
    stored = window.store.messages(c.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[0].content.startswith("# again")
    assert not any(isinstance(w, ErrorBubble) for w in view.messages)
    stats = blocker.args[0]["stats"]
    assert view.context_used == stats["prompt_tokens"] + stats["generated_tokens"] < view.context_limit
