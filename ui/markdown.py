"""Render a (possibly half-streamed) answer into a QTextDocument: the Markdown that chat answers use (fenced
code with its language and a Copy link, headings, nested lists, block quotes, pipe tables, `inline code`,
**bold**, *italic*, [links](https://...)) plus a background tint on every character the drafter wrote.

Qt's own setMarkdown() cannot carry per-character provenance, so we build the document with a cursor:
every visible run keeps its offset in the source text, which is how the drafted spans find their
characters. An unterminated ``` fence (mid-stream) already renders as code; a table renders once its
separator row has arrived. Links become clickable only for LINK_SCHEMES; any other is shown as text.
"""
from __future__ import annotations

import bisect
import itertools
import re

from PySide6.QtGui import (QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor,
                           QTextDocument, QTextFrameFormat, QTextTableFormat)

from . import theme

_INLINE = re.compile(r"`(?P<code>[^`\n]+)`|\*\*(?P<bold>[^*\n]+)\*\*|\[(?P<label>[^\]\n]+)\]\((?P<url>[^)\s]+)\)"
                     r"|(?<![*\w])\*(?P<star>[^*\s](?:[^*\n]*[^*\s])?)\*(?![*\w])"
                     r"|(?<!\w)_(?P<under>[^_\s](?:[^_\n]*[^_\s])?)_(?!\w)")
_QUOTE = re.compile(r"\s*>\s?")
_TABLE_RULE = re.compile(r"\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
LINK_SCHEMES = ("http", "https", "mailto")
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
           code_only: bool = False, copy_link: bool = True, prefix: str = "", copied: int | None = None) -> list[str]:
    """Fill `doc` with the rendered text; returns the code blocks' contents (for their Copy links).
    code_only renders everything as one code block (models that continue code instead of chatting);
    copy_link=False leaves out its "Copy code" line (the user's own prompt). prefix (code_only): the prompt
    the text continues, drawn dimmed before it so indentation reads right, and copied with it. copied: the
    code block whose link says "Copied" (just clicked)."""
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
    mono = theme.code_font()
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

    quote = QTextBlockFormat(para)
    quote.setLeftMargin(14)
    quoted = QTextCharFormat(plain)
    quoted.setForeground(QColor(colors.muted))
    style = _Styles(plain, code, quoted, link, base_pt, QColor(colors.accent))

    blocks: list[list[str]] = []
    in_code, first = False, True
    if code_only:
        blocks.append([])
        in_code = True
        if copy_link:
            _new_block(cursor, header, True)
            link.setAnchorHref("copy:0")
            cursor.insertText("Copied" if copied == 0 else "Copy code", link)
            first = False
    lines = text.split("\n")
    starts = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    i = 0
    while i < len(lines):
        line, start = lines[i], starts[i]
        end = start + len(line)
        stripped = line.lstrip()
        if stripped.startswith("```") and not code_only:
            if not in_code:
                blocks.append([])
                lang = stripped[3:].strip() or "code"
                _new_block(cursor, header, first)
                first = False
                link.setAnchorHref(f"copy:{len(blocks) - 1}")
                cursor.insertText(f"{lang}  ·  {'Copied' if copied == len(blocks) - 1 else 'Copy code'}", link)
            else:   # closing fence: a little air under the code
                closing = cursor.blockFormat()
                closing.setBottomMargin(8)
                cursor.setBlockFormat(closing)
            in_code = not in_code
            i += 1
            continue
        if not in_code and _table_starts(lines, i):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            first = False
            _table(writer, [(lines[k], starts[k]) for k in (i, *range(i + 2, j))], style)
            i = j
            continue
        in_quote = _QUOTE.match(line) if not in_code else None
        _new_block(cursor, code_block if in_code else quote if in_quote else para, first)
        first = False
        i += 1
        if in_code:
            blocks[-1].append(line)
            writer.put(start, min(end, cut), prompt)
            writer.put(max(start, cut), end, code)
        elif in_quote:
            _inline_line(writer, line[in_quote.end():], start + in_quote.end(), style, quoted)
        else:
            _inline_line(writer, line, start, style)
    return ["\n".join(b) for b in blocks]


class _Styles:
    """The character formats one render uses, made once per render from the theme."""

    def __init__(self, plain, code, quoted, link, base_pt: float, accent: QColor):
        self.plain, self.code, self.quoted, self.base_pt = plain, code, quoted, base_pt
        self.link = QTextCharFormat(plain)
        self.link.setForeground(accent)
        self.link.setFontUnderline(True)


