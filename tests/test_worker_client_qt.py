"""The Qt wrapper: events reach the GUI thread as queued signals, token chunks are batched so the
window repaints at most about 60 times a second, and nothing is lost or reordered on the way."""
from __future__ import annotations

import functools
import threading
import time

import shiboken6
from PySide6.QtCore import QObject, QTimer

from dflash_desktop.qt_worker import QtWorker
from dflash_desktop.worker_client import coalesce_into, merge_tokens


def tok(rid, i, drafted=False):
    return {"event": "tokens", "id": rid, "spans": [[chr(65 + i % 26), drafted]], "tokens": [i],
            "drafted": [drafted], "steps": [[1, int(drafted)]], "generated": i + 1, "elapsed_s": i / 1000}


def test_merge_and_coalesce_keep_everything_in_order():
    a, b = tok("g", 0, True), tok("g", 1, True)
    merged = merge_tokens(a, b)
    assert merged["spans"] == [["AB", True]] and merged["tokens"] == [0, 1] and merged["generated"] == 2
    assert a["tokens"] == [0] and a["spans"] == [["A", True]]  # inputs untouched
    buf: list[dict] = []
    stream = [tok("g", 0), tok("g", 1, True), {"event": "warning", "id": "g"}, tok("g", 2), tok("h", 3), tok("h", 4)]
    for ev in stream:
        coalesce_into(buf, ev)
    assert [e["event"] for e in buf] == ["tokens", "warning", "tokens", "tokens"]
    assert buf[0]["tokens"] == [0, 1] and buf[0]["spans"] == [["A", False], ["B", True]]
    assert buf[0]["steps"] == [[1, 0], [1, 1]]
    assert buf[2]["tokens"] == [2] and buf[3]["id"] == "h" and buf[3]["tokens"] == [3, 4]
    assert stream[0]["tokens"] == [0]  # the first event was copied, not mutated


def test_burst_reaches_gui_as_few_ordered_signals(qtbot):
    w = QtWorker(min_interval_ms=16)
    got: list[dict] = []
    w.tokens.connect(got.append)
    finished: list[dict] = []
    w.done.connect(finished.append)
    every: list[str] = []
    w.event.connect(lambda e: every.append(e["event"]))
    n = 3000

    def engine_side():  # what the client's reader thread does: one callback per worker event
        for i in range(n):
            w._intake(tok("g", i, drafted=i % 3 != 0))
            if i == n // 2:
                w._intake({"event": "warning", "id": "g", "code": "x", "message": "mid-stream"})
            if i % 50 == 0:
                time.sleep(0.002)  # roughly 1000+ tokens a second, spread over a few frames
        w._intake({"event": "done", "id": "g", "stop_reason": "length"})

    t0 = time.monotonic()
    thread = threading.Thread(target=engine_side)
    thread.start()
    qtbot.waitUntil(lambda: bool(finished), timeout=20_000)
    elapsed = time.monotonic() - t0
    thread.join(5)
    assert [t for e in got for t in e["tokens"]] == list(range(n))
    assert "".join(s for e in got for s, _ in e["spans"]) == "".join(chr(65 + i % 26) for i in range(n))
    assert [d for e in got for d in e["drafted"]] == [i % 3 != 0 for i in range(n)]
    assert every[-1] == "done" and every.count("warning") == 1
    assert every.index("warning") > 0 and every.index("warning") < len(every) - 1
    assert len(got) <= 2 * w.flushes + 1  # at most a chunk before and after the warning per flush
    assert 2 <= w.flushes <= elapsed * 60 + 3, (w.flushes, elapsed)
    assert len(got) < n / 10


