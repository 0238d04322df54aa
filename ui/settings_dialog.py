"""Settings (Ctrl+,): sampling, block size, draft cutoff, plain fallback, offline mode, theme, font
size, and the local server's port and API key. Generation fields take their ranges and help texts from
the engine's limits table (engine/limits.py); values are checked by Settings.validate(), and a refused
value is explained under the form instead of silently clamped."""
from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel,
                               QLineEdit, QSpinBox, QVBoxLayout, QWidget)

from dflash_desktop.settings import THEMES, Settings, SettingsError
from engine.limits import LIMITS

AUTOMATIC_CUTOFF = -0.01   # shown as "automatic"
# the Settings fields this dialog edits; the window copies exactly these back, so others set meanwhile survive
FIELDS = ("temperature", "top_p", "top_k", "max_new_tokens", "block_size", "draft_cutoff", "plain_fallback",
          "offline", "engine", "theme", "font_size", "server_port", "server_api_key")


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, max_block_size: int | None = None, parent: QWidget | None = None,
                 engines: list[tuple[str, str]] = ()):
        """engines: (name, label) of the engines that can run the loaded pair; offered when there are two or more."""
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self.max_block_size = max_block_size
        self.result_settings: Settings | None = None
        self._base = settings
        form = QFormLayout()
        form.setHorizontalSpacing(16)
        form.setVerticalSpacing(8)

        # spin boxes span 0 to each limit's top; validate() names any value the table refuses (top-p 0)
        self.temperature = self._double("temperature", 0.0, 0.05, settings.temperature)
        self.top_p = self._double("top_p", 0.0, 0.05, settings.top_p)
        self.top_k = self._int("top_k", 0, settings.top_k)
        self.max_new_tokens = self._int("max_new_tokens", 0, settings.max_new_tokens)
        self.block_size = self._int("block_size", 0, settings.block_size, top=max_block_size)
        self.block_size.setSpecialValueText("drafter's own")
        # the lowest value stands for "automatic" (None): the engine picks by device
        cutoff = AUTOMATIC_CUTOFF if settings.draft_cutoff is None else settings.draft_cutoff
        self.draft_cutoff = self._double("draft_cutoff", AUTOMATIC_CUTOFF, 0.01, cutoff)
        self.draft_cutoff.setMaximum(0.99)
        self.draft_cutoff.setSpecialValueText("automatic")
        self.plain_fallback = QCheckBox("Switch to plain decoding when DFlash does not pay")
        self.plain_fallback.setChecked(settings.plain_fallback)
        self.plain_fallback.setAccessibleName("Plain fallback")
        self.plain_fallback.setToolTip(
            "When drafts keep being rejected, so that DFlash runs slower than plain decoding on this computer, "
            "the rest of the answer uses plain decoding. The text is the same either way.")
        self.offline = QCheckBox("Offline: no downloads and no connection checks")
        self.offline.setChecked(settings.offline)
        self.offline.setAccessibleName("Offline mode")
        self.offline.setToolTip("Models already on this computer keep working; nothing is fetched.")
        self.engine = QComboBox()
        self.engine.setAccessibleName("Engine")
        self.engine.setToolTip("Which engine runs the model. Automatic takes the model list's choice for this "
                               "computer; the model reloads when this changes.")
        self._engines = ["auto"] + [name for name, _ in engines]
        self.engine.addItems(["Automatic (the model list's choice)"] + [label for _, label in engines])
        self.engine.setCurrentIndex(self._engines.index(settings.engine) if settings.engine in self._engines else 0)
        self.theme = QComboBox()
        self.theme.addItems([t.capitalize() for t in THEMES])
        self.theme.setCurrentIndex(THEMES.index(settings.theme))
        self.theme.setAccessibleName("Theme")
        self.font_size = QSpinBox()
        self.font_size.setRange(1, 100)
        self.font_size.setValue(settings.font_size)
        self.font_size.setAccessibleName("Font size in points")
        self.server_port = QSpinBox()
        self.server_port.setRange(1, 65535)
        self.server_port.setValue(settings.server_port)
        self.server_port.setAccessibleName("Local server port")
        self.server_port.setToolTip("The port of the OpenAI-compatible server on 127.0.0.1 (Local server switch). "
                                    "Applies the next time the server starts.")
        self.server_api_key = QLineEdit(settings.server_api_key)
        self.server_api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_api_key.setPlaceholderText("none: any program on this computer may use it")
        self.server_api_key.setAccessibleName("Local server API key")
        self.server_api_key.setToolTip("When set, clients must send Authorization: Bearer KEY.")

        for name in ("temperature", "top_p", "top_k", "max_new_tokens"):
            form.addRow(LIMITS[name].label, getattr(self, name))
        limit = f"1–{max_block_size}" if max_block_size else "up to the drafter's"
        form.addRow(f"Block size ({limit})", self.block_size)
        form.addRow(LIMITS["draft_cutoff"].label, self.draft_cutoff)
        form.addRow("", self.plain_fallback)
        form.addRow("", self.offline)
        if len(engines) > 1:
            form.addRow("Engine", self.engine)
        form.addRow("Theme", self.theme)
        form.addRow("Font size", self.font_size)
        form.addRow("Local server port", self.server_port)
        form.addRow("Local server API key", self.server_api_key)

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

    def _double(self, name: str, lo: float, step: float, value: float) -> QDoubleSpinBox:
        limit = LIMITS[name]
        box = QDoubleSpinBox()
        box.setRange(lo, limit.high)
        box.setSingleStep(step)
        box.setDecimals(2)
        box.setValue(value)
        box.setAccessibleName(limit.label)
        box.setToolTip(limit.help)
        return box

    def _int(self, name: str, lo: int, value: int, top: int | None = None) -> QSpinBox:
        limit = LIMITS[name]
        box = QSpinBox()
        box.setRange(lo, int(min(top or limit.high, limit.high)))
        box.setValue(value)
        box.setAccessibleName(limit.label)
        box.setToolTip(limit.help)
        return box

    def values(self) -> Settings:
        return dataclasses.replace(
            self._base, temperature=self.temperature.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
            max_new_tokens=self.max_new_tokens.value(), block_size=self.block_size.value(),
            draft_cutoff=None if self.draft_cutoff.value() < 0 else self.draft_cutoff.value(),
            plain_fallback=self.plain_fallback.isChecked(), offline=self.offline.isChecked(),
            engine=self._engines[self.engine.currentIndex()] if len(self._engines) > 2 else self._base.engine,
            theme=THEMES[self.theme.currentIndex()], font_size=self.font_size.value(),
            server_port=self.server_port.value(), server_api_key=self.server_api_key.text().strip())

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
