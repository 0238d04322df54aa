"""One chat message: a bubble with the rendered text, a footer of generation stats and small actions
(copy, edit-and-resend for the user's turns, regenerate for the last answer, < 2/3 > between the versions of
an answer written more than once)."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy, QTextBrowser,
                               QToolButton, QVBoxLayout, QWidget)

from dflash_desktop.session import author_text, method_of

from . import markdown, theme
from .composer import Composer

COPIED_MS = 1500   # how long "Copied" stays on what was clicked
STOP_WORDS = {"length": "max tokens", "eos": "end of text", "stop_string": "stop string",
              "context_full": "context full", "loop": "stopped: it was repeating itself (loop guard)",
              "cancelled": "stopped", "error": "interrupted by an engine error"}


def footer_text(stats: dict | None, stop_reason: str | None) -> str:
    """'42.1 tok/s · first token 0.12 s · 64 tokens · τ 3.20 · reached max tokens'; 'plain decoding' in
    place of τ for an answer that drafted nothing."""
    if not stats:
        return STOP_WORDS.get(stop_reason or "", stop_reason or "")
    plain = method_of(stats) == "plain"
    parts = [f"{float(stats.get('decode_tok_s') or 0):.1f} tok/s",
             f"first token {float(stats.get('ttft_s') or 0):.2f} s",
             f"{int(stats.get('generated_tokens') or 0)} tokens",
             "plain decoding" if plain else f"τ {float(stats.get('tau') or 0):.2f}"]
    if stop_reason:
        parts.append(STOP_WORDS.get(stop_reason, stop_reason))
    return "  ·  ".join(parts)


class AutoHeightBrowser(QTextBrowser):
    """A read-only rich text view exactly as tall as its content, so the chat column scrolls, not it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _fit(self, *_):
        height = int(self.document().size().height()) + 4
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event):
        super().resizeEvent(event)
        self.document().setTextWidth(self.viewport().width())
        self._fit()

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())


