"""The text box people type messages in: the chat's message box and the editor of a sent message."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class Composer(QPlainTextEdit):
    """Enter or Ctrl+Enter submits; Shift+Enter inserts a newline; Esc says `cancelled` (an editor closes on
    it). Tab moves the focus on (keyboard users must be able to leave the box); Ctrl+Tab inserts a tab."""
    submitted = Signal()
    cancelled = Signal()
    focusChanged = Signal(bool)

    def __init__(self, parent: QWidget | None = None, cancel_on_escape: bool = False):
        super().__init__(parent)
        self.cancel_on_escape = cancel_on_escape   # the message box leaves Esc to Stop (the answer being written)
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Tab and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.insertPlainText("\t")
            return
        if event.key() == Qt.Key.Key_Escape and self.cancel_on_escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)

    def event(self, event) -> bool:
        # Ctrl+Tab reaches a text box as a shortcut override first; take it for the tab character
        if event.type() == event.Type.ShortcutOverride and event.key() == Qt.Key.Key_Tab and \
                event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            event.accept()
            return True
        # an editor's Esc closes it, before the window's Esc (Stop) can take it
        if event.type() == event.Type.ShortcutOverride and event.key() == Qt.Key.Key_Escape and \
                self.cancel_on_escape:
            event.accept()
            return True
        return super().event(event)

    def focusInEvent(self, event) -> None:
        super().focusInEvent(event)
        self.focusChanged.emit(True)

    def focusOutEvent(self, event) -> None:
        super().focusOutEvent(event)
        self.focusChanged.emit(False)