def test_real_worker_through_signals_keeps_gui_responsive(qtbot, tmp_path, monkeypatch):
    from tests.tiny_torch import save_random_pair
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    target, draft = save_random_pair(tmp_path / "pair", block_size=8)
    w = QtWorker()
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(10)
    try:
        with qtbot.waitSignal(w.loaded, timeout=60_000) as loaded:
            w.load_pair(target, draft)
        assert loaded.args[0]["block_size"] == 8 and w.pair_info["has_drafter"]
        chunks: list[dict] = []
        w.tokens.connect(chunks.append)
        with qtbot.waitSignal(w.done, timeout=60_000) as done:
            rid = w.generate(prompt="Hello", settings={"max_new_tokens": 300})
        final = done.args[0]
        assert final["id"] == rid and final["stop_reason"] == "length"
        assert [t for c in chunks for t in c["tokens"]] == final["token_ids"]
        assert len(chunks) <= sum(len(c["steps"]) for c in chunks)
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        assert gaps and max(gaps) < 1.0, "the GUI thread stalled"
        with qtbot.waitSignal(w.error, timeout=30_000) as err:
            w.load_pair(tmp_path / "missing", None)
        assert err.args[0]["code"] == "bad_checkpoint"
    finally:
        timer.stop()
        assert w.shutdown(10) == 0


def test_text_the_worker_cannot_take_ends_with_one_error_signal(qtbot, tmp_path, monkeypatch):
    """A lone surrogate from the window (a broken paste, say) gets one `error` and leaves nothing busy."""
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    w = QtWorker()
    try:
        with qtbot.waitSignal(w.error, timeout=30_000) as err:
            rid = w.generate(prompt="broken \ud800 paste")
        assert err.args[0]["id"] == rid and err.args[0]["code"] == "bad_message"
        assert "surrogate" in err.args[0]["message"] and not w.busy
    finally:
        assert w.shutdown(10) == 0


class Receiver(QObject):
    """A caller of the worker, as the chat controller and the pair session are."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, dict]] = []

    def on_event(self, tag: str, ev: dict) -> None:
        assert threading.current_thread() is threading.main_thread()
        self.events.append((tag, ev))


def test_each_job_reaches_its_own_callback_in_order_and_a_deleted_receiver_is_skipped(qtbot, tmp_path,
                                                                                        monkeypatch):
    """Per-job callbacks (the window's controllers use nothing else): a load's progress then its `loaded`, a
    generation's chunks then its `done`, each to the callback given with it, on the GUI thread; another job's
    events never reach it; once the receiver is deleted its pending job's events are dropped, not delivered
    to a dead object."""
    from tests.tiny_torch import save_random_pair
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    target, draft = save_random_pair(tmp_path / "pair", block_size=8)
    w, r, other = QtWorker(), Receiver(), Receiver()
    try:
        load = w.load_pair(target, draft, on_event=functools.partial(r.on_event, "load"))
        qtbot.waitUntil(lambda: any(ev["event"] == "loaded" for _, ev in r.events), timeout=60_000)
        assert {tag for tag, _ in r.events} == {"load"} and all(ev["id"] == load for _, ev in r.events)
        assert [ev["event"] for _, ev in r.events][-1] == "loaded"
        assert {ev["event"] for _, ev in r.events[:-1]} <= {"progress", "warning"}
        r.events.clear()
        mine = w.generate(prompt="Hello", settings={"max_new_tokens": 40}, on_event=functools.partial(r.on_event, "gen"))
        theirs = w.generate(prompt="Bye", settings={"max_new_tokens": 20},
                            on_event=functools.partial(other.on_event, "gen"))
        qtbot.waitUntil(lambda: bool(other.events) and other.events[-1][1]["event"] == "done", timeout=60_000)
        kinds = [ev["event"] for _, ev in r.events]
        assert kinds[-1] == "done" and set(kinds[:-1]) <= {"tokens", "warning"} and "tokens" in kinds
        assert all(ev["id"] == mine for _, ev in r.events) and all(ev["id"] == theirs for _, ev in other.events)
        tokens = [t for _, ev in r.events if ev["event"] == "tokens" for t in ev["tokens"]]
        assert tokens == r.events[-1][1]["token_ids"]

        gone = Receiver()
        finished: list[dict] = []
        w.done.connect(finished.append)
        rid = w.generate(prompt="Later", settings={"max_new_tokens": 20},
                         on_event=functools.partial(gone.on_event, "gen"))
        shiboken6.delete(gone)
        qtbot.waitUntil(lambda: any(ev["id"] == rid for ev in finished), timeout=60_000)   # still a signal
        assert rid not in w._handlers and not gone.events   # dropped with its receiver, never called
    finally:
        assert w.shutdown(10) == 0
