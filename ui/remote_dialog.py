""""Add a server": the base URL and key of an OpenAI-compatible server (vLLM or SGLang started with a DFlash
drafter, or another DFlash Desktop), for models this computer cannot hold. The address is checked here;
the connection is made by the load, which reports what went wrong in the chat like any failed load."""
from __future__ import annotations

import urllib.parse

from PySide6.QtWidgets import (QComboBox, QDialog, QFormLayout, QLabel, QLineEdit, QVBoxLayout,
                               QWidget)

from dflash_desktop.pairs import PairRequest
from dflash_desktop.remote import normalize_base_url

from .dialog_parts import ok_cancel, warning_label


class AddServerDialog(QDialog):
    def __init__(self, servers: list[dict], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Add a server")
        self.servers = list(servers)
        self.base_url: str | None = None
        intro = QLabel("Chat with a model that runs on a server: vLLM or SGLang started with a DFlash drafter "
                       "(docs/SERVER.md, \"Remote servers\"), or another DFlash Desktop. This computer's engine is not "
                       "started for it.")
        intro.setWordWrap(True)
        self.url = QComboBox()
        self.url.setEditable(True)
        self.url.addItems([s["base_url"] for s in self.servers])
        self.url.setCurrentText(self.servers[0]["base_url"] if self.servers else "http://")
        self.url.setAccessibleName("Server base URL")
        self.url.lineEdit().setPlaceholderText("http://gpu-box:8000")
        self.key = QLineEdit(self.servers[0]["api_key"] if self.servers else "")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("if the server was started with an API key")
        self.key.setAccessibleName("Server API key")
        self.url.currentIndexChanged.connect(lambda i: self.key.setText(self.servers[i]["api_key"]) if i >= 0 else None)
        form = QFormLayout()
        form.addRow("Base URL", self.url)
        form.addRow("API key", self.key)
        self.error = warning_label()
        buttons = ok_cancel(self, "Connect")
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    def accept(self) -> None:
        try:
            self.base_url = normalize_base_url(self.url.currentText())
        except ValueError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        super().accept()

    def pair(self) -> PairRequest:
        """The chosen server as a load request; its name becomes the served model's on load."""
        host = urllib.parse.urlsplit(self.base_url).netloc
        return PairRequest(f"remote:{self.base_url}", f"Server at {host}",
                           remote={"base_url": self.base_url, "api_key": self.key.text().strip()})
