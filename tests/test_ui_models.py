"""Qt item models pass pytest-qt's model tester, and the markdown renderer keeps text and provenance."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCharFormat, QTextCursor, QTextDocument

from dflash_desktop.chat_store import Conversation
from ui import markdown
from ui.models import ConversationListModel, relative_time


def test_conversation_model_passes_modeltester(qtmodeltester):
    model = ConversationListModel()
    now = time.time()
    model.set_conversations([Conversation(i, f"chat {i}", "", now - i, now - i * 100) for i in range(5)])
    qtmodeltester.check(model, force_py=True)
    index = model.index(2)
    assert index.data() == "chat 2" and index.data(ConversationListModel.IdRole) == 2
    assert model.roleNames()[ConversationListModel.TitleRole] == b"title"
    assert model.row_of(4) == 4 and model.row_of(99) == -1
    edited = []
    model.titleEdited.connect(lambda cid, title: edited.append((cid, title)))
    assert model.flags(index) & Qt.ItemFlag.ItemIsEditable
    assert model.setData(index, "  renamed  ") and index.data() == "renamed"
    assert not model.setData(index, "   ") and index.data() == "renamed"   # empty keeps the old title
    assert model.setData(index, "renamed")                                  # unchanged: no signal
    assert edited == [(2, "renamed")]
    model.set_conversations([])
    qtmodeltester.check(model, force_py=True)


def test_relative_time():
    now = time.time()
    assert relative_time(now - 5, now) == "just now" and relative_time(now - 300, now) == "5 min ago"


def test_markdown_code_blocks_inline_and_drafted_ranges(qapp):
    text = "Use `len`:\n```python\nx = len(a)\n```\n**done**"
    spans = [["Use `len`:\n```python\nx = ", False], ["len(a)", True], ["\n```\n**done**", False]]
    doc = QTextDocument()
    blocks = markdown.render(doc, text, spans, highlight=True)
    assert blocks == ["x = len(a)"]
    plain = doc.toPlainText()
    assert "```" not in plain and "**" not in plain and "x = len(a)" in plain and "Copy code" in plain
    cursor, tinted = QTextCursor(doc), ""
    for pos in range(1, doc.characterCount()):
        cursor.setPosition(pos)
        if cursor.charFormat().property(QTextCharFormat.Property.UserProperty):
            tinted += plain[pos - 1]
    assert tinted == "len(a)"
    assert markdown.drafted_intervals([["ab", True], ["c", True], ["d", False], ["e", True]]) == [(0, 3), (4, 5)]
    markdown.render(doc, "```\nunterminated", None)   # mid-stream fence renders as code already
    assert doc.toPlainText().endswith("unterminated")
    assert markdown.render(doc, "# not a heading\n```", None, code_only=True) == ["# not a heading\n```"]


def test_streaming_renders_keep_none_alive(qapp):
    """Re-rendering a long answer many times (as streaming does) must not drain None/True/False.
    PySide6 6.12.0 on Python 3.11 drops a reference on every void or bool Qt call and aborts the app
    after seconds of streaming; pyproject pins PySide6-Essentials below 6.12 for that reason."""
    import sys

    text = "x = 1\n" * 200 + "```python\n" + "y = 2\n" * 200 + "```\n"
    spans = [[text[i:i + 3], i % 2 == 0] for i in range(0, len(text), 3)]
    doc = QTextDocument()
    markdown.render(doc, text, spans, highlight=True)
    before = [sys.getrefcount(obj) for obj in (None, True, False)]
    for _ in range(20):
        markdown.render(doc, text, spans, highlight=True)
    after = [sys.getrefcount(obj) for obj in (None, True, False)]
    lost = [b - a for b, a in zip(before, after)]
    assert max(lost) < 200, f"references lost to None/True/False over 20 renders: {lost} (broken Qt binding?)"
