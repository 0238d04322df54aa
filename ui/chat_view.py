"""The chat area: per-chat system prompt, the message column, an empty state with example prompts,
and the composer (Enter sends, Shift+Enter adds a line, the Send button turns into Stop while an
answer streams). It only displays and asks; ChatController decides what happens."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont, QKeyEvent
from PySide6.QtWidgets import (QCheckBox, QFrame, QHBoxLayout, QLabel, QLineEdit, QPushButton,
                               QScrollArea, QSizePolicy, QToolButton, QVBoxLayout, QWidget)

from dflash_desktop.pairs import LoadedPair

from . import theme
from .composer import Composer
from .errors import ErrorBubble
from .message_widget import MessageWidget

# no example ends with a newline: the demo tokenizer merges a newline with the next line's indentation. These
# three run to the default max tokens without looping under the default repeat penalty (tests/test_repeat_penalty.py)
CODE_EXAMPLES = ("import sys\n\n\ndef main(argv=None):",
                 'import json\n\n\ndef load(path):\n    """Load a JSON file."""',
                 'def word_count(text):\n    """Count the words in text."""')
CHAT_EXAMPLES = ("Explain the water cycle in a few sentences.", "Write a short thank-you note to a friend who "
                 "helped me move.", "Write a Python function that reverses a string.")   # what small models do well
MAX_COLUMN = 920
CHARS_PER_TOKEN = 3.5   # the estimate (≈) until the engine has counted, or where it cannot (no model, a server)
COUNT_DELAY_MS = 300    # the engine counts the chat this long after typing stops
CONTEXT_TIP = ("Tokens this chat uses of the model's context. The whole chat is sent with every message: the "
               "engine counts it with the model's own tokenizer and chat template, the message you are typing "
               "included, once you stop typing. ≈ marks an estimate, shown until that count arrives (or "
               "when the model runs on a server).")
DEMO_HINT = ("Demo pair: a tiny code model trained on Python's standard library. Click a card to send exactly "
             "the code on it, or type the start of your own Python file.")
RAW_HINT = "This model has no chat template: it continues the text you type, so start with the beginning of it."
DEMO_BANNER = ("<b>Code completion model:</b> give it the start of a Python file. It continues what you type; "
               "it does not answer questions.")
RAW_BANNER = ("<b>Completion model:</b> it has no chat template, so it continues the text you type instead of "
              "answering it. Give it the beginning of what you want written; there is no system prompt.")
SYSTEM_PROMPT_OFF = ("No system prompt: this model has no chat template, so it cannot take instructions; it only "
                     "continues your text.")


class ExampleCard(QFrame):
    """A starter card: shows every line of the text it sends (wrapped, never cut), clicked with the mouse,
    Space or Enter."""
    clicked = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("example")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setWordWrap(True)
        self.label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        layout.addWidget(self.label)

    def setText(self, text: str) -> None:   # noqa: N802
        self.label.setText(text)

    def text(self) -> str:
        return self.label.text()

    def setFont(self, font) -> None:   # noqa: N802
        super().setFont(font)
        self.label.setFont(font)

    def click(self) -> None:
        self.clicked.emit()

    def mouseReleaseEvent(self, event) -> None:   # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton and self.rect().contains(event.position().toPoint()):
            self.clicked.emit()

    def keyPressEvent(self, event: QKeyEvent) -> None:   # noqa: N802
        if event.key() in (Qt.Key.Key_Space, Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.clicked.emit()
            return
        super().keyPressEvent(event)


class ChatView(QWidget):
    sendRequested = Signal(str)
    stopRequested = Signal()
    regenerateRequested = Signal()
    editSubmitted = Signal(int, str)
    versionRequested = Signal(int, int)   # answer's message id, version index
    chatSettingsRequested = Signal()
    systemPromptChanged = Signal(str)
    contextCountWanted = Signal(str)   # typing stopped: count the chat with this text as its next message

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.highlight = False
        self.code_mode = False   # the model continues code: messages render as code
        self.busy = False
        self.messages: list[QFrame] = []
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.setSpacing(0)

        top = QHBoxLayout()
        top.setContentsMargins(16, 10, 16, 6)
        self.system_prompt = QLineEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("System prompt for this chat (optional)")
        self.system_prompt.setAccessibleName("System prompt for this chat")
        self.system_prompt.setToolTip("Instructions the model reads before every message of this chat.")
        self.system_prompt.editingFinished.connect(lambda: self.systemPromptChanged.emit(self.system_prompt.text()))
        top.addWidget(self.system_prompt, 1)
        self.chat_settings = QToolButton()
        self.chat_settings.setObjectName("chatSettings")
        self.chat_settings.setAccessibleName("Chat settings: temperature and max tokens for this chat")
        self.chat_settings.clicked.connect(self.chatSettingsRequested)
        self.show_chat_settings({})
        top.addWidget(self.chat_settings)
        self.thinking = QCheckBox("Thinking")
        self.thinking.setAccessibleName("Let the model think before answering")
        self.thinking.setToolTip("Only for models whose chat template supports a thinking mode. The drafter "
                                 "must be trained for the same mode, or acceptance drops.")
        self.thinking.setVisible(False)
        top.addWidget(self.thinking)
        root.addLayout(top)
        self.banner = QLabel()
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setTextFormat(Qt.TextFormat.RichText)
        self.banner.setAccessibleName("What this model can do")
        self.banner.setToolTip("This model was trained to continue text (here, Python code), not to chat.")
        self.banner.hide()
        banner_row = QHBoxLayout()
        banner_row.setContentsMargins(16, 0, 16, 6)
        banner_row.addWidget(self.banner)
        root.addLayout(banner_row)

        self.scroll = QScrollArea()
        self.scroll.setObjectName("chatScroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.column = QWidget()
        self.column.setObjectName("chatColumn")
        self.column_layout = QVBoxLayout(self.column)
        self.column_layout.setContentsMargins(24, 8, 24, 8)
        self.column_layout.setSpacing(10)
        self.input = Composer()
        self.empty = self._empty_state()
        self.column_layout.addWidget(self.empty)
        self.column_layout.addStretch(1)
        self.scroll.setWidget(self.column)
        self.scroll.verticalScrollBar().rangeChanged.connect(self._follow)
        root.addWidget(self.scroll, 1)

        composer = QFrame()
        composer.setObjectName("composer")
        self.composer = composer
        self.input.focusChanged.connect(self._composer_focus)
        row = QHBoxLayout(composer)
        row.setContentsMargins(10, 6, 8, 6)
        self.input.setObjectName("input")
        self.input.setToolTip("Enter sends, Shift+Enter adds a line, Tab moves on, Ctrl+Tab inserts a tab.")
        self.input.setAccessibleName("Message to send")
        self.input.setFixedHeight(64)
        self.input.submitted.connect(self.submit)
        row.addWidget(self.input, 1)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.setAccessibleName("Send message")
        self.send_button.setToolTip("Send (Enter or Ctrl+Enter)")
        self.send_button.clicked.connect(self._send_or_stop)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        wrap = QVBoxLayout()
        wrap.setContentsMargins(24, 6, 24, 14)
        wrap.setSpacing(2)
        wrap.addWidget(composer)
        self.context_meter = QLabel("")
        self.context_meter.setObjectName("muted")
        self.context_meter.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.context_meter.setAccessibleName("Context used")
        self.context_meter.setToolTip(CONTEXT_TIP)
        wrap.addWidget(self.context_meter)
        root.addLayout(wrap)
        self.context_used: int = 0           # the chat before the message being typed
        self.context_used_estimated = False  # ... partly estimated (turns after the last counted answer)
        self.context_limit: int | None = None
        self._counted: tuple[str, int] | None = None   # (typed text, the engine's count of the chat with it)
        self._typing = QTimer(self)
        self._typing.setSingleShot(True)
        self._typing.setInterval(COUNT_DELAY_MS)   # debounced: one count when typing stops, not one per key
        self._typing.timeout.connect(self._typing_stopped)
        self.input.textChanged.connect(self._typing.start)
        self._stick_to_bottom = True

    def _empty_state(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(8, 24, 8, 12)
        layout.setSpacing(10)
        title = QLabel("What shall we write?")
        title.setObjectName("emptyTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(title)
        self.hint = QLabel("")
        self.hint.setObjectName("hint")
        self.hint.setWordWrap(True)
        self.hint.setTextFormat(Qt.TextFormat.RichText)
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(self.hint)
        self.example_buttons: list[ExampleCard] = []
        for _ in range(3):
            button = ExampleCard()
            button.clicked.connect(lambda b=button: self._use_example(b))
            layout.addWidget(button)
            self.example_buttons.append(button)
        self.set_examples(False)
        return box

    def set_examples(self, chat_model: bool, demo: bool = True) -> None:
        """Code openers for a code-continuation model, questions for a chat model. A model that cannot chat
        says so: a banner, the system prompt switched off with the reason, cards showing exactly what they
        send (every line, in the code font)."""
        self.code_mode = not chat_model
        examples = CHAT_EXAMPLES if chat_model else CODE_EXAMPLES
        self.hint.setText("" if chat_model else DEMO_HINT if demo else RAW_HINT)
        self.hint.setVisible(not chat_model)
        self.banner.setText("" if chat_model else DEMO_BANNER if demo else RAW_BANNER)
        self.banner.setVisible(not chat_model)
        self.system_prompt.setEnabled(chat_model)
        self.system_prompt.setPlaceholderText("System prompt for this chat (optional)" if chat_model
                                              else "No system prompt: a completion model (hover for why)")
        self.system_prompt.setToolTip("Instructions the model reads before every message of this chat."
                                      if chat_model else SYSTEM_PROMPT_OFF)
        self.input.setPlaceholderText("Message  (Enter to send, Shift+Enter for a new line)" if chat_model else
                                      "Start of a Python file  (Enter to send, Shift+Enter for a new line)"
                                      if demo else "Text to continue  (Enter to send, Shift+Enter for a new line)")
        self.input.viewport().update()
        font = theme.code_font() if not chat_model else QFont()   # the family only: the size follows the theme
        for button, text in zip(self.example_buttons, examples):
            button.setFont(font)
            button.setProperty("prompt", text)
            button.setText(text)      # every line, exactly as it is sent
            button.setToolTip("Sends exactly this text" + ("; the model continues it." if not chat_model else "."))
            button.setAccessibleName(f"Example prompt: {text.splitlines()[0]}")

    # -- context meter ------------------------------------------------------------------------------
    def set_context(self, used: int | None = None, limit: int | None = None, estimated: bool = False) -> None:
        """used: tokens of the chat before the message being typed (estimated: partly guessed); limit: the
        model's context. The chat or the model changed, so an earlier count of the engine no longer holds."""
        if used is not None:
            self.context_used = max(int(used), 0)
            self.context_used_estimated = estimated
        if limit is not None:
            self.context_limit = int(limit) or None
        self._counted = None
        self._show_context()

    def set_counted(self, typed: str, tokens: int, limit: int | None = None) -> None:
        """The engine's count of the chat with `typed` as its next message; ignored once the text changed."""
        if typed != self.input.toPlainText():
            return
        if limit:
            self.context_limit = int(limit)
        self._counted = (typed, max(int(tokens), 0))
        self._show_context()

    def _typing_stopped(self) -> None:
        self._show_context()
        self.contextCountWanted.emit(self.input.toPlainText())

    def typed_estimate(self) -> int:
        text = self.input.toPlainText()
        return round(len(text.encode("utf-8")) / CHARS_PER_TOKEN) if text else 0

    def _show_context(self) -> None:
        if not self.context_limit:
            self.context_meter.setText("")
            return
        typed = self.input.toPlainText()
        if self._counted is not None and self._counted[0] == typed:
            total, estimated = self._counted[1], False
        else:
            total = self.context_used + self.typed_estimate()
            estimated = bool(typed) or self.context_used_estimated
        share = total / self.context_limit
        text = f"{'≈' if estimated else ''}{total:,} / {self.context_limit:,} tokens of context ({share:.0%})"
        if share >= 1:
            text += " — too long: the oldest turns will have to go"
        self.context_meter.setText(text)
        self.context_meter.setObjectName("warning" if share >= 0.85 else "muted")
        self.context_meter.style().unpolish(self.context_meter)
        self.context_meter.style().polish(self.context_meter)

    def _composer_focus(self, on: bool) -> None:
        """A visible focus ring around the whole composer (style sheets have no :focus-within)."""
        self.composer.setProperty("focused", on)
        self.composer.style().unpolish(self.composer)
        self.composer.style().polish(self.composer)

    def _use_example(self, button: ExampleCard) -> None:
        self.input.setPlainText(button.property("prompt"))
        self.submit()

    # -- composer -----------------------------------------------------------------------------------
    def submit(self) -> None:
        """Ask for the typed text to be sent; the controller empties the box once the message is stored."""
        text = self.input.toPlainText()
        if not text.strip() or self.busy:
            return
        self.sendRequested.emit(text)

    def _send_or_stop(self) -> None:
        if self.busy:
            self.stopRequested.emit()
        else:
            self.submit()

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.send_button.setText("Stop" if busy else "Send")
        self.send_button.setAccessibleName("Stop generating" if busy else "Send message")
        self.send_button.setToolTip("Stop (Esc)" if busy else "Send (Enter or Ctrl+Enter)")
        for w in self.messages:
            if isinstance(w, MessageWidget):
                w.edit_button.setEnabled(not busy)
                w.regenerate_button.setEnabled(not busy)

    # -- messages -----------------------------------------------------------------------------------
    def _drop(self, w: QWidget) -> None:
        """Out of the column at once (deleteLater alone waits for the event loop, and a script or test that
        only processes events would keep showing it)."""
        w.hide()
        self.column_layout.removeWidget(w)
        w.deleteLater()

    def clear(self) -> None:
        for w in self.messages:
            self._drop(w)
        self.messages = []
        self.empty.show()

    def load(self, messages, system_prompt: str = "", loaded: LoadedPair | None = None) -> None:
        """Show a stored conversation (chat_store.Message objects)."""
        self.clear()
        self.system_prompt.setText(system_prompt)
        for i, m in enumerate(messages):
            # each turn renders as the model that answered it wrote (a code completion, or a chat), whatever is
            # loaded now; turns without such an answer as the loaded model would
            answer = m if m.role == "assistant" else next((x for x in messages[i + 1:] if x.role == "assistant"), None)
            model = ((answer.stats if answer else None) or {}).get("model") or {}
            code_only = not model["chat"] if "chat" in model else None
            if m.role == "user":
                self.add_user(m.id, m.content, code_only)
            elif m.role == "assistant":
                before = [x for x in messages if x.role == "user" and x.id < m.id]
                w = self.add_assistant(m.id, prefix=before[-1].content if before else "", code_only=code_only)
                w.set_content(m.content, m.spans or [[m.content, False]])
                w.set_footer(m.stats, m.stop_reason)
                w.set_versions(m.version, len(m.versions or ()) or 1)
                if m.error:
                    self.add_error(m.error, loaded)
        self.mark_last()

    def _add(self, widget: QFrame) -> None:
        self.empty.hide()
        self._stick_to_bottom = True
        self.column_layout.insertWidget(self.column_layout.count() - 1, widget)
        self.messages.append(widget)
        self._order_tabs(len(self.messages) - 1)

    def _order_tabs(self, start: int) -> None:
        """Tab reaches the messages' buttons in reading order, then the message box: a widget made later would
        otherwise come last in the window's focus chain, after the status bar. The messages from ``start`` on
        are linked after the ones before them, which are in order already."""
        def focusable(message) -> list:
            return [w for w in message.findChildren(QWidget) if w.focusPolicy() & Qt.FocusPolicy.TabFocus]
        anchor = next((f[-1] for m in reversed(self.messages[:start]) if (f := focusable(m))), self.scroll)
        chain = [anchor, *(w for m in self.messages[start:] for w in focusable(m)), self.input, self.send_button]
        for before, after in zip(chain, chain[1:]):
            QWidget.setTabOrder(before, after)

    def add_user(self, message_id: int | None, text: str, code_only: bool | None = None) -> MessageWidget:
        w = MessageWidget("user", message_id, code_only=self.code_mode if code_only is None else code_only,
                          parent=self.column)
        w.set_content(text)
        w.editSubmitted.connect(self.editSubmitted)
        self._add(w)
        return w

    def add_assistant(self, message_id: int | None = None, prefix: str = "",
                      code_only: bool | None = None) -> MessageWidget:
        """prefix: the user's turn a completion continues (shown before it for a code completion model);
        code_only: render as a code completion (None: as the loaded model writes)."""
        w = MessageWidget("assistant", message_id, highlight=self.highlight,
                          code_only=self.code_mode if code_only is None else code_only, parent=self.column)
        if prefix:
            w.set_prefix(prefix)
        w.regenerateRequested.connect(self.regenerateRequested)
        w.versionRequested.connect(self.versionRequested)
        self._add(w)
        return w

    def add_error(self, error: dict, loaded: LoadedPair | None = None, action=None) -> ErrorBubble:
        bubble = ErrorBubble(error, loaded, parent=self.column, action=action)
        self._add(bubble)
        return bubble

    def set_error_under(self, widget: QFrame, error: dict | None, loaded: LoadedPair | None = None) -> None:
        """The error bubble under an answer follows the version shown: dropped, or made for this error."""
        index = self.messages.index(widget)
        after = self.messages[index + 1] if index + 1 < len(self.messages) else None
        if isinstance(after, ErrorBubble):
            self._drop(after)
            self.messages.remove(after)
        if error:
            bubble = ErrorBubble(error, loaded, parent=self.column)
            self.column_layout.insertWidget(self.column_layout.indexOf(widget) + 1, bubble)
            self.messages.insert(index + 1, bubble)
            self._order_tabs(index + 1)

    def remove_from(self, widget: QFrame) -> None:
        """Drop a message widget and every widget after it."""
        if widget not in self.messages:
            return
        index = self.messages.index(widget)
        for w in self.messages[index:]:
            self._drop(w)
        self.messages = self.messages[:index]
        if not self.messages:
            self.empty.show()

    def mark_last(self) -> None:
        """Only the newest answer offers Regenerate."""
        answers = [w for w in self.messages if isinstance(w, MessageWidget)]
        for w in answers:
            w.set_last_answer(w is answers[-1])

    def show_chat_settings(self, overrides: dict) -> None:
        """The header button says when this chat sets its own sampling settings (the first two; all in its tip)."""
        words = {"temperature": "temperature {:g}", "max_new_tokens": "max {} tokens", "repeat_penalty":
                 "repeat penalty {:g}", "min_p": "min-p {:g}", "seed": "seed {}", "context_length": "context {}"}
        parts = [words[k].format(v) for k, v in overrides.items()]
        own = ", ".join(parts)
        shown = ", ".join(parts[:2]) + (f" +{len(parts) - 2}" if len(parts) > 2 else "")
        self.chat_settings.setText(f"Chat: {shown}" if own else "Chat settings")
        self.chat_settings.setToolTip((f"This chat uses its own {own} instead of the global settings. "
                                       if own else "This chat uses the global sampling settings. ")
                                      + "Click to change them for this chat only (Ctrl+Shift+T).")

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        for w in self.messages:
            if isinstance(w, MessageWidget):
                w.set_highlight(on)

    def user_widget(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.messages if isinstance(w, MessageWidget) and w.message_id == message_id), None)

    def resizeEvent(self, event) -> None:
        """Keep a readable line length: the message column is at most MAX_COLUMN pixels wide, centred."""
        super().resizeEvent(event)
        side = max(24, (self.scroll.viewport().width() - MAX_COLUMN) // 2)
        self.column_layout.setContentsMargins(side, 8, side, 8)

    # -- scrolling ----------------------------------------------------------------------------------
    def _follow(self, _min: int, maximum: int) -> None:
        """Keep the newest text in view while streaming, unless the user scrolled up to read."""
        bar = self.scroll.verticalScrollBar()
        if self._stick_to_bottom or bar.value() >= bar.maximum() - 80:
            QTimer.singleShot(0, bar, lambda: bar.setValue(bar.maximum()))   # dropped with the bar
            self._stick_to_bottom = False
