"""Qt item models with named roles, so views (and QML, should it come) bind to names, not columns."""
from __future__ import annotations

import dataclasses
import time

from PySide6.QtCore import QAbstractListModel, QByteArray, QModelIndex, QPersistentModelIndex, Qt, Signal

from dflash_desktop.chat_store import Conversation


def relative_time(stamp: float, now: float | None = None) -> str:
    now = time.time() if now is None else now
    delta = max(0.0, now - stamp)
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if time.localtime(stamp)[:3] == time.localtime(now)[:3]:
        return time.strftime("%H:%M", time.localtime(stamp))
    return time.strftime("%d %b", time.localtime(stamp))


class ConversationListModel(QAbstractListModel):
    """Conversations, newest first. Titles are editable in place; an edit is announced by titleEdited and
    saved by whoever owns the store (the model holds no store)."""

    titleEdited = Signal(int, str)   # conversation id, new title (stripped, never empty)

    IdRole = Qt.ItemDataRole.UserRole + 1
    TitleRole = Qt.ItemDataRole.UserRole + 2
    UpdatedRole = Qt.ItemDataRole.UserRole + 3
    SystemPromptRole = Qt.ItemDataRole.UserRole + 4

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[Conversation] = []

    def set_conversations(self, conversations: list[Conversation]) -> None:
        self.beginResetModel()
        self._rows = list(conversations)
        self.endResetModel()

    def conversation(self, row: int) -> Conversation | None:
        return self._rows[row] if 0 <= row < len(self._rows) else None

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == conversation_id), -1)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        c = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole, self.TitleRole):
            return c.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{c.title}\nlast message {relative_time(c.updated)}"
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return f"Chat: {c.title}"
        if role == self.IdRole:
            return c.id
        if role == self.UpdatedRole:
            return c.updated
        if role == self.SystemPromptRole:
            return c.system_prompt
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        base = super().flags(index)
        return base | Qt.ItemFlag.ItemIsEditable if index.isValid() else base

    def setData(self, index: QModelIndex | QPersistentModelIndex, value, role: int = Qt.ItemDataRole.EditRole) -> bool:
        title = str(value or "").strip()
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or not title:
            return False   # an empty title keeps the old one
        c = self._rows[index.row()]
        if title != c.title:
            self._rows[index.row()] = dataclasses.replace(c, title=title)
            self.dataChanged.emit(index, index)
            self.titleEdited.emit(c.id, title)
        return True

    def roleNames(self) -> dict[int, QByteArray]:
        names = super().roleNames()
        names.update({self.IdRole: QByteArray(b"conversationId"), self.TitleRole: QByteArray(b"title"),
                      self.UpdatedRole: QByteArray(b"updated"), self.SystemPromptRole: QByteArray(b"systemPrompt")})
        return names
