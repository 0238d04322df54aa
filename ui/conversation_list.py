"""The sidebar: a New chat button and a search box over the list of conversations (newest first). The
search filters the list live (titles and message text, searched by the window in the chat store); Escape
clears it. A chat is renamed in
place (F2, double-click or the context menu) and deleted from the context menu, the Delete key or the
button under the list (always after a confirmation)."""
from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (QAbstractItemView, QLabel, QLineEdit, QListView, QMenu, QMessageBox, QPushButton,
                               QVBoxLayout, QWidget)

from .models import ConversationListModel


class SearchBox(QLineEdit):
    """Escape clears the search (taken before the window's Escape, which stops an answer)."""

    def event(self, event) -> bool:
        if event.type() == event.Type.ShortcutOverride and event.key() == Qt.Key.Key_Escape and self.text():
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:   # noqa: N802
        if event.key() == Qt.Key.Key_Escape and self.text():
            self.clear()
            return
        super().keyPressEvent(event)


class ConversationList(QWidget):
    conversationChosen = Signal(int)
    newChatRequested = Signal()
    deleteRequested = Signal(int)      # already confirmed by the user
    renameRequested = Signal(int, str)  # conversation id, new title
    searchChanged = Signal(str)         # the search box's text, as typed ("" when cleared)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.model = ConversationListModel(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 10, 8, 8)
        layout.setSpacing(6)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.newChatRequested)
        layout.addWidget(self.new_button)
        self.search = SearchBox()
        self.search.setObjectName("chatSearch")
        self.search.setPlaceholderText("Search chats")
        self.search.setAccessibleName("Search chats")
        self.search.setToolTip("Shows only the chats whose title or messages contain this text (Ctrl+F). "
                               "Escape clears it.")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.searchChanged)
        layout.addWidget(self.search)
        self.no_match = QLabel("")
        self.no_match.setObjectName("muted")
        self.no_match.setWordWrap(True)
        self.no_match.hide()
        layout.addWidget(self.no_match)
        self.view = QListView()
        self.view.setObjectName("conversationList")
        self.view.setAccessibleName("Conversations")
        self.view.setModel(self.model)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QAbstractItemView.EditTrigger.DoubleClicked)
        self.model.titleEdited.connect(self.renameRequested)
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setUniformItemSizes(True)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        self.view.clicked.connect(self._chosen)
        self.view.activated.connect(self._chosen)
        layout.addWidget(self.view, 1)
        self.delete_button = QPushButton("Delete chat")
        self.delete_button.setAccessibleName("Delete the selected chat")
        self.delete_button.clicked.connect(lambda: self.confirm_delete(self.selected_id()))
        layout.addWidget(self.delete_button)
        self.delete_action = QAction("Delete chat…", self)
        self.delete_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        self.delete_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.delete_action.triggered.connect(lambda: self.confirm_delete(self.selected_id()))
        self.view.addAction(self.delete_action)
        self.setMinimumWidth(200)

    def set_conversations(self, conversations, current_id: int | None) -> None:
        """``conversations``: those matching the search box (all of them when it is empty)."""
        self.model.set_conversations(conversations)
        self.select(current_id)
        query = self.search.text()
        self.no_match.setText(f"No chat contains “{query}”." if query and not conversations else "")
        self.no_match.setVisible(bool(query) and not conversations)

    def select(self, conversation_id: int | None) -> None:
        row = self.model.row_of(conversation_id) if conversation_id is not None else -1
        if row < 0:
            self.view.clearSelection()
        else:
            self.view.setCurrentIndex(self.model.index(row))
        self.delete_button.setEnabled(row >= 0)

    def selected_id(self) -> int | None:
        index = self.view.currentIndex()
        return index.data(ConversationListModel.IdRole) if index.isValid() else None

    def _chosen(self, index: QModelIndex) -> None:
        self.delete_button.setEnabled(True)
        self.conversationChosen.emit(index.data(ConversationListModel.IdRole))

    def _menu(self, pos) -> None:
        index = self.view.indexAt(pos)
        if not index.isValid():
            return
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.view.edit(index))
        menu.addAction("Delete chat…", lambda: self.confirm_delete(index.data(ConversationListModel.IdRole)))
        menu.exec(self.view.viewport().mapToGlobal(pos))

    def confirm_delete(self, conversation_id: int | None) -> None:
        if conversation_id is None:
            return
        row = self.model.row_of(conversation_id)
        title = self.model.conversation(row).title if row >= 0 else "this chat"
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{title}” and all its messages? "
                                      "This cannot be undone.",
                                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                                      QMessageBox.StandardButton.Cancel)
        if answer == QMessageBox.StandardButton.Yes:
            self.deleteRequested.emit(conversation_id)
