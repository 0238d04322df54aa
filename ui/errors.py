"""How worker errors reach the user: a readable bubble in the chat with "Open logs" and "Copy
diagnostics". The diagnostics carry everything a bug report needs (code, exit status, stderr tail,
versions, log path) so nobody has to ask for them."""
from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMessageBox, QPushButton, QVBoxLayout, QWidget

from dflash_desktop import paths
from dflash_desktop.pairs import LoadedPair
from engine.worker import app_version


def diagnostics_text(error: dict, loaded: LoadedPair | None = None) -> str:
    """Plain text for a bug report."""
    import PySide6
    lines = [f"DFlash Desktop {app_version()} — error report",
             f"message: {error.get('message', '')}",
             f"code: {error.get('code', '')}"]
    if error.get("exit_code") is not None or error.get("signal"):
        lines.append(f"exit code: {error.get('exit_code')}  signal: {error.get('signal') or '-'}")
    if error.get("pid"):
        lines.append(f"worker pid: {error['pid']}")
    lines += [f"log: {error.get('log_path') or paths.logs_dir()}",
              f"python: {sys.version.split()[0]}  PySide6: {PySide6.__version__}",
              f"system: {platform.platform()}"]
    if loaded:
        lines.append(f"model: {loaded.name} on {loaded.device} ({loaded.dtype})")
    tail = error.get("stderr_tail") or []
    if tail:
        lines += ["", "engine stderr (last lines):", *tail]
    return "\n".join(lines)


def open_logs(error: dict | None = None) -> bool:
    """Open the folder holding the worker log in the platform's file manager."""
    log = (error or {}).get("log_path")
    folder = Path(log).parent if log else paths.logs_dir()
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))


class ErrorBubble(QFrame):
    """Shown in place of (or under) the answer that failed; `action` (label, callback) offers a way out,
    such as loading on the CPU when the GPU cannot be used."""

    def __init__(self, error: dict, loaded: LoadedPair | None = None, parent: QWidget | None = None,
                 action: tuple[str, Callable[[], None]] | None = None):
        super().__init__(parent)
        self.error = dict(error)
        self.diagnostics = diagnostics_text(self.error, loaded)
        self.setObjectName("bubble_error")
        self.setAccessibleName("Error")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        # a chat longer than the model's context is a normal situation with a way out, not a failure
        title = QLabel("This chat is longer than the model can read" if self.error.get("code") == "prompt_too_long"
                       else "Something went wrong")
        title.setObjectName("role")
        layout.addWidget(title)
        self.message = QLabel(self.error.get("message") or "The engine reported an error.")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.setAccessibleName("Error message")
        layout.addWidget(self.message)
        row = QHBoxLayout()
        row.addStretch(1)
        self.action_button = None
        if action is not None:
            self.action_button = QPushButton(action[0])
            self.action_button.setAccessibleName(action[0])
            self.action_button.clicked.connect(action[1])
            row.addWidget(self.action_button)
        self.open_logs_button = QPushButton("Open logs")
        self.open_logs_button.setAccessibleName("Open the log folder")
        self.open_logs_button.clicked.connect(lambda: open_logs(self.error))
        self.copy_button = QPushButton("Copy diagnostics")
        self.copy_button.setAccessibleName("Copy diagnostics to the clipboard")
        self.copy_button.clicked.connect(self.copy_diagnostics)
        row.addWidget(self.open_logs_button)
        row.addWidget(self.copy_button)
        layout.addLayout(row)

    def copy_diagnostics(self) -> None:
        QGuiApplication.clipboard().setText(self.diagnostics)
        self.copy_button.setText("Copied")


class LoadErrorDialog(QMessageBox):
    """A load that failed: said in a window-modal box, not in whichever chat is open, with the way out (load on
    the CPU, another engine) and whether the model loaded before is still there to chat with."""

    def __init__(self, error: dict, name: str, kept: str | None, parent: QWidget | None = None,
                 action: tuple[str, Callable[[], None]] | None = None):
        super().__init__(QMessageBox.Icon.Warning, "DFlash Desktop", f"Could not load {name}.",
                         QMessageBox.StandardButton.Close, parent)
        self.error = dict(error)
        self.setInformativeText(f"{self.error.get('message') or 'The engine reported an error.'}\n\n"
                                + (f"{kept} is still loaded: your chats go on with it." if kept else
                                   "No model is loaded now: choose one with Models… (Ctrl+M)."))
        self.setDetailedText(diagnostics_text(self.error))
        self.action_button = None
        if action is not None:
            self.action_button = self.addButton(action[0], QMessageBox.ButtonRole.AcceptRole)
            self.action_button.clicked.connect(action[1])
            self.setDefaultButton(self.action_button)
        self.open_logs_button = self.addButton("Open logs", QMessageBox.ButtonRole.HelpRole)
        self.open_logs_button.clicked.connect(lambda: open_logs(self.error))
