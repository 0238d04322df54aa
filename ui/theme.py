"""Light and dark palettes plus one small style sheet, applied app-wide.

We use the Fusion style everywhere so the app looks the same on every platform and both themes are
under our control; "system" follows the platform's colour scheme when Qt can tell.

A theme or font change reaches every widget by itself as long as widgets never freeze a style: sizes and
colours go in the style sheet below, keyed by object name (a widget's own setStyleSheet with a colour
or setFont with a point size keeps the old one), and a font set for its family alone (code_font) keeps
following the base size. Only theme colours drawn into rich text and documents need a hand: follow().
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontDatabase, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Colors:
    name: str
    window: str
    base: str
    alt: str
    text: str
    muted: str
    border: str
    accent: str
    accent_text: str
    user_bubble: str
    assistant_bubble: str
    code_bg: str
    drafted: str       # background tint for tokens that came from the drafter
    error_bg: str
    error_border: str
    good: str
    warn: str


LIGHT = Colors("light", window="#f4f5f7", base="#ffffff", alt="#eef0f3", text="#1d2025", muted="#6b7280",
               border="#d9dce1", accent="#3b6fe0", accent_text="#ffffff", user_bubble="#e8effd",
               assistant_bubble="#ffffff", code_bg="#f3f4f6", drafted="#d8f3dc", error_bg="#fdecec",
               error_border="#e5a3a3", good="#1f9d55", warn="#b7791f")
DARK = Colors("dark", window="#1c1e22", base="#24272c", alt="#2b2f35", text="#e6e8eb", muted="#9aa1ab",
              border="#3a3f47", accent="#6b96f5", accent_text="#0e1116", user_bubble="#2c3a55",
              assistant_bubble="#262a30", code_bg="#1a1c20", drafted="#1f4a2e", error_bg="#4a2326",
              error_border="#8c3b40", good="#4cc38a", warn="#e0a84c")

_current = LIGHT


class _Notifier(QObject):
    changed = Signal()


_notifier = _Notifier()


def current() -> Colors:
    return _current


def follow(restyle: Callable[[], None]) -> None:
    """Call `restyle` after every apply(): for theme colours and sizes drawn into rich text, documents and
    charts, which no style sheet reaches. Pass a widget's bound method: Qt drops the connection with it."""
    _notifier.changed.connect(restyle)


def code_font() -> QFont:
    """The fixed-width family alone: unlike a whole QFont, it leaves the size to follow the base font."""
    font = QFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family())
    font.setStyleHint(QFont.StyleHint.Monospace)
    return font


def resolve(choice: str) -> Colors:
    if choice == "dark":
        return DARK
    if choice == "light":
        return LIGHT
    hints = QGuiApplication.styleHints()
    return DARK if hints.colorScheme() == Qt.ColorScheme.Dark else LIGHT


def palette(c: Colors) -> QPalette:
    p = QPalette()
    roles = {QPalette.ColorRole.Window: c.window, QPalette.ColorRole.WindowText: c.text,
             QPalette.ColorRole.Base: c.base, QPalette.ColorRole.AlternateBase: c.alt,
             QPalette.ColorRole.Text: c.text, QPalette.ColorRole.Button: c.alt,
             QPalette.ColorRole.ButtonText: c.text, QPalette.ColorRole.Highlight: c.accent,
             QPalette.ColorRole.HighlightedText: c.accent_text, QPalette.ColorRole.ToolTipBase: c.base,
             QPalette.ColorRole.ToolTipText: c.text, QPalette.ColorRole.PlaceholderText: c.muted,
             QPalette.ColorRole.Link: c.accent, QPalette.ColorRole.Mid: c.border}
    for role, value in roles.items():
        p.setColor(role, QColor(value))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(c.muted))
    return p


