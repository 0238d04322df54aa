"""Chat settings (Ctrl+Shift+T): the sampling settings one chat sets itself over the global ones (temperature,
max tokens, repeat penalty, min-p, seed, context length: chat_store.CHAT_SETTINGS). Each field is either "global"
(the global value shown greyed, followed when it changes) or the chat's own; "Reset to global" brings all back.
The result is the chat's overrides, {} when it follows the globals. Also the question asked before a
regeneration at temperature 0, the other per-chat sampling choice."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QDialog, QFormLayout, QHBoxLayout, QLabel, QMessageBox, QPushButton,
                               QVBoxLayout, QWidget)

from dflash_desktop.chat_store import CHAT_SETTINGS
from dflash_desktop.settings import Settings
from engine.errors import SettingsError
from engine.limits import LIMITS

from .dialog_parts import ok_cancel
from .settings_dialog import answer_box, box_value, show_value


class ChatSettingsDialog(QDialog):
    def __init__(self, title: str, overrides: dict, settings: Settings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setAccessibleName("Chat settings")
        self.result_overrides: dict | None = None
        self._globals = {name: getattr(settings, name) for name in CHAT_SETTINGS}
        intro = QLabel(f"Settings for “{title}” only. A field left on “global” follows the Settings dialog.")
        intro.setWordWrap(True)
        self.boxes = {name: answer_box(name) for name in CHAT_SETTINGS}
        self.own: dict[str, QCheckBox] = {}
        form = QFormLayout()
        for name, box in self.boxes.items():
            limit = LIMITS[name]
            box.setAccessibleName(f"{limit.label} for this chat")
            box.setToolTip(limit.help)
            own = QCheckBox("this chat's own")
            own.setAccessibleName(f"Use this chat's own {limit.label.lower()}")
            show_value(name, box, self._globals[name])
            own.setToolTip(f"Off: this chat uses the global {limit.label.lower()} ({box.text()}).")
            own.toggled.connect(lambda on, n=name: self._set_own(n, on))
            self.own[name] = own
            show_value(name, box, overrides.get(name, self._globals[name]))
            own.setChecked(name in overrides)
            self._set_own(name, name in overrides)
            row = QHBoxLayout()
            row.addWidget(box, 1)
            row.addWidget(own)
            form.addRow(limit.label, row)
        self.error = QLabel("")
        self.error.setObjectName("warning")
        self.error.setWordWrap(True)
        self.error.hide()
        self.reset_button = QPushButton("Reset to global")
        self.reset_button.setAccessibleName("Reset all of this chat's settings to the global settings")
        self.reset_button.setToolTip("Every field follows the global settings again.")
        self.reset_button.clicked.connect(self.reset)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(self.reset_button)
        layout.addWidget(ok_cancel(self, "Save"))

    def _set_own(self, name: str, on: bool) -> None:
        box = self.boxes[name]
        box.setEnabled(on)
        if not on:
            show_value(name, box, self._globals[name])

    def reset(self) -> None:
        for own in self.own.values():
            own.setChecked(False)

    def overrides(self) -> dict:
        """The chat's own values; one set to what stands for None (a random seed, the whole context) is not
        an override of its own: the global setting may be a number."""
        chosen = {name: box_value(name, self.boxes[name]) for name, own in self.own.items() if own.isChecked()}
        return {name: value for name, value in chosen.items() if value is not None}

    def accept(self) -> None:
        """A value the box holds but the limit refuses (a context of 5 tokens) is explained, not saved."""
        try:
            for name, value in self.overrides().items():
                LIMITS[name].check(value, LIMITS[name].label)
        except SettingsError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        self.result_overrides = self.overrides()
        super().accept()


SAMPLE_TEMPERATURE = 0.7   # what "sample instead" uses for one regeneration


def greedy_question(parent: QWidget, choose) -> QMessageBox:
    """Ask before regenerating at temperature 0, which writes the same answer again. ``choose(temperature)``
    runs on a choice: 0.0 to regenerate anyway, SAMPLE_TEMPERATURE to sample this once; Cancel does nothing.
    Window-modal and non-blocking; returned so tests can answer it."""
    box = QMessageBox(QMessageBox.Icon.Question, "Regenerate",
                      "Greedy decoding (temperature 0) gives the same answer again. Regenerate anyway, or sample "
                      f"this answer at temperature {SAMPLE_TEMPERATURE:g} for a different one? The current answer "
                      "is kept as a version either way.", QMessageBox.StandardButton.Cancel, parent)
    anyway = box.addButton("Regenerate anyway", QMessageBox.ButtonRole.AcceptRole)
    sample = box.addButton(f"Sample at temperature {SAMPLE_TEMPERATURE:g}", QMessageBox.ButtonRole.AcceptRole)
    box.setDefaultButton(sample)
    choices = {anyway: 0.0, sample: SAMPLE_TEMPERATURE}
    box.buttonClicked.connect(lambda button: button in choices and choose(choices[button]))
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box
