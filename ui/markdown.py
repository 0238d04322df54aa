"""Render a (possibly half-streamed) answer into a QTextDocument: a small Markdown subset (fenced code,
headings, lists, `inline code`, **bold**) plus a background tint on every character the drafter wrote.

Qt's own setMarkdown() cannot carry per-character provenance, so we build the document with a cursor:
every visible run keeps its offset in the source text, which is how the drafted spans find their
characters. An unterminated ``` fence (mid-stream) already renders as code.
"""
from __future__ import annotations

import bisect
import re

from PySide6.QtGui import (QColor, QFont, QFontDatabase, QTextBlockFormat, QTextCharFormat, QTextCursor,
                           QTextDocument)

from . import theme

_INLINE = re.compile(r"`([^`\n]+)`|\*\*([^*\n]+)\*\*")
_HEADING = re.compile(r"(#{1,6})\s+")
_BULLET = re.compile(r"(\s*)([-*+]|\d+[.)])\s+")


def drafted_intervals(spans: list | None) -> list[tuple[int, int]]:
    """[[text, drafted], ...] -> sorted (start, end) character ranges written by the drafter."""
    out, pos = [], 0
    for text, drafted in spans or []:
        if drafted and text:
            if out and out[-1][1] == pos:
                out[-1] = (out[-1][0], pos + len(text))
            else:
                out.append((pos, pos + len(text)))
        pos += len(text)
    return out


def mono_font() -> QFont:
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


class _Writer:
    """Inserts source ranges with a base format, splitting them where drafted ranges begin and end."""

    def __init__(self, cursor: QTextCursor, source: str, intervals, tint: QColor | None):
        self.cursor, self.source, self.intervals, self.tint = cursor, source, intervals, tint
        self.starts = [a for a, _ in intervals]

    def put(self, start: int, end: int, fmt: QTextCharFormat) -> None:
        if start >= end:
            return
        if self.tint is None:
            self.cursor.insertText(self.source[start:end], fmt)
            return
        drafted_fmt = QTextCharFormat(fmt)
        drafted_fmt.setBackground(self.tint)
        drafted_fmt.setProperty(QTextCharFormat.Property.UserProperty, True)
        pos = start
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while pos < end:
            a, b = self.intervals[i] if i < len(self.intervals) else (end, end)
            if b <= pos:
                i += 1
                continue
            if a > pos:
                stop = min(a, end)
                self.cursor.insertText(self.source[pos:stop], fmt)
                pos = stop
            else:
                stop = min(b, end)
                self.cursor.insertText(self.source[pos:stop], drafted_fmt)
                pos = stop
                i += 1


def render(doc: QTextDocument, text: str, spans: list | None = None, highlight: bool = False,
           code_only: bool = False, copy_link: bool = True, prefix: str = "") -> list[str]:
    """Fill `doc` with the rendered text; returns the code blocks' contents (for their Copy links).
    code_only renders everything as one code block (models that continue code instead of chatting);
    copy_link=False leaves out its "Copy code" line (the user's own prompt). prefix (code_only): the prompt
    the text continues, drawn dimmed before it so indentation reads right, and copied with it."""
    colors = theme.current()
    doc.clear()
    doc.setDocumentMargin(2)
    cursor = QTextCursor(doc)
    prefix = prefix if code_only else ""
    cut = len(prefix)
    text = prefix + text
    intervals = [(a + cut, b + cut) for a, b in drafted_intervals(spans)] if highlight else []
    tint = QColor(colors.drafted) if highlight else None
    writer = _Writer(cursor, text, intervals, tint)

    plain, code = QTextCharFormat(), QTextCharFormat()
    plain.setForeground(QColor(colors.text))
    base_pt = doc.defaultFont().pointSizeF() if doc.defaultFont().pointSizeF() > 0 else 10.0
    mono = mono_font()
    mono.setPointSizeF(base_pt * 0.95)
    code.setFont(mono)
    code.setForeground(QColor(colors.text))
    prompt = QTextCharFormat(code)
    prompt.setForeground(QColor(colors.muted))
    prompt.setToolTip("Your prompt: the model continues it")
    para = QTextBlockFormat()
    para.setBottomMargin(2)
    code_block = QTextBlockFormat()
    code_block.setBackground(QColor(colors.code_bg))
    code_block.setLeftMargin(8)
    code_block.setRightMargin(8)
    header = QTextBlockFormat(code_block)
    header.setTopMargin(6)
    link = QTextCharFormat()
    link.setForeground(QColor(colors.accent))
    link.setFontPointSize(max(7.0, base_pt - 1))
    link.setAnchor(True)

    blocks: list[list[str]] = []
    in_code, first = False, True
    if code_only:
        blocks.append([])
        in_code = True
        if copy_link:
            _new_block(cursor, header, True)
            link.setAnchorHref("copy:0")
            cursor.insertText("Copy code", link)
            first = False
    pos = 0
    for line in text.split("\n"):
        start, end = pos, pos + len(line)
        pos = end + 1
        stripped = line.lstrip()
        if stripped.startswith("```") and not code_only:
            if not in_code:
                blocks.append([])
                lang = stripped[3:].strip()
                _new_block(cursor, header, first)
                first = False
                link.setAnchorHref(f"copy:{len(blocks) - 1}")
                cursor.insertText(f"{lang + '  ·  ' if lang else ''}Copy code", link)
            else:   # closing fence: a little air under the code
                closing = cursor.blockFormat()
                closing.setBottomMargin(8)
                cursor.setBlockFormat(closing)
            in_code = not in_code
            continue
        _new_block(cursor, code_block if in_code else para, first)
        first = False
        if in_code:
            blocks[-1].append(line)
            writer.put(start, min(end, cut), prompt)
            writer.put(max(start, cut), end, code)
            continue
        _inline_line(writer, line, start, plain, code, base_pt)
    return ["\n".join(b) for b in blocks]


def _new_block(cursor: QTextCursor, fmt: QTextBlockFormat, first: bool) -> None:
    if first:
        cursor.setBlockFormat(fmt)
    else:
        cursor.insertBlock(fmt)


def _inline_line(writer: _Writer, line: str, offset: int, plain: QTextCharFormat, code: QTextCharFormat,
                 base_pt: float) -> None:
    base = QTextCharFormat(plain)
    i = 0
    heading = _HEADING.match(line)
    bullet = _BULLET.match(line) if not heading else None
    if heading:
        base.setFontWeight(QFont.Weight.DemiBold)
        base.setFontPointSize(base_pt * (1.5 - 0.08 * len(heading.group(1))))
        i = heading.end()
    elif bullet:
        marker = bullet.group(2)
        writer.cursor.insertText(bullet.group(1) + ("•" if marker in "-*+" else marker) + " ", plain)
        i = bullet.end()
    for m in _INLINE.finditer(line, i):
        writer.put(offset + i, offset + m.start(), base)
        if m.group(1) is not None:
            writer.put(offset + m.start(1), offset + m.end(1), code)
        else:
            bold = QTextCharFormat(base)
            bold.setFontWeight(QFont.Weight.Bold)
            writer.put(offset + m.start(2), offset + m.end(2), bold)
        i = m.end()
    writer.put(offset + i, offset + len(line), base)
