"""Long tooltips wrap (ui/tooltips.py): shown as a paragraph, never as one screen-wide line; short and rich
ones are left to Qt."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QLabel, QToolTip

from ui import tooltips


def hover(widget) -> str:
    QToolTip.hideText()
    event = QHelpEvent(QEvent.Type.ToolTip, QPoint(2, 2), widget.mapToGlobal(QPoint(2, 2)))
    QApplication.sendEvent(widget, event)
    return QToolTip.text()


def test_a_long_plain_tooltip_is_shown_as_a_wrapping_paragraph(qtbot):
    tooltips.install(QApplication.instance())
    tooltips.install(QApplication.instance())          # twice: still one filter
    long = ("Tokens per second over this answer, measured between token batches as they streamed, "
            "the first token & the prompt not counted.\nA second line.")
    label = QLabel("x")
    qtbot.addWidget(label)
    label.show()
    label.setToolTip(long)
    assert hover(label) == tooltips.wrapped(long)
    assert tooltips.wrapped(long).startswith("<p>") and "&amp;" in tooltips.wrapped(long) and "<br>" in \
        tooltips.wrapped(long)
    label.setToolTip("Short tip")
    assert hover(label) == "Short tip"
    label.setToolTip("<b>rich</b> " + "x" * 100)
    assert hover(label) == "<b>rich</b> " + "x" * 100
