"""Tooltips that wrap: Qt shows a plain-text tooltip on one line as wide as the screen, and many of ours are
sentences. A filter on the application shows every long plain tooltip as a paragraph, which Qt wraps."""
from __future__ import annotations

import html

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication, QToolTip, QWidget

WRAP_AFTER = 70          # characters: shorter tips stay as they are


class WrappedToolTips(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.ToolTip or not isinstance(watched, QWidget):
            return False
        tip = watched.toolTip()
        if len(tip) <= WRAP_AFTER or tip.lstrip().startswith("<"):
            return False                  # short, or rich text already (Qt wraps that itself)
        QToolTip.showText(event.globalPos(), wrapped(tip), watched)
        return True


def wrapped(tip: str) -> str:
    return "<p>" + html.escape(tip).replace("\n", "<br>") + "</p>"


def install(app: QApplication) -> None:
    """Once per application (a second call does nothing)."""
    if not getattr(app, "_wrapped_tooltips", None):
        app._wrapped_tooltips = WrappedToolTips(app)
        app.installEventFilter(app._wrapped_tooltips)
