"""Markdown in answers through the real renderer and a real MessageWidget: tables, italics, quotes, nested
lists and links keep the drafter's tint on exactly the characters it wrote; links open in the browser
only for web and mail schemes (the browser is the one thing replaced: none can run here); code blocks
carry their language and a Copy link that says "Copied" for a moment; every streamed prefix renders."""
from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCharFormat, QTextDocument, QTextTable

from ui import markdown, message_widget
from ui.message_widget import MessageWidget

ANSWER = ("## Results\nSome *italic* text, `snake_case_name` and a [guide](https://example.com/guide).\n"
          "> a quoted *line*\n\n| name | tok/s |\n|:-----|------:|\n| torch | **132** |\n| llama.cpp | 664 |\n\n"
          "- first\n  - nested\n```python\nprint('hi')\n```\n```\nplain block\n```\n"
          "Not opened: [run](file:///etc/passwd).")


def fragments(doc: QTextDocument):
    """(text, char format) of every run of the document, tables included."""
    out = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            out.append((frag.text(), frag.charFormat()))
            it += 1
        block = block.next()
    return out


def tables(doc: QTextDocument) -> list[QTextTable]:
    return [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]


def test_tables_italics_quotes_lists_and_code_labels(qapp):
    doc = QTextDocument()
    blocks = markdown.render(doc, ANSWER)
    assert blocks == ["print('hi')", "plain block"]
    plain = doc.toPlainText()
    for marker in ("##", "*italic*", "](", "> a", "|---", "```"):
        assert marker not in plain, marker
    assert "python  ·  Copy code" in plain and "code  ·  Copy code" in plain and "• nested" in plain
    [table] = tables(doc)
    assert (table.rows(), table.columns()) == (3, 2)
    assert [table.cellAt(r, c).firstCursorPosition().block().text() for r in range(3) for c in range(2)] == \
        ["name", "tok/s", "torch", "132", "llama.cpp", "664"]
    runs = dict((text, fmt) for text, fmt in fragments(doc))
    assert runs["italic"].fontItalic() and runs["line"].fontItalic()
    assert runs["name"].fontWeight() > 500 and runs["132"].fontWeight() > 500     # header and **bold**
    assert runs["guide"].isAnchor() and runs["guide"].anchorHref() == "https://example.com/guide"
    assert not runs["run"].isAnchor() and "not opened" in runs["run"].toolTip()
    assert "snake_case_name" in runs                                              # no italics inside names
    quote_block = next(b for b in (doc.findBlock(p) for p in range(doc.characterCount()))
                       if b.text().startswith("a quoted"))
    assert quote_block.blockFormat().leftMargin() > 0


def test_the_tint_covers_exactly_the_drafted_characters_in_tables_links_and_quotes(qapp):
    drafted = ["italic", "guide", "line", "132", "nested"]
    spans, pos = [], 0
    for word in drafted:
        at = ANSWER.index(word, pos)
        spans += [[ANSWER[pos:at], False], [word, True]]
        pos = at + len(word)
    spans.append([ANSWER[pos:], False])
    doc = QTextDocument()
    markdown.render(doc, ANSWER, spans, highlight=True)
    tinted = [text for text, fmt in fragments(doc) if fmt.property(QTextCharFormat.Property.UserProperty)]
    assert tinted == drafted


def test_every_streamed_prefix_renders(qapp):
    doc = QTextDocument()
    for end in range(len(ANSWER) + 1):
        markdown.render(doc, ANSWER[:end], [[ANSWER[:end], True]], highlight=True)
    assert doc.toPlainText().endswith("Not opened: run.")


def test_links_open_in_the_browser_only_for_web_and_mail(qtbot, monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda url: opened.append(url.toString()) or True))
    widget = MessageWidget("assistant")
    qtbot.addWidget(widget)
    widget.set_content(ANSWER)
    for url in ("https://example.com/guide", "mailto:team@example.com", "file:///etc/passwd", "javascript:x()"):
        widget.browser.anchorClicked.emit(QUrl(url))
    assert opened == ["https://example.com/guide", "mailto:team@example.com"]


def test_copy_links_and_the_copy_button_say_copied_for_a_moment(qtbot, monkeypatch):
    monkeypatch.setattr(message_widget, "COPIED_MS", 100)
    widget = MessageWidget("assistant")
    qtbot.addWidget(widget)
    widget.set_content(ANSWER)
    widget.browser.anchorClicked.emit(QUrl("copy:1"))
    assert QGuiApplication.clipboard().text() == "plain block"
    plain = widget.browser.toPlainText()
    assert "code  ·  Copied" in plain and "python  ·  Copy code" in plain
    qtbot.waitUntil(lambda: "code  ·  Copy code" in widget.browser.toPlainText(), timeout=2000)
    widget.copy_button.click()
    assert QGuiApplication.clipboard().text() == ANSWER and widget.copy_button.text() == "Copied"
    qtbot.waitUntil(lambda: widget.copy_button.text() == "Copy", timeout=2000)
