"""Work around a reference leak in PySide6 6.12.0 on Python 3.11: void Qt methods (QLabel.setText,
QTextCursor.insertText…) return None, and bool methods return True/False, without taking a reference.
These singletons are not immortal before Python 3.12, so their counts fall by hundreds per rendered
answer and the app aborts ("deallocating None", "deallocating True or False") after seconds of
streaming (tests/test_qt_binding.py shows the leak).

The singletons are static objects that are never freed, so raising their reference counts is
harmless; we keep them far above anything the leak can consume between two checks. Nothing happens
on Python 3.12+, where they are immortal.
"""
from __future__ import annotations

import ctypes
import sys

FLOOR = 10_000_000     # top up when None's count falls below this
BOOST = 100_000_000    # references added per top-up
_timer = None


def needed() -> bool:
    return sys.version_info < (3, 12)


SINGLETONS = (None, True, False)


def top_up() -> None:
    """Cheap (three getrefcounts) unless a count is low; call it before bursts of Qt calls."""
    if not needed():
        return
    for obj in SINGLETONS:
        if sys.getrefcount(obj) < FLOOR:
            ctypes.c_ssize_t.from_address(id(obj)).value += BOOST


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
