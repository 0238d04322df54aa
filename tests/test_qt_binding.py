"""The Qt binding must not leak references to None.

PySide6 6.12.0 on CPython 3.11 returns None from every void method (QLabel.setText, QTimer.start…)
without taking a reference. None is not immortal before Python 3.12, so after a few thousand such
calls its count reaches zero and the app aborts with "none_dealloc: deallocating None" (seen in the
speed-up demo's replay and while streaming a long answer). PySide6 6.11.3 is fine.
"""
from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12")
def test_void_methods_keep_none_alive(qapp):
    label, timer = QLabel(), QTimer()
    label.setText("warm")
    before = sys.getrefcount(None)
    for _ in range(200):
        label.setText("x")
        timer.stop()
    lost = before - sys.getrefcount(None)
    assert lost < 50, (f"{lost} references to None lost in 400 void Qt calls: this PySide6 build will crash the "
                       "app (pin PySide6-Essentials<6.12 or use Python 3.12+)")
