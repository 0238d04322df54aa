"""Application start: QApplication, names, icon, theme, the main window, and a clean worker shutdown.

Opening fast matters more than anything else here: the window appears first, and the worker (which
imports torch, seconds) is started and loads the model in the background with progress in the
status bar. DFLASH_DESKTOP_TIMING=1 prints the wall-clock time at which the first frame was shown, so
bench/bench_time_to_window.py can measure from the moment it launched the process.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

ICON = Path(__file__).resolve().parent.parent / "assets" / "icons" / "dflash.svg"


def run(argv: list[str] | None = None) -> int:
    from dflash_desktop import settings as settings_mod

    from . import theme
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0], *(argv or [])])
    app.setApplicationName("DFlash Desktop")
    app.setOrganizationName("DFlash Desktop")
    app.setApplicationDisplayName("DFlash Desktop")
    app.setDesktopFileName("dflash-desktop")
    app.setWindowIcon(QIcon(str(ICON)))
    settings = settings_mod.load()
    theme.apply(app, settings.theme, settings.font_size)
    window = MainWindow(settings=settings)
    window.show()
    if os.environ.get("DFLASH_DESKTOP_TIMING"):
        QTimer.singleShot(0, lambda: print(f"window-shown-at {time.time():.6f}", flush=True))
    exit_after = os.environ.get("DFLASH_DESKTOP_EXIT_AFTER_MS")
    if exit_after:  # benchmarks and smoke tests: open, then close cleanly
        QTimer.singleShot(int(exit_after), window.close)
    return app.exec()