def style_sheet(c: Colors, font_size: int = 11) -> str:
    """Sizes follow the base font size, so a larger font never leaves a fixed-size heading behind."""
    big, title = round(font_size * 1.5), round(font_size * 1.6)
    return f"""
    QToolBar {{ border: none; border-bottom: 1px solid {c.border}; spacing: 4px; padding: 4px 6px; }}
    QToolBar QToolButton {{ padding: 4px 8px; border-radius: 6px; }}
    QToolBar QToolButton:checked {{ background: {c.alt}; }}
    QToolBar QToolButton:hover {{ background: {c.alt}; }}
    QToolBar QToolButton#qt_toolbar_ext_button {{ padding: 0px; border: 1px solid {c.border}; }}
    QStatusBar {{ border-top: 1px solid {c.border}; }}
    QFrame#modelBar {{ background: {c.alt}; border-bottom: 1px solid {c.border}; }}
    QLabel#modelLine {{ font-weight: 600; }}
    QFrame#modelBar QToolButton {{ padding: 3px 10px; border: 1px solid {c.border}; border-radius: 6px;
                                   background: {c.base}; }}
    QFrame#modelBar QToolButton:focus {{ border: 2px solid {c.accent}; }}
    QListView#conversationList {{ border: none; background: {c.alt}; padding: 6px; }}
    QListView#conversationList::item {{ padding: 8px 10px; border-radius: 6px; margin: 1px 0; }}
    QListView#conversationList::item:selected {{ background: {c.base}; color: {c.text}; }}
    QWidget#sidebar {{ background: {c.alt}; border-right: 1px solid {c.border}; }}
    QScrollArea#chatScroll, QWidget#chatColumn {{ background: {c.window}; border: none; }}
    QFrame#bubble_user {{ background: {c.user_bubble}; border-radius: 12px; }}
    QFrame#bubble_assistant {{ background: {c.assistant_bubble}; border: 1px solid {c.border}; border-radius: 12px; }}
    QFrame#bubble_error {{ background: {c.error_bg}; border: 1px solid {c.error_border}; border-radius: 12px; }}
    QTextBrowser {{ background: transparent; border: none; }}
    QLabel#role {{ color: {c.muted}; font-weight: 600; }}
    QLabel#footer, QLabel#muted, QLabel#hint {{ color: {c.muted}; }}
    QLabel#emptyTitle {{ font-size: {title}pt; font-weight: 600; }}
    QFrame#composer {{ background: {c.base}; border: 1px solid {c.border}; border-radius: 12px; }}
    QPlainTextEdit#input {{ background: transparent; border: none; }}
    QFrame#composer[focused="true"] {{ border: 2px solid {c.accent}; }}
    QLineEdit#systemPrompt {{ border: 1px solid {c.border}; border-radius: 6px; padding: 4px 8px; background: {c.base}; }}
    QPushButton#primary {{ background: {c.accent}; color: {c.accent_text}; border: none; border-radius: 8px;
                           padding: 6px 16px; font-weight: 600; }}
    QPushButton#primary:disabled {{ background: {c.border}; color: {c.muted}; }}
    QFrame#example {{ border: 1px solid {c.border}; border-radius: 10px; background: {c.base}; }}
    QFrame#example:hover {{ border-color: {c.accent}; }}
    QToolButton#msgAction {{ border: none; color: {c.muted}; padding: 2px 6px; border-radius: 4px; }}
    QToolButton#msgAction:hover {{ background: {c.alt}; color: {c.text}; }}
    QDockWidget > QWidget {{ background: {c.window}; }}
    QLabel#section {{ font-weight: 600; }}
    QDockWidget::title {{ padding: 6px 10px; font-weight: 600; }}
    QLabel#bigNumber {{ font-size: {big}pt; font-weight: 600; }}
    QToolButton#msgAction:focus, QToolBar QToolButton:focus {{ border: 2px solid {c.accent}; }}
    QFrame#example:focus {{ border: 2px solid {c.accent}; }}
    QPushButton#primary:focus {{ border: 2px solid {c.text}; }}
    QLineEdit#systemPrompt:focus, QListView#conversationList:focus {{ border: 2px solid {c.accent}; }}
    QLabel#warning {{ color: {c.warn}; }}
    QLabel#banner {{ background: {c.alt}; border: 1px solid {c.warn}; border-radius: 8px; padding: 6px 10px; }}
    QLineEdit#systemPrompt:disabled {{ background: {c.alt}; color: {c.muted}; }}
    """


def apply(app: QApplication, choice: str = "system", font_size: int | None = None) -> Colors:
    """Apply a theme (and base font size) to the whole application; returns the colours in use."""
    global _current
    _current = resolve(choice)
    app.setStyle("Fusion")
    app.setPalette(palette(_current))
    if font_size:
        font = QFont(app.font())
        font.setPointSize(font_size)
        app.setFont(font)
    app.setStyleSheet(style_sheet(_current, app.font().pointSize() if app.font().pointSize() > 0 else 11))
    _notifier.changed.emit()
    return _current
