"""The local server in the window: a switch (the toolbar's "Local server" action, mirrored in the status
bar), the address with a copy button, and what the server is doing, so a request from an editor never
looks like the app hanging. The server itself (dflash_desktop/server.py) runs on its own thread and
submits to the window's job queue; binding the port is the only thing done on the GUI thread."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

from dflash_desktop.qt_worker import QtWorker
from dflash_desktop.server import ServerConfigError, ServerThread


class ServerStatus(QWidget):
    """Status bar: switch, address, copy button, activity."""

    def __init__(self, action: QAction, parent: QWidget | None = None):
        super().__init__(parent)
        self.switch = QToolButton()
        self.switch.setDefaultAction(action)
        self.switch.setAccessibleName("Local server on or off")
        self.address = QLabel("")
        self.address.setAccessibleName("Local server address")
        self.address.setTextInteractionFlags(self.address.textInteractionFlags().TextSelectableByMouse)
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy the server's base URL (for the openai package, curl, editors)")
        self.copy_button.setAccessibleName("Copy the local server address")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.address.text()))
        self.activity = QLabel("")
        self.activity.setObjectName("muted")
        self.activity.setAccessibleName("Local server activity")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for w in (self.switch, self.address, self.copy_button, self.activity):
            layout.addWidget(w)
        self.show_url(None)

    def show_url(self, url: str | None) -> None:
        self.address.setText(url or "")
        for w in (self.address, self.copy_button, self.activity):
            w.setVisible(bool(url))
        if not url:
            self.activity.clear()

    def show_jobs(self, event: dict) -> None:
        """The queue changed: say when a server request runs, and how many wait behind it."""
        running = event.get("running") or {}
        waiting = (event.get("queued") or {}).get("server", 0)
        text = "serving a request" if running.get("owner") == "server" else "idle"
        self.activity.setText(f"{text}, {waiting} waiting" if waiting else text)


class LocalServer(QObject):
    """Starts and stops the server on the window's job queue; `changed` carries its URL, or None when off."""

    changed = Signal(object)     # str URL, or None
    failed = Signal(str)         # why it could not start

    def __init__(self, worker: QtWorker, model_name: Callable[[], str | None], parent: QObject | None = None):
        super().__init__(parent)
        self.worker, self.model_name = worker, model_name
        self.server: ServerThread | None = None

    @property
    def url(self) -> str | None:
        return self.server.url if self.server else None

    def start(self, port: int, api_key: str = "") -> bool:
        if self.server is not None:
            return True
        try:
            self.server = ServerThread.listen(self.worker.queue, "127.0.0.1", port, api_key or None, self.model_name)
        except ServerConfigError as exc:
            self.failed.emit(str(exc))
            return False
        self.changed.emit(self.server.url)
        return True

    def stop(self) -> None:
        """Stop at once (requests in flight are cancelled); the port is free a moment later."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()
            self.changed.emit(None)
