"""A model that cannot chat says so (the echo pair has no chat template, like the demo pair): a banner,
the system prompt switched off with the reason, starter cards that show and send exactly their text, and
completions shown after the prompt they continue. Real window, real worker."""
from __future__ import annotations

from PySide6.QtGui import QColor, QTextCursor

from ui import theme
from ui.chat_view import CODE_EXAMPLES, DEMO_BANNER, SYSTEM_PROMPT_OFF
from ui.message_widget import MessageWidget

from .ui_chat_fixtures import ANSWER_TIMEOUT_MS, chat_worker, echo_pair, home, make_window  # noqa: F401


def test_a_code_completion_model_says_what_it_can_do(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, {**echo_pair, "id": "demo"})   # shown as the demo pair
    view = window.chat_view
    assert not window.session.loaded.chat_template
    assert view.banner.isVisible() and view.banner.text() == DEMO_BANNER
    assert "give it the start of a Python file" in view.banner.text()
    assert not view.system_prompt.isEnabled()
    assert view.system_prompt.toolTip() == SYSTEM_PROMPT_OFF and "No system prompt" in view.system_prompt.placeholderText()
    assert "Python file" in view.input.placeholderText()
    # each card shows every line it sends, and sends exactly that
    for button, prompt in zip(view.example_buttons, CODE_EXAMPLES):
        assert button.isVisible() and button.text() == prompt and "\n" in prompt
        assert button.label.height() >= button.label.heightForWidth(button.label.width())   # no line cut
    card = view.example_buttons[1]
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        card.click()
    done = blocker.args[0]
    stored = window.store.messages(window.controller.conversation_id)
    assert stored[0].content == CODE_EXAMPLES[1]
    # the completion is shown after its prompt (dimmed), so its indentation reads right
    answer = [w for w in view.messages if isinstance(w, MessageWidget) and w.role == "assistant"][-1]
    assert answer.text == done["text"] and answer.prefix == CODE_EXAMPLES[1]
    assert answer.browser.toPlainText() == "Copy code\n" + CODE_EXAMPLES[1] + done["text"]
    assert answer.code_blocks == [CODE_EXAMPLES[1] + done["text"]]
    doc = answer.browser.document()
    cursor = QTextCursor(doc)
    start = len("Copy code\n")
    colors = set()
    for offset in (1, len(CODE_EXAMPLES[1]) - 1):
        cursor.setPosition(start + offset)
        colors.add(cursor.charFormat().foreground().color().name())
    assert colors == {QColor(theme.current().muted).name()}
    cursor.setPosition(start + len(CODE_EXAMPLES[1]) + 2)
    assert cursor.charFormat().foreground().color().name() == QColor(theme.current().text).name()
    # reopened from the store: still after its prompt
    conv = window.controller.conversation_id
    window.controller.new_chat()
    window.controller.open_conversation(conv)
    reopened = [w for w in view.messages if isinstance(w, MessageWidget) and w.role == "assistant"][-1]
    assert reopened.browser.toPlainText() == answer.browser.toPlainText()


def test_a_chat_model_gets_no_banner_and_a_system_prompt(qtbot):
    from ui.chat_view import CHAT_EXAMPLES, ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.set_examples(False)
    assert view.banner.isVisible() and not view.system_prompt.isEnabled()
    view.set_examples(True)
    assert not view.banner.isVisible() and view.system_prompt.isEnabled()
    assert [b.text() for b in view.example_buttons] == list(CHAT_EXAMPLES)


CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def test_a_chat_keeps_the_mode_of_the_model_that_wrote_it(qtbot, home, chat_worker, echo_pair, tmp_path):
    """A code completion written by the echo pair stays a code completion (its prompt before it, in the code
    font) after a chat model is loaded, and that model's chat renders as a chat: each turn is drawn as the
    model that answered it wrote it, not as the model loaded now."""
    from tests.tiny_torch import save_random_pair
    from tests.ui_chat_fixtures import send_and_wait
    window = make_window(qtbot, chat_worker, echo_pair)
    send_and_wait(qtbot, window, "def f(x):")
    code_chat = window.controller.conversation_id
    target, draft = save_random_pair(tmp_path / "chatty", block_size=8, chat_template=CHAT_TEMPLATE)
    window.controller.new_chat()
    with qtbot.waitSignal(window.session.pairLoaded, timeout=ANSWER_TIMEOUT_MS):
        window.load_pair({"id": "chatty", "name": "Chatty", "target_dir": str(target), "draft_dir": str(draft),
                          "plan": {"engine": "torch", "device": "auto", "dtype": None}})
    qtbot.waitUntil(lambda: window.session.ready, timeout=ANSWER_TIMEOUT_MS)
    assert window.session.loaded.chat_template and not window.chat_view.code_mode
    send_and_wait(qtbot, window, "hello")
    chat_chat = window.controller.conversation_id

    def turns():
        return [(w.role, w.code_only) for w in window.chat_view.messages if isinstance(w, MessageWidget)]
    window.controller.open_conversation(code_chat)
    assert turns() == [("user", True), ("assistant", True)]
    answer = window.chat_view.messages[-1]
    assert answer.prefix == "def f(x):" and answer.role_label.text().startswith("Echo test pair")
    window.controller.open_conversation(chat_chat)
    assert turns() == [("user", False), ("assistant", False)]
    assert window.chat_view.messages[-1].role_label.text().startswith("Chatty")
