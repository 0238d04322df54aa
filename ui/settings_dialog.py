"""Settings (Ctrl+,): sampling, block size, draft cutoff, theme and font size. Values are checked by
Settings.validate(), and a refused value is explained under the form instead of silently clamped."""
from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel, QSpinBox,
                               QVBoxLayout, QWidget)

from dflash_desktop.settings import THEMES, Settings, SettingsError

AUTOMATIC_CUTOFF = -0.01   # shown as "automatic"
# the Settings fields this dialog edits; the window copies exactly these back, so others set meanwhile survive
FIELDS = ("temperature", "top_p", "top_k", "max_new_tokens", "block_size", "draft_cutoff", "theme", "font_size")


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, max_block_size: int | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self.max_block_size = max_block_size
        self.result_settings: Settings | None = None
        self._base = settings
        form = QFormLayout()
        form.setHorizontalSpacing(16)
        form.setVerticalSpacing(8)

        self.temperature = self._double(0.0, 5.0, 0.05, settings.temperature, "Temperature (0 = greedy)")
        self.top_p = self._double(0.0, 1.0, 0.05, settings.top_p, "Top-p")
        self.top_k = self._int(0, 1_000_000, settings.top_k, "Top-k (0 = off)")
        self.max_new_tokens = self._int(0, 1_000_000, settings.max_new_tokens, "Maximum new tokens")
        self.block_size = self._int(0, max_block_size or 64, settings.block_size, "Block size")
        self.block_size.setSpecialValueText("drafter's own")
        # the lowest value stands for "automatic" (None): the engine picks by device
        cutoff = AUTOMATIC_CUTOFF if settings.draft_cutoff is None else settings.draft_cutoff
        self.draft_cutoff = self._double(AUTOMATIC_CUTOFF, 0.99, 0.01, cutoff, "Draft cutoff")
        self.draft_cutoff.setSpecialValueText("automatic")
        self.draft_cutoff.setToolTip(
            "Verify a drafted block only up to the first token the drafter is this unsure of "
            "(0 = always the whole block). Automatic: 0.05 on a CPU, where every verified token costs "
            "time, 0 on a GPU. The output is the same either way; only the speed changes.")
        self.theme = QComboBox()
        self.theme.addItems([t.capitalize() for t in THEMES])
        self.theme.setCurrentIndex(THEMES.index(settings.theme))
        self.theme.setAccessibleName("Theme")
        self.font_size = self._int(1, 100, settings.font_size, "Font size in points")

        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_new_tokens)
        limit = f"1–{max_block_size}" if max_block_size else "up to the drafter's"
        form.addRow(f"Block size ({limit})", self.block_size)
        form.addRow("Draft cutoff", self.draft_cutoff)
        form.addRow("Theme", self.theme)
        form.addRow("Font size", self.font_size)

        self.error = QLabel("")
        self.error.setObjectName("warning")
        self.error.setWordWrap(True)
        self.error.setAccessibleName("Settings error")
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    def _double(self, lo, hi, step, value, name) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(2)
        box.setValue(value)
        box.setAccessibleName(name)
        return box

    def _int(self, lo, hi, value, name) -> QSpinBox:
        box = QSpinBox()
        box.setRange(lo, hi)
        box.setValue(value)
        box.setAccessibleName(name)
        return box

    def values(self) -> Settings:
        return dataclasses.replace(
            self._base, temperature=self.temperature.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
            max_new_tokens=self.max_new_tokens.value(), block_size=self.block_size.value(),
            draft_cutoff=None if self.draft_cutoff.value() < 0 else self.draft_cutoff.value(),
            theme=THEMES[self.theme.currentIndex()], font_size=self.font_size.value())

    def accept(self) -> None:
        candidate = self.values()
        try:
            candidate.validate(self.max_block_size)
        except SettingsError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        self.result_settings = candidate
        super().accept()