class MessageWidget(QFrame):
    editSubmitted = Signal(int, str)     # message id, new text
    regenerateRequested = Signal()
    versionRequested = Signal(int, int)  # message id, index of the version to show

    def __init__(self, role: str, message_id: int | None = None, highlight: bool = False,
                 code_only: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.role, self.message_id, self.highlight = role, message_id, highlight
        self.code_only = code_only   # a code-continuation model: the whole text is code
        self.text, self.spans, self.code_blocks = "", [], []
        self.copied: int | None = None   # the code block whose link says "Copied" just now
        self.prefix = ""             # code_only answers: the prompt they continue, shown dimmed before them
        self.setObjectName(f"bubble_{role}")
        self.setAccessibleName("Your message" if role == "user" else "Answer")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 10, 14, 8)
        outer.setSpacing(4)
        self.role_label = QLabel("You" if role == "user" else author_text(None))
        self.role_label.setObjectName("role")
        outer.addWidget(self.role_label)
        self.browser = AutoHeightBrowser(self)
        self.browser.setAccessibleName("Message text")
        self.browser.anchorClicked.connect(self._anchor)
        outer.addWidget(self.browser)
        theme.follow(self._render)      # colours and sizes are drawn into the document
        self.editor: QPlainTextEdit | None = None

        row = QHBoxLayout()
        row.setSpacing(2)
        self.footer = QLabel("")
        self.footer.setObjectName("footer")
        self.footer.setWordWrap(True)
        self.footer.setMinimumWidth(1)
        self.footer.setAccessibleName("Generation statistics")
        row.addWidget(self.footer, 1)
        self.version, self.version_count = 0, 1
        self.previous_button = self._action("<", "Show the previous version of this answer",
                                            lambda: self.step_version(-1))
        self.version_label = QLabel("")
        self.version_label.setObjectName("footer")
        self.next_button = self._action(">", "Show the next version of this answer", lambda: self.step_version(1))
        for w in (self.previous_button, self.version_label, self.next_button):
            w.setVisible(False)
            row.addWidget(w)
        self.copy_button = self._action("Copy", "Copy this message", self.copy_to_clipboard)
        row.addWidget(self.copy_button)
        self.edit_button = self._action("Edit", "Edit this message and send it again", self.start_edit)
        self.edit_button.setVisible(role == "user")
        row.addWidget(self.edit_button)
        self.regenerate_button = self._action("Regenerate", "Write this answer again", self.regenerateRequested.emit)
        self.regenerate_button.setVisible(False)
        row.addWidget(self.regenerate_button)
        outer.addLayout(row)

    def _action(self, text: str, accessible: str, slot) -> QToolButton:
        button = QToolButton(self)
        button.setObjectName("msgAction")
        button.setText(text)
        button.setAccessibleName(accessible)
        button.setToolTip(accessible)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(slot)
        return button

    # -- content ------------------------------------------------------------------------------------
    def set_content(self, text: str, spans: list | None = None) -> None:
        self.text, self.spans = text, [list(s) for s in spans or []]
        self._render()

    def append_spans(self, spans: list) -> None:
        for text, drafted in spans:
            self.text += text
            if self.spans and self.spans[-1][1] == drafted:
                self.spans[-1][0] += text
            else:
                self.spans.append([text, drafted])
        self._render()

    def set_highlight(self, on: bool) -> None:
        if on != self.highlight:
            self.highlight = on
            self._render()

    def set_prefix(self, prefix: str) -> None:
        """Show a completion after the prompt it continues (a code completion model's answers)."""
        self.prefix = prefix if self.code_only and self.role == "assistant" else ""
        self._render()

    def _render(self) -> None:
        self.code_blocks = markdown.render(self.browser.document(), self.text, self.spans,
                                           self.highlight and self.role == "assistant", self.code_only,
                                           copy_link=self.role == "assistant", prefix=self.prefix,
                                           copied=self.copied)

    def set_footer(self, stats: dict | None, stop_reason: str | None) -> None:
        self.footer.setText(footer_text(stats, stop_reason))
        if self.role == "assistant" and stats:
            self.set_author(stats)

    def set_author(self, stats: dict | None, writer: str | None = None) -> None:
        self.role_label.setText(author_text(stats, writer))

    def set_versions(self, index: int, count: int) -> None:
        """Show ``index + 1 / count`` with < > when the answer has more than one version."""
        self.version, self.version_count = index, count
        self.version_label.setText(f"{index + 1}/{count}")
        self.version_label.setAccessibleName(f"Version {index + 1} of {count} of this answer")
        self.version_label.setToolTip(f"This answer was written {count} times; version {index + 1} is shown, and "
                                      "it is the one later messages are sent with.")
        for w in (self.previous_button, self.version_label, self.next_button):
            w.setVisible(count > 1)
        self.previous_button.setEnabled(index > 0)
        self.next_button.setEnabled(index < count - 1)

    def step_version(self, step: int) -> None:
        index = self.version + step
        if 0 <= index < self.version_count and self.message_id is not None:
            self.versionRequested.emit(self.message_id, index)

    def set_last_answer(self, last: bool) -> None:
        self.regenerate_button.setVisible(last and self.role == "assistant")

    # -- actions ------------------------------------------------------------------------------------
    def copy_to_clipboard(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self._flash_copied(None)

    def _anchor(self, url: QUrl) -> None:
        """A code block's Copy link (it says "Copied" for a moment), or a link in the answer: opened in the
        browser only for the schemes markdown.LINK_SCHEMES lists."""
        name = url.toString()
        if name.startswith("copy:"):
            index = int(name.split(":", 1)[1])
            if 0 <= index < len(self.code_blocks):
                QGuiApplication.clipboard().setText(self.code_blocks[index])
                self._flash_copied(index)
        elif url.scheme().lower() in markdown.LINK_SCHEMES:
            QDesktopServices.openUrl(url)

    def _flash_copied(self, block: int | None) -> None:
        """'Copied' on the link (or the Copy button, block None) that was clicked, back after COPIED_MS."""
        if block is None:
            self.copy_button.setText("Copied")
            QTimer.singleShot(COPIED_MS, self.copy_button, lambda: self.copy_button.setText("Copy"))
            return
        self.copied = block
        self._render()
        QTimer.singleShot(COPIED_MS, self, self._unflash)   # not called once the message is gone

    def _unflash(self) -> None:
        self.copied = None
        self._render()

    def start_edit(self) -> None:
        """Swap the text for an editor with Send / Cancel; sending writes the answer again as a new version
        (the earlier ones are kept) and drops the turns after it."""
        if self.editor is not None:
            return
        self.editor = Composer(self, cancel_on_escape=True)   # Enter sends, Shift+Enter a new line, Esc cancels: as the box
        self.editor.setPlainText(self.text)
        self.editor.setAccessibleName("Edit message (Enter sends, Esc cancels)")
        self.editor.submitted.connect(self._submit_edit)
        self.editor.cancelled.connect(self._end_edit)
        self.editor.setMinimumHeight(80)
        layout: QVBoxLayout = self.layout()
        layout.insertWidget(2, self.editor)
        self.browser.hide()
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        cancel, send = QPushButton("Cancel"), QPushButton("Send")
        cancel.setAccessibleName("Cancel editing")
        send.setAccessibleName("Send edited message")
        send.setObjectName("primary")
        buttons.addWidget(cancel)
        buttons.addWidget(send)
        self._edit_row = QWidget(self)
        self._edit_row.setLayout(buttons)
        layout.insertWidget(3, self._edit_row)
        cancel.clicked.connect(self._end_edit)
        send.clicked.connect(self._submit_edit)
        self.editor.moveCursor(QTextCursor.MoveOperation.End)
        # once it is laid out and shown: focus given before that goes to the chat's scroll area instead
        QTimer.singleShot(0, self.editor, self.editor.setFocus)

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip() if self.editor else ""
        self._end_edit()
        if text and self.message_id is not None:
            self.editSubmitted.emit(self.message_id, text)

    def _end_edit(self) -> None:
        if self.editor is not None:
            self.editor.deleteLater()
            self._edit_row.deleteLater()
            self.editor = None
        self.browser.show()
