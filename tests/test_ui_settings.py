"""The settings dialog (issue 22, item 10): a tooltip with range and default on every field, read from the
tables; Reset to defaults that only fills the fields; the status bar following the block size; and a theme
or font change that restyles every widget at once, the legend, starter cards, stats titles and answers
included. Real window, real worker (echo pair: every token drafted, so answers carry the drafted tint)."""
from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (QAbstractSpinBox, QApplication, QCheckBox, QComboBox, QLabel, QLineEdit,
                               QWidget)

from dflash_desktop import settings as settings_mod
from dflash_desktop.settings import FONT_SIZES, PORTS, Settings
from engine.limits import LIMITS
from ui import theme
from ui.settings_dialog import FIELDS

from .ui_chat_fixtures import chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401

INPUTS = (QAbstractSpinBox, QComboBox, QCheckBox, QLineEdit)


def inputs_of(dialog) -> list:
    """Every input widget of the dialog (a spin box's own line edit is part of the spin box)."""
    return [w for w in dialog.findChildren(QWidget) if isinstance(w, INPUTS)
            and not (isinstance(w, QLineEdit) and isinstance(w.parent(), QAbstractSpinBox))]


@pytest.fixture
def restore_theme(qapp):
    """The theme is app-wide: put it back for the tests that follow."""
    choice, size = theme.current().name, qapp.font().pointSize()
    yield
    theme.apply(qapp, choice, size)