def _new_block(cursor: QTextCursor, fmt: QTextBlockFormat, first: bool) -> None:
    if first:
        cursor.setBlockFormat(fmt)
    else:
        cursor.insertBlock(fmt)


def _table_starts(lines: list[str], i: int) -> bool:
    """A pipe table: a row of at least two cells, then its separator row (|---|:--:|)."""
    head = lines[i].strip()
    return (head.startswith("|") and head.count("|") >= 2 and i + 1 < len(lines)
            and bool(_TABLE_RULE.match(lines[i + 1])) and "|" in lines[i + 1])


def _cells(line: str, offset: int) -> list[tuple[str, int]]:
    """The cells of one table row with the source offset of each (outer pipes dropped, spaces trimmed)."""
    bars = [k for k, ch in enumerate(line) if ch == "|"]
    if not line.rstrip().endswith("|"):     # a row without its closing pipe (or still streaming)
        bars.append(len(line))
    out = []
    for a, b in zip(bars, bars[1:]):
        cell = line[a + 1:b]
        lead = len(cell) - len(cell.lstrip())
        out.append((cell.strip(), offset + a + 1 + lead))
    return out


def _table(writer: "_Writer", rows: list[tuple[str, int]], style: _Styles) -> None:
    """rows[0] is the header (bold); later rows with more cells than the header keep the extra text in
    their last cell, so nothing the model wrote disappears."""
    header = _cells(*rows[0])
    width = len(header)
    fmt = QTextTableFormat()
    fmt.setCellPadding(4)
    fmt.setCellSpacing(0)
    fmt.setBorder(0.5)
    fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
    fmt.setHeaderRowCount(1)
    outer = writer.cursor
    table = outer.insertTable(len(rows), width, fmt)
    bold = QTextCharFormat(style.plain)
    bold.setFontWeight(QFont.Weight.Bold)
    for r, (line, offset) in enumerate(rows):
        cells = _cells(line, offset)
        if len(cells) > width:
            last_start = cells[width - 1][1]
            cells = cells[:width - 1] + [(line[last_start - offset:].rstrip().rstrip("|").rstrip(), last_start)]
        for c, (cell, at) in enumerate(cells):
            writer.cursor = table.cellAt(r, c).firstCursorPosition()
            _inline_line(writer, cell, at, style, bold if r == 0 else None)
    writer.cursor = outer
    outer.movePosition(QTextCursor.MoveOperation.End)


def _inline_line(writer: _Writer, line: str, offset: int, style: _Styles, base_fmt: QTextCharFormat | None = None) -> None:
    base = QTextCharFormat(base_fmt or style.plain)
    i = 0
    heading = _HEADING.match(line)
    bullet = _BULLET.match(line) if not heading else None
    if heading:
        base.setFontWeight(QFont.Weight.DemiBold)
        base.setFontPointSize(style.base_pt * (1.5 - 0.08 * len(heading.group(1))))
        i = heading.end()
    elif bullet:
        marker = bullet.group(2)
        writer.cursor.insertText(bullet.group(1).replace("\t", "    ") + ("•" if marker in "-*+" else marker) + " ",
                                 base)
        i = bullet.end()
    for m in _INLINE.finditer(line, i):
        writer.put(offset + i, offset + m.start(), base)
        kind = m.lastgroup if m.lastgroup != "url" else "label"
        fmt = QTextCharFormat(base)
        if kind == "code":
            fmt = style.code
        elif kind == "bold":
            fmt.setFontWeight(QFont.Weight.Bold)
        elif kind in ("star", "under"):
            fmt.setFontItalic(True)
        else:   # a link: its text, clickable only for the schemes the app opens
            url = m.group("url")
            fmt = QTextCharFormat(style.link)
            if url.split(":", 1)[0].lower() in LINK_SCHEMES and ":" in url:
                fmt.setAnchor(True)
                fmt.setAnchorHref(url)
                fmt.setToolTip(url)
            else:
                fmt.setFontUnderline(False)
                fmt.setToolTip(f"{url} (not opened: only web and mail links open from an answer)")
        writer.put(offset + m.start(kind), offset + m.end(kind), fmt)
        i = m.end()
    writer.put(offset + i, offset + len(line), base)
