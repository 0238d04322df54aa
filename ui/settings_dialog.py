"""Settings (Ctrl+,) in three tabs: Answers (sampling, repeat penalty, seed, max tokens, loop guard, context
length), Speed (block size, draft cutoff, plain fallback, engine) and App (offline mode, theme, font size, the
local server's port and API key). Generation fields take their ranges and help texts from
the engine's limits table (engine/limits.py), the others from dflash_desktop/settings.py; every field's
tooltip says what it does, its range and its default. Values are checked by Settings.validate(), and a
refused value is explained under the form instead of silently clamped. Reset to defaults only fills
the fields: OK applies them, Cancel keeps the settings as they were."""
from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel,
                               QLineEdit, QSpinBox, QTabWidget, QVBoxLayout, QWidget)

from dflash_desktop.settings import FONT_SIZES, PORTS, SAMPLING, THEMES, Settings, SettingsError
from engine.limits import LIMITS

AUTOMATIC_CUTOFF = -0.01   # shown as "automatic"
# the Settings fields this dialog edits; the window copies exactly these back, so others set meanwhile survive
ANSWER_FIELDS = SAMPLING   # in the order shown; None shows as the box's lowest value
FIELDS = ANSWER_FIELDS + ("block_size", "draft_cutoff", "plain_fallback", "offline", "engine", "theme", "font_size",
                          "server_port", "server_api_key")
NONE_SHOWN = {"seed": ("random", -1), "context_length": ("all of the model's", 0)}   # (text, value) for None
SPECIAL = {"repeat_penalty": "off"}      # the text shown at a box's lowest value, besides each limit's word for 0
# each answer field's box: its lowest value (below the limit where 0 or None has a meaning) and its step
BOXES = {"temperature": (0.0, 0.05), "top_p": (0.0, 0.05), "top_k": (0, 1), "min_p": (0.0, 0.01),
         "repeat_penalty": (1.0, 0.05), "seed": (-1, 1), "max_new_tokens": (0, 1), "loop_guard": (0, 1),
         "context_length": (0, 1)}


def answer_box(name: str) -> QSpinBox | QDoubleSpinBox:
    """The spin box of one answer field, spanning its limit (engine/limits.py), with its words for off and None;
    validate() names any value inside the box that the limit refuses (top-p 0, a context of 5)."""
    limit, (low, step) = LIMITS[name], BOXES[name]
    if limit.kind is float:
        box = QDoubleSpinBox()
        box.setDecimals(2)
        box.setRange(low, limit.high - 0.01 if limit.open_high else limit.high)
    else:
        box = QSpinBox()
        box.setRange(low, int(min(limit.high, 2**31 - 1)))
    box.setSingleStep(step)
    box.setAccessibleName(limit.label)
    words = SPECIAL.get(name) or (NONE_SHOWN[name][0] if name in NONE_SHOWN else "") or (limit.zero if low == 0 else "")
    if words:
        box.setSpecialValueText(words)
    return box


def box_value(name: str, box) -> float | int | None:
    value = box.value()
    return None if name in NONE_SHOWN and value == NONE_SHOWN[name][1] else value


def show_value(name: str, box, value) -> None:
    box.setValue(NONE_SHOWN[name][1] if value is None else value)
DEFAULTS = Settings()


