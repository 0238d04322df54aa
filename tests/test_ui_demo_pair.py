"""End to end with the embedded demo pair (assets/demo): the window opens, loads the demo pair by
itself in a real worker, and the first example prompt streams an answer whose numbers reach the
stats panel and the chat database. Until the demo pair is committed, a random pair stands in."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from dflash_desktop import settings as settings_mod
from engine import draft_vocab
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.pairs import PairRequest
from dflash_desktop.qt_worker import QtWorker
from ui.chat_view import CODE_EXAMPLES
from ui.main_window import MainWindow, demo_pair

from .ui_chat_fixtures import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, home  # noqa: F401


@pytest.fixture
def worker(qapp, home):
    w = QtWorker()
    yield w
    w.shutdown(10)


def test_demo_pair_end_to_end(qtbot, home, worker, tmp_path):
    pair = demo_pair()
    if pair is None:   # assets/demo not committed yet: same path with a random pair
        from tests.tiny_torch import save_random_pair
        target, draft = save_random_pair(tmp_path / "pair", block_size=8)
        pair = PairRequest("random", "Random pair", str(target), str(draft))
    window = MainWindow(worker=worker, store=ChatStore(), settings=settings_mod.Settings(max_new_tokens=48),
                        pair=pair)      # the code pair by name: a first start opens the chat pair (test_chat_pair.py)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.progress.isVisibleTo(window), timeout=5000)   # loading shows in the status bar
    assert "Loading" in window.status_label.text() or "Reading" in window.status_label.text()
    qtbot.waitUntil(lambda: window.session.ready, timeout=LOAD_TIMEOUT_MS)
    assert window.session.pair.id == pair.id and settings_mod.load().last_pair == window.session.pair.to_dict()
    assert window.stats_panel.values["baseline_tok_s"] > 0
    hint = window.chat_view.hint.text()
    assert window.chat_view.hint.isVisibleTo(window)
    expected = "Demo pair: a tiny code model" if pair.id == "demo" else "no chat template"
    assert expected in hint
    assert window.chat_view.example_buttons[0].property("prompt") == CODE_EXAMPLES[0]
    assert window.chat_view.example_buttons[0].text().splitlines()[0] == CODE_EXAMPLES[0].splitlines()[0]
    assert window.pair_label.text().startswith(pair.name)

    streamed: list[str] = []
    worker.tokens.connect(lambda ev: streamed.append("".join(s[0] for s in ev["spans"])))
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(window.chat_view.example_buttons[0], Qt.MouseButton.LeftButton)
    done = blocker.args[0]
    assert done["event"] == "done" and done["stats"]["generated_tokens"] > 0
    assert "".join(streamed) == done["text"]
    answer = window.chat_view.messages[-1]
    assert answer.text == done["text"] and "tok/s" in answer.footer.text()
    values, stats = window.stats_panel.values, done["stats"]
    drafted = stats["drafted"] > 0     # an answer decoded plainly has no acceptance to show (stats panel)
    assert (values["dflash_tok_s"], values["tau"], values["acceptance_rate"]) == (
        stats["decode_tok_s"], stats["tau"] if drafted else None, stats["acceptance_rate"] if drafted else None)
    assert values["histogram"] == stats["histogram"] and values["position_rates"] == stats["position_rates"]
    conv = window.store.conversations()[0]
    stored = window.store.messages(conv.id)
    assert [(m.role, m.content) for m in stored] == [("user", CODE_EXAMPLES[0]), ("assistant", done["text"])]
    # the window keeps the CPU meter of the answer and who wrote it beside the engine's stats
    assert {k: v for k, v in stored[1].stats.items() if not k.startswith("cpu_") and k != "model"} == stats
    assert stored[1].stats["model"]["name"] == pair.name and stored[1].stats["model"]["engine"] == window.session.loaded.engine
    chose = window.session.loaded.speculation or {}
    if chose.get("n_max") == 0:
        # the engine (llama.cpp, the first start's choice on a CPU where it is built) timed plain decoding
        # faster here: the answer says so, and the stats panel shows why
        assert stats["fallback"] and stats["fallback"]["reason"] == chose["reason"]
        assert chose["reason"] in window.stats_panel.runtime.text()
    elif chose.get("method") == "ngram":
        # llama.cpp measured n-gram lookup fastest here: it drafts from the answer's own text, not the drafter
        assert stats["speculation"] == "ngram" and stats["draft_vocab"] is None
    elif pair.id == "demo" and pair.draft_dir:
        # drafter quality is tests/test_demo_pair.py's job; here: drafted tokens reach the window as such
        assert stats["accepted"] > 0, "no drafted token was accepted through the window"
        assert any(drafted for _, drafted in stored[1].spans), "drafted spans were not stored"
        # whichever engine runs it, the drafter drafts from its ranking, and the panel says so
        ranked = len(draft_vocab.load(Path(pair.draft_dir), 4096).ranked)
        assert stats["draft_vocab"] == ranked
        assert f"from the {ranked:,} tokens this model uses most" in window.stats_panel.draft_note.text()
        assert window.stats_panel.draft_note.isVisibleTo(window)
