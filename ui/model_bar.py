"""The loaded model at the top of the window, where LM Studio and Jan put it: its name, engine, device, weights,
method and memory on one line, and a menu of my models (the built-in pairs and every pair loaded before,
remembered with its paths) to switch in one click."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMenu, QToolButton, QWidget

from dflash_desktop.pairs import PairRequest


class ElidedLabel(QLabel):
    """One line that never pushes the window wider: cut with … where it does not fit, whole in its tooltip."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(parent)
        self._full = ""
        self.setMinimumWidth(40)
        self.setText(text)

    def setText(self, text: str) -> None:   # noqa: N802
        self._full = text
        self.setToolTip(text)
        self._elide()

    def text(self) -> str:   # the whole line, as set (what is drawn may be cut)
        return self._full

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, max(self.width() - 2, 0))
        super().setText(shown if self.width() > 0 else self._full)

    def sizeHint(self):   # noqa: N802
        hint = super().sizeHint()
        hint.setWidth(min(hint.width(), self.fontMetrics().horizontalAdvance(self._full) + 4))
        return hint

    def resizeEvent(self, event) -> None:   # noqa: N802
        super().resizeEvent(event)
        self._elide()


def available(pair: PairRequest) -> bool:
    """A server is always offered (it answers or says why); a pair on disk while its files are there."""
    return bool(pair.remote) or (pair.target_dir is not None and Path(pair.target_dir).exists())


class ModelBar(QFrame):
    pairChosen = Signal(object)     # a PairRequest from my models
    browseRequested = Signal()      # the model list (Models…)

    def __init__(self, mine: Callable[[], tuple[list[PairRequest], str | None]], parent: QWidget | None = None):
        """mine(): my models, the latest first, and the id of the one loaded; asked each time the menu opens
        (the window reads the catalog and the settings then, not at every load)."""
        super().__init__(parent)
        self.setObjectName("modelBar")
        self.setAccessibleName("Loaded model")
        self.mine = mine
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 4, 10, 4)
        self.switch_button = QToolButton(self)
        self.switch_button.setText("My models")
        self.switch_button.setAccessibleName("Switch model")
        self.switch_button.setToolTip("Load one of your models: the built-in ones and every model loaded before")
        self.switch_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self)
        self.menu.aboutToShow.connect(self._fill_menu)
        self.switch_button.setMenu(self.menu)
        self.label = ElidedLabel("No model loaded", self)
        self.label.setObjectName("modelLine")
        self.label.setAccessibleName("Loaded model, engine, method and memory")
        layout.addWidget(self.switch_button)
        layout.addWidget(self.label, 1)

    def _fill_menu(self) -> None:
        self.menu.clear()
        models, current = self.mine()
        for pair in models:
            ok = available(pair)
            where = pair.remote["base_url"] if pair.remote else pair.target_dir or ""
            action = QAction(pair.name + ("" if ok else "  (files missing)"), self.menu)
            action.setCheckable(True)
            action.setChecked(pair.id == current)
            action.setEnabled(ok)
            action.setToolTip(where)
            action.setStatusTip(where)
            action.triggered.connect(lambda _checked=False, p=pair: self.pairChosen.emit(p))
            self.menu.addAction(action)
        self.menu.setToolTipsVisible(True)
        if models:
            self.menu.addSeparator()
        browse = self.menu.addAction("All models and open from disk…  (Ctrl+M)")
        browse.triggered.connect(self.browseRequested)
