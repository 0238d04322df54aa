"""Work around a reference leak in PySide6 6.12.0 on Python 3.11: every call to a void Qt method
(QLabel.setText, QTextCursor.insertText…) returns None without taking a reference to it. None is not
immortal before Python 3.12, so its count falls by hundreds per rendered answer and the app aborts
with "deallocating None" after a few seconds of streaming (tests/test_qt_binding.py shows the leak).

None is a static object that is never freed, so raising its reference count is harmless; we keep it
far above anything the leak can consume between two checks. Nothing happens on Python 3.12+.
"""
from __future__ import annotations

import ctypes
import sys

FLOOR = 10_000_000     # top up when None's count falls below this
BOOST = 100_000_000    # references added per top-up
_timer = None


def needed() -> bool:
    return sys.version_info < (3, 12)


def top_up() -> None:
    """Cheap (one getrefcount) unless the count is low; call it before bursts of Qt calls."""
    if needed() and sys.getrefcount(None) < FLOOR:
        ctypes.c_ssize_t.from_address(id(None)).value += BOOST


def install() -> None:
    """Top up now and twice a second for the life of the application (idempotent)."""
    global _timer
    top_up()
    if _timer is not None or not needed():
        return
    from PySide6.QtCore import QCoreApplication, QTimer
    app = QCoreApplication.instance()
    if app is None:
        return
    _timer = QTimer(app)
    _timer.timeout.connect(top_up)
    _timer.start(500)