def test_every_field_has_a_tooltip_with_its_range_and_default_from_the_tables(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    dialog = window.open_settings()
    fields = inputs_of(dialog)
    assert len(fields) >= 12, [w.accessibleName() for w in fields]
    untipped = [w.accessibleName() or type(w).__name__ for w in fields if not w.toolTip().strip()]
    assert untipped == []
    for w in fields:
        assert "Default: " in w.toolTip() and w.accessibleName(), w.accessibleName()
    for name in ("temperature", "top_p", "top_k", "max_new_tokens", "draft_cutoff"):
        tip = getattr(dialog, name).toolTip()
        assert LIMITS[name].help in tip and LIMITS[name].describe() in tip, name
    assert f"Default: {LIMITS['max_new_tokens'].default}." in dialog.max_new_tokens.toolTip()
    assert f"1 to {window.session.loaded.block_size}" in dialog.block_size.toolTip()
    assert f"{FONT_SIZES[0]} to {FONT_SIZES[1]}. Default: {Settings().font_size}." in dialog.font_size.toolTip()
    assert f"{PORTS[0]} to {PORTS[1]}. Default: {Settings().server_port}." in dialog.server_port.toolTip()
    assert dialog.reset_button.toolTip()
    dialog.reject()


def test_reset_fills_the_defaults_and_cancel_still_cancels(qtbot, home, chat_worker, echo_pair):
    custom = Settings(temperature=0.7, top_k=40, max_new_tokens=24, block_size=4, draft_cutoff=0.2,
                      plain_fallback=False, offline=True, theme="dark", font_size=14, server_port=9000,
                      server_api_key="secret")
    window = make_window(qtbot, chat_worker, echo_pair, settings=dataclasses.replace(custom))
    dialog = window.open_settings()
    dialog.top_p.setValue(0.0)
    dialog.accept()
    assert dialog.isVisible() and dialog.error.isVisible()          # a refused value is explained...
    dialog.reset_button.click()
    assert not dialog.error.isVisible() and dialog.isVisible()      # ...and reset only fills the fields
    shown = dialog.values()
    for field in FIELDS:
        assert getattr(shown, field) == getattr(Settings(), field), field
    assert dialog.block_size.text() == "drafter's own" and dialog.draft_cutoff.text() == "automatic"
    dialog.reject()
    assert [getattr(window.settings, f) for f in FIELDS] == [getattr(custom, f) for f in FIELDS]   # Cancel
    dialog = window.open_settings()
    assert dialog.temperature.value() == 0.7
    dialog.reset_button.click()
    dialog.accept()
    assert not dialog.isVisible()
    saved = settings_mod.load()
    for field in FIELDS:
        assert getattr(window.settings, field) == getattr(saved, field) == getattr(Settings(), field), field


def test_the_status_bar_follows_the_block_size(qtbot, home, chat_worker, echo_pair, restore_theme):
    window = make_window(qtbot, chat_worker, echo_pair)
    drafters = window.session.loaded.block_size
    assert window.pair_label.text().endswith(f"block {drafters}")
    dialog = window.open_settings()
    dialog.block_size.setValue(drafters // 2)
    dialog.accept()
    assert f"block {drafters // 2} (drafter's {drafters})" in window.pair_label.text()
    assert send_and_wait(qtbot, window, "x")["stats"]["block_size"] == drafters // 2
    dialog = window.open_settings()
    dialog.block_size.setValue(0)
    dialog.accept()
    assert window.pair_label.text().endswith(f"block {drafters}")


def test_theme_and_font_restyle_every_widget_at_once(qtbot, home, chat_worker, echo_pair, restore_theme):
    app = QApplication.instance()
    theme.apply(app, "light", 11)
    window = make_window(qtbot, chat_worker, echo_pair, settings=Settings(max_new_tokens=8, draft_cutoff=0.0,
                                                                          theme="light", font_size=11))
    view, panel = window.chat_view, window.stats_panel
    answer = send_and_wait(qtbot, window, "def f(x):")
    assert answer["event"] == "done"
    bubble = view.messages[-1]
    card = view.example_buttons[0]
    section = next(w for w in panel.findChildren(QLabel) if w.objectName() == "section")
    big = panel.dflash_metric.value
    before = {"card": card.label.font().pointSizeF(), "section": section.font().pointSizeF(),
              "big": big.font().pointSizeF(), "dock": panel.font().pointSizeF(),
              "window": window.palette().color(QPalette.ColorRole.Window).name()}
    assert theme.LIGHT.drafted in panel.legend.text() and theme.LIGHT.drafted in bubble.browser.toHtml()

    dialog = window.open_settings()
    dialog.theme.setCurrentIndex(2)       # dark
    dialog.font_size.setValue(16)
    dialog.accept()
    assert not dialog.isVisible()

    assert window.palette().color(QPalette.ColorRole.Window).name() == theme.DARK.window != before["window"]
    assert theme.DARK.drafted in panel.legend.text() and theme.LIGHT.drafted not in panel.legend.text()
    assert theme.DARK.drafted in bubble.browser.toHtml() and theme.LIGHT.drafted not in bubble.browser.toHtml()
    assert card.label.font().pointSizeF() == 16 > before["card"]
    assert card.label.font().fixedPitch() or card.label.font().family() == theme.code_font().family()
    assert panel.font().pointSizeF() == 16 > before["dock"]
    assert section.font().pointSizeF() == 16 > before["section"]
    assert big.font().pointSizeF() > before["big"] and big.font().pointSizeF() > 16
    assert card.palette().color(QPalette.ColorRole.WindowText).name() == theme.DARK.text


def test_a_widget_made_later_needs_nothing_to_follow_the_theme(qtbot, home, chat_worker, echo_pair, restore_theme):
    """The fix is at the source: the starter cards of a chat model and the code cards take only a family, and
    the legend re-renders through theme.follow, without the settings code naming them."""
    app = QApplication.instance()
    theme.apply(app, "light", 10)
    window = make_window(qtbot, chat_worker, echo_pair)
    window.chat_view.set_examples(True)             # the chat model's cards, made after the theme was applied
    card = window.chat_view.example_buttons[0]
    theme.apply(app, "dark", 15)
    assert card.label.font().pointSizeF() == 15
    assert theme.DARK.drafted in window.stats_panel.legend.text()


def test_without_a_drafter_the_block_size_says_so_instead_of_a_range_of_one(qtbot):
    from dflash_desktop.settings import Settings
    from PySide6.QtWidgets import QFormLayout, QLabel
    from ui.settings_dialog import SettingsDialog
    for drafters, label, enabled in ((1, "Block size (no drafter loaded)", False), (16, "Block size (1–16)", True),
                                     (None, "Block size (up to the drafter's)", True)):
        dialog = SettingsDialog(Settings(), drafters)
        qtbot.addWidget(dialog)
        shown = next(f.labelForField(dialog.block_size) for f in dialog.findChildren(QFormLayout)
                     if f.labelForField(dialog.block_size))
        assert isinstance(shown, QLabel) and shown.text() == label and dialog.block_size.isEnabled() is enabled
