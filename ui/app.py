"""Application start: QApplication, names, icon, theme, the main window, and a clean worker shutdown.

Opening fast matters more than anything else here: the window appears first, and the worker (which
imports the engine's libraries, seconds for PyTorch) is started and loads the model in the background with
progress in the status bar. DFLASH_DESKTOP_TIMING=1 prints the wall-clock time at which the first frame was shown, so
bench/bench_time_to_window.py can measure from the moment it launched the process.

Only one instance runs per data folder: a second launch brings the first window to the front and exits.
Neither the chat store nor the settings stop the start: what ``open_store`` had to do (a damaged file moved
aside, a read-only store) and the settings that fell back to their defaults are shown in dialogs once the
window is up, and a refused write later on is shown the same way instead of a traceback.
"""
from __future__ import annotations

import os
import sys
import time

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

import assets



def run(argv: list[str] | None = None) -> int:
    from dflash_desktop import paths
    from dflash_desktop import settings as settings_mod
    from dflash_desktop.single_instance import SingleInstance

    from . import theme
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0], *(argv or [])])
    app.setApplicationName("DFlash Desktop")
    app.setOrganizationName("DFlash Desktop")
    app.setApplicationDisplayName("DFlash Desktop")
    app.setDesktopFileName("dflash-desktop")
    app.setWindowIcon(QIcon(str(assets.path("icons", "dflash.svg"))))
    try:
        instance = SingleInstance(paths.data_dir())
    except OSError:  # the data folder cannot be created: nothing to share there, and open_store says why
        instance = None
    if instance is not None and not instance.claim():
        return hand_over(instance)
    settings, settings_notice = settings_mod.load_checked()
    theme.apply(app, settings.theme, settings.font_size)
    window = MainWindow(settings=settings)  # opens the chat store, now that this process holds the folder
    if instance is not None:
        instance.activated.connect(window.bring_to_front)
        app.aboutToQuit.connect(instance.release)
    install_store_error_hook(window)
    window.show()
    if window.store_notice:
        QTimer.singleShot(0, window.show_store_notice)
    if settings_notice:
        QTimer.singleShot(0, lambda: window.show_notice(settings_notice))
    greet(window)
    if os.environ.get("DFLASH_DESKTOP_TIMING"):
        QTimer.singleShot(0, lambda: print(f"window-shown-at {time.time():.6f}", flush=True))
    exit_after = os.environ.get("DFLASH_DESKTOP_EXIT_AFTER_MS")
    if exit_after:  # benchmarks and smoke tests: open, then close cleanly
        QTimer.singleShot(int(exit_after), window.close)
    return app.exec()


def greet(window) -> None:
    """A new profile gets the welcome once, after the window is on screen."""
    if not window.settings.welcome_seen:
        QTimer.singleShot(0, window.show_welcome)


def hand_over(instance) -> int:
    """Another instance holds the data folder: bring it to the front (exit 0), or say it is running (exit 1)."""
    if instance.activate_first():
        return 0
    QMessageBox.information(None, "DFlash Desktop",
                            "DFlash Desktop is already running, but its window did not answer. Switch to it "
                            "from the taskbar or the dock; if it is closing, wait a moment and start it again.")
    return 1


def install_store_error_hook(window) -> None:
    """Show a ChatStoreError raised in any slot (send, rename, delete... on a read-only store) in the window;
    every other exception goes on to the previous hook."""
    from dflash_desktop.chat_store import ChatStoreError

    previous = sys.excepthook

    def hook(kind, value, tb):
        if isinstance(value, ChatStoreError):
            window.show_store_error(value)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook
