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
    limit = window.session.loaded.max_positions
    assert view.context_limit == limit and view.context_meter.text().startswith(f"0 / {limit:,} tokens")
    stats = send_and_wait(qtbot, window, "def f(x):")["stats"]
    used = stats["prompt_tokens"] + stats["generated_tokens"]      # counted by the engine
    assert view.context_used == used and view.context_meter.text().startswith(f"{used:,} / {limit:,}")
    shown_while_counting = []
    view.contextCountWanted.connect(lambda _text: shown_while_counting.append(view.context_meter.text()))
    with qtbot.waitSignal(window.worker.counted, timeout=ANSWER_TIMEOUT_MS) as counted:
        qtbot.keyClicks(view.input, "    return x + 1")
        assert view._typing.isActive() and not shown_while_counting   # debounced: nothing asked per key
    # the estimate, marked ≈, until the engine's count arrives; then the count, unmarked
    assert shown_while_counting == [f"≈{used + view.typed_estimate():,} / {limit:,} tokens of context "
                                    f"({(used + view.typed_estimate()) / limit:.0%})"]
    tokens = counted.args[0]["tokens"]
    assert counted.args[0]["context"] == limit and tokens != used + view.typed_estimate()
    assert view.context_meter.text().startswith(f"{tokens:,} / {limit:,} tokens")
    assert view.context_meter.toolTip()
    # the count is the chat exactly as the next generate sends it
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.keyClick(view.input, Qt.Key.Key_Return)
    assert blocker.args[0]["stats"]["prompt_tokens"] == tokens
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


def test_dropping_the_oldest_turns_keeps_the_failed_answers_earlier_versions(qtbot, home, chat_worker, echo_pair):
    """An edit that makes the chat too long fails as a new version of its answer: the retry replaces only
    that failed version, and the answer written before the edit stays browsable with its question."""
    window = make_window(qtbot, chat_worker, echo_pair)
    c, view = window.controller, window.chat_view
    line = "value = compute(value)\n"
    probe = send(qtbot, window, line * 10)["stats"]["prompt_tokens"]
    copies = math.ceil(1100 / (probe / 10))
    window.new_chat_action.trigger()
    assert send(qtbot, window, line * copies)["event"] == "done"
    assert send(qtbot, window, "x = 1\n")["event"] == "done"
    question, answer = window.store.messages(c.conversation_id)[-2:]
    longer = "# again\n" + line * copies
    with qtbot.waitSignal(c.answerFinished, timeout=ANSWER_TIMEOUT_MS) as failed:
        c.edit_and_resend(question.id, longer)
    assert failed.args[0]["code"] == "prompt_too_long"
    bubble = next(w for w in view.messages if isinstance(w, ErrorBubble))
    with qtbot.waitSignal(c.answerFinished, timeout=ANSWER_TIMEOUT_MS) as retried:
        qtbot.mouseClick(bubble.action_button, Qt.MouseButton.LeftButton)
    assert retried.args[0]["event"] == "done"
    stored = window.store.messages(c.conversation_id)
    assert [m.id for m in stored] == [question.id, answer.id] and stored[0].content == longer
    kept = stored[1]
    assert len(kept.versions) == 2 and kept.version == 1 and kept.content == retried.args[0]["text"]
    assert kept.versions[0]["content"] == answer.content and kept.versions[0]["prompt"] == "x = 1\n"
    assert all(v.get("error") is None for v in kept.versions)
    c.show_version(answer.id, 0)
    assert window.store.messages(c.conversation_id)[0].content == "x = 1\n"


def test_the_error_bubble_follows_the_version_shown(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    c, view = window.controller, window.chat_view
    line = "value = compute(value)\n"
    probe = send(qtbot, window, line * 10)["stats"]["prompt_tokens"]
    question, answer = window.store.messages(c.conversation_id)[-2:]
    with qtbot.waitSignal(c.answerFinished, timeout=ANSWER_TIMEOUT_MS) as failed:
        c.edit_and_resend(question.id, line * math.ceil(2100 / (probe / 10)))   # alone beyond 2,048 tokens
    assert failed.args[0]["code"] == "prompt_too_long"

    def bubbles():
        return [i for i, w in enumerate(view.messages) if isinstance(w, ErrorBubble)]
    assert bubbles() == [2]
    c.show_version(answer.id, 0)          # the answer that worked: no error under it
    assert bubbles() == [] and view.messages[1].text == answer.content
    c.show_version(answer.id, 1)          # the failed one: its error again, right under it
    assert bubbles() == [2] and len(view.messages) == 3


def test_opening_a_chat_counts_it_and_a_stale_count_is_not_shown(qtbot, home, chat_worker, echo_pair):
    """Opening a stored chat counts it (its turns after the last answer were only estimated); a count for
    text that changed meanwhile is not shown."""
    window = make_window(qtbot, chat_worker, echo_pair)
    view, c = window.chat_view, window.controller
    send(qtbot, window, "import os\n")
    first = c.conversation_id
    window.store.add_message(first, "user", "x = 1\n" * 20)     # a turn the engine never counted
    window.new_chat_action.trigger()
    with qtbot.waitSignal(window.worker.counted, timeout=ANSWER_TIMEOUT_MS) as counted:
        c.open_conversation(first)
        assert view.context_meter.text().startswith("≈")
    turns = "".join(m.content for m in window.store.messages(first))
    assert counted.args[0]["tokens"] == len(turns.encode())   # the echo pair: a byte tokenizer, no template
    assert view.context_meter.text().startswith(f"{len(turns.encode()):,} / ")
    view.set_counted("stale text", 5)
    assert view.context_meter.text().startswith(f"{len(turns.encode()):,} / ")


def test_with_no_model_loaded_the_meter_keeps_the_estimate(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    view = window.chat_view
    send(qtbot, window, "def f(x):")
    with qtbot.waitSignal(window.session.pairUnloaded, timeout=ANSWER_TIMEOUT_MS):
        window.unload_action.trigger()
    assert window.worker.count_tokens(prompt="x") is None          # nothing is sent without a local pair
    counts = []
    window.worker.counted.connect(counts.append)
    with qtbot.waitSignal(view.contextCountWanted, timeout=5000):
        qtbot.keyClicks(view.input, "    return x")
    qtbot.wait(500)
    estimate = view.context_used + view.typed_estimate()
    assert not counts and view.context_meter.text().startswith(f"≈{estimate:,} / ")
