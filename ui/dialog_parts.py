"""The parts every small input dialog shares: a hidden warning line for what the user must fix, and
OK (renamed) / Cancel buttons wired to the dialog."""
from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel


def warning_label() -> QLabel:
    label = QLabel("")
    label.setObjectName("warning")
    label.setWordWrap(True)
    label.hide()
    return label


def ok_cancel(dialog: QDialog, ok_text: str) -> QDialogButtonBox:
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.button(QDialogButtonBox.StandardButton.Ok).setText(ok_text)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    return buttons
