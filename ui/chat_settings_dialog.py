"""Chat settings (Ctrl+Shift+T): a temperature and a max tokens for one chat that override the global ones.
Each field is either "global" (the global value shown greyed, followed when it changes) or the chat's own;
"Reset to global" brings both back. The result is the chat's overrides, {} when it follows the globals.
Also the question asked before a regeneration at temperature 0, the other per-chat sampling choice."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QDialog, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QMessageBox,
                               QPushButton, QSpinBox, QVBoxLayout, QWidget)

from dflash_desktop.settings import Settings
from engine.limits import LIMITS

from .dialog_parts import ok_cancel


class ChatSettingsDialog(QDialog):
    def __init__(self, title: str, overrides: dict, settings: Settings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setAccessibleName("Chat settings")
        self.result_overrides: dict | None = None
        self._globals = {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens}
        intro = QLabel(f"Settings for “{title}” only. A field left on “global” follows the Settings dialog.")
        intro.setWordWrap(True)
        temperature = QDoubleSpinBox()
        temperature.setRange(0.0, LIMITS["temperature"].high)
        temperature.setSingleStep(0.05)
        temperature.setDecimals(2)
        max_tokens = QSpinBox()
        max_tokens.setRange(LIMITS["max_new_tokens"].low, int(LIMITS["max_new_tokens"].high))
        self.boxes = {"temperature": temperature, "max_new_tokens": max_tokens}
        self.own: dict[str, QCheckBox] = {}
        form = QFormLayout()
        for name, box in self.boxes.items():
            limit = LIMITS[name]
            box.setAccessibleName(f"{limit.label} for this chat")
            box.setToolTip(limit.help)
            own = QCheckBox("this chat's own")
            own.setAccessibleName(f"Use this chat's own {limit.label.lower()}")
            own.setToolTip(f"Off: this chat uses the global {limit.label.lower()} ({self._globals[name]:g}).")
            own.toggled.connect(lambda on, n=name: self._set_own(n, on))
            self.own[name] = own
            box.setValue(overrides.get(name, self._globals[name]))
            own.setChecked(name in overrides)
            self._set_own(name, name in overrides)
            row = QHBoxLayout()
            row.addWidget(box, 1)
            row.addWidget(own)
            form.addRow(limit.label, row)
        self.reset_button = QPushButton("Reset to global")
        self.reset_button.setAccessibleName("Reset this chat's temperature and max tokens to the global settings")
        self.reset_button.setToolTip("Both fields follow the global settings again.")
        self.reset_button.clicked.connect(self.reset)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.reset_button)
        layout.addWidget(ok_cancel(self, "Save"))

    def _set_own(self, name: str, on: bool) -> None:
        box = self.boxes[name]
        box.setEnabled(on)
        if not on:
            box.setValue(self._globals[name])

    def reset(self) -> None:
        for own in self.own.values():
            own.setChecked(False)

    def overrides(self) -> dict:
        return {name: self.boxes[name].value() for name, own in self.own.items() if own.isChecked()}

    def accept(self) -> None:
        """The spin boxes span exactly the engine's limits, so every value they hold is valid."""
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