def _on_off(value: bool) -> str:
    return "on" if value else "off"


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
        pages = [QWidget() for _ in range(3)]
        answers, speed, app = (self._form(page) for page in pages)

        # spin boxes span 0 to each limit's top; validate() names any value the table refuses (top-p 0)
        for name in ANSWER_FIELDS:
            setattr(self, name, answer_box(name))
        self.block_size = self._int("block_size", 0, top=max_block_size)
        self.block_size.setSpecialValueText("drafter's own")
        # the lowest value stands for "automatic" (None): the engine picks by device
        self.draft_cutoff = self._double("draft_cutoff", AUTOMATIC_CUTOFF, 0.01)
        self.draft_cutoff.setMaximum(0.99)
        self.draft_cutoff.setSpecialValueText("automatic")
        self.plain_fallback = QCheckBox("Switch to plain decoding when DFlash does not pay")
        self.plain_fallback.setAccessibleName("Plain fallback")
        self.offline = QCheckBox("Offline: no downloads and no connection checks")
        self.offline.setAccessibleName("Offline mode")
        self.engine = QComboBox()
        self.engine.setAccessibleName("Engine")
        self._engines = ["auto"] + [name for name, _ in engines]
        self.engine.addItems(["Automatic (the model list's choice)"] + [label for _, label in engines])
        self.theme = QComboBox()
        self.theme.addItems([t.capitalize() for t in THEMES])
        self.theme.setAccessibleName("Theme")
        self.font_size = QSpinBox()
        self.font_size.setRange(1, 100)      # wider than FONT_SIZES: validate() explains a refused size
        self.font_size.setAccessibleName("Font size in points")
        self.server_port = QSpinBox()
        self.server_port.setRange(*PORTS)
        self.server_port.setAccessibleName("Local server port")
        self.server_api_key = QLineEdit()
        self.server_api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_api_key.setPlaceholderText("none: any program on this computer may use it")
        self.server_api_key.setAccessibleName("Local server API key")
        self._tooltips()
        self._fill(settings)

        for name in ANSWER_FIELDS:
            answers.addRow(LIMITS[name].label, getattr(self, name))
        form = speed
        if max_block_size == 1:         # no drafter: every answer is plain decoding, nothing to size
            label = "Block size (no drafter loaded)"
            self.block_size.setEnabled(False)
        else:
            label = f"Block size (1–{max_block_size})" if max_block_size else "Block size (up to the drafter's)"
        form.addRow(label, self.block_size)
        form.addRow(LIMITS["draft_cutoff"].label, self.draft_cutoff)
        form.addRow("", self.plain_fallback)
        if len(engines) > 1:
            form.addRow("Engine", self.engine)
        app.addRow("", self.offline)
        app.addRow("Theme", self.theme)
        app.addRow("Font size", self.font_size)
        app.addRow("Local server port", self.server_port)
        app.addRow("Local server API key", self.server_api_key)
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Settings pages")
        for page, title in zip(pages, ("Answers", "Speed", "App")):
            self.tabs.addTab(page, title)

        self.error = QLabel("")
        self.error.setObjectName("warning")
        self.error.setWordWrap(True)
        self.error.setAccessibleName("Settings error")
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel |
                                   QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.reset_button = buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
        self.reset_button.setText("Reset to defaults")
        self.reset_button.setAccessibleName("Reset every field to its default")
        self.reset_button.setToolTip("Fill every field with its default value. Nothing changes until you press "
                                     "OK; Cancel keeps your settings as they were.")
        self.reset_button.clicked.connect(self.reset)
        self.buttons = buttons
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    @staticmethod
    def _form(page: QWidget) -> QFormLayout:
        form = QFormLayout(page)
        form.setHorizontalSpacing(16)
        form.setVerticalSpacing(8)
        return form

    def _double(self, name: str, lo: float, step: float) -> QDoubleSpinBox:
        limit = LIMITS[name]
        box = QDoubleSpinBox()
        box.setRange(lo, limit.high)
        box.setSingleStep(step)
        box.setDecimals(2)
        box.setAccessibleName(limit.label)
        return box

    def _int(self, name: str, lo: int, top: int | None = None) -> QSpinBox:
        limit = LIMITS[name]
        box = QSpinBox()
        box.setRange(lo, int(min(top or limit.high, limit.high)))
        box.setAccessibleName(limit.label)
        return box

    def _tooltips(self) -> None:
        """What each field does, its range and its default, all read from the tables (engine/limits.py and
        dflash_desktop/settings.py), so a tooltip cannot disagree with what validate() accepts."""
        def tip(widget: QWidget, text: str, span: str, default: str) -> None:
            widget.setToolTip(f"{text}\n{span}. Default: {default}.")

        def shown(box, value) -> str:   # a default as the box shows it ("drafter's own", "0 (greedy)")
            if box.specialValueText() and value <= box.minimum():
                return box.specialValueText()
            return box.textFromValue(value)

        for name in ANSWER_FIELDS:
            limit, box, value = LIMITS[name], getattr(self, name), getattr(DEFAULTS, name)
            span = limit.describe() + (f", or {NONE_SHOWN[name][0]}" if name in NONE_SHOWN else "")
            tip(box, limit.help, f"Range: {span}", f"0 ({limit.zero})" if limit.zero and value == 0
                else shown(box, NONE_SHOWN[name][1] if value is None else value))
        block = LIMITS["block_size"]
        tip(self.block_size, block.help, f"Range: 0 (the drafter's own) or 1 to {self.block_size.maximum()}"
            + ("" if self.max_block_size else ", and at most the drafter's block size"),
            shown(self.block_size, DEFAULTS.block_size))
        cutoff = LIMITS["draft_cutoff"]
        tip(self.draft_cutoff, cutoff.help, f"Range: automatic, or {cutoff.describe()}",
            "automatic" if DEFAULTS.draft_cutoff is None else shown(self.draft_cutoff, DEFAULTS.draft_cutoff))
        tip(self.plain_fallback, "When drafts keep being rejected, so that DFlash runs slower than plain decoding "
            "on this computer, the rest of the answer uses plain decoding. The text is the same either way.",
            "On or off", _on_off(DEFAULTS.plain_fallback))
        tip(self.offline, "Models already on this computer keep working; nothing is fetched.", "On or off",
            _on_off(DEFAULTS.offline))
        tip(self.engine, "Which engine runs the model. Automatic takes the model list's choice for this computer; "
            "the model reloads when this changes.", "Choices: the engines that can run the loaded model here",
            self.engine.itemText(0))
        tip(self.theme, "Colours of the whole window; System follows the light or dark mode of your computer. "
            "Applies at once.", "Choices: " + ", ".join(t.capitalize() for t in THEMES), DEFAULTS.theme.capitalize())
        tip(self.font_size, "The base text size of the whole window, in points; headings and figures scale with "
            "it. Applies at once.", f"Range: {FONT_SIZES[0]} to {FONT_SIZES[1]}", str(DEFAULTS.font_size))
        tip(self.server_port, "The port of the OpenAI-compatible server on 127.0.0.1 (Local server switch). "
            "Applies the next time the server starts.", f"Range: {PORTS[0]} to {PORTS[1]}", str(DEFAULTS.server_port))
        tip(self.server_api_key, "When set, clients must send Authorization: Bearer KEY.",
            "Printable characters without spaces", "none" if not DEFAULTS.server_api_key else "set")

    def _fill(self, settings: Settings) -> None:
        """Show `settings` in the fields (the ones this dialog edits: FIELDS)."""
        for name in ANSWER_FIELDS:
            show_value(name, getattr(self, name), getattr(settings, name))
        self.block_size.setValue(settings.block_size)
        self.draft_cutoff.setValue(AUTOMATIC_CUTOFF if settings.draft_cutoff is None else settings.draft_cutoff)
        self.plain_fallback.setChecked(settings.plain_fallback)
        self.offline.setChecked(settings.offline)
        self.engine.setCurrentIndex(self._engines.index(settings.engine) if settings.engine in self._engines else 0)
        self.theme.setCurrentIndex(THEMES.index(settings.theme))
        self.font_size.setValue(settings.font_size)
        self.server_port.setValue(settings.server_port)
        self.server_api_key.setText(settings.server_api_key)

    def reset(self) -> None:
        """Fill the fields with the defaults; nothing is applied or saved until OK."""
        self._fill(DEFAULTS)
        self.error.hide()

    def values(self) -> Settings:
        answers = {name: box_value(name, getattr(self, name)) for name in ANSWER_FIELDS}
        return dataclasses.replace(
            self._base, **answers, block_size=self.block_size.value(),
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
