"""Stats people can trust, through the real window and a real worker (echo pair, ui_chat_fixtures):
one baseline from which the speedup and the warning are recomputed when it changes (Re-measure, the
speedup demo), live charts that never show the previous answer, a panel that follows the chat on
screen, a tooltip on every figure, and a measured explanation when DFlash is slower than plain."""
from __future__ import annotations

import time

import pytest
from PySide6.QtWidgets import QLabel, QWidget

from dflash_desktop import session
from dflash_desktop import settings as settings_mod
from dflash_desktop.pairs import LoadedPair
from dflash_desktop.session import BaselineRecord, diagnose
from ui.stats_panel import BarChart, Metric, Sparkline, draft_pass

from .ui_chat_fixtures import ANSWER_TIMEOUT_MS, chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401


def shown(window) -> dict:
    return window.stats_panel.values


def test_remeasure_recomputes_speedup_and_warning_from_the_new_baseline(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    panel = window.stats_panel
    done = send_and_wait(qtbot, window, "def f(x):")
    stats = done["stats"]
    # a baseline far above anything this machine does (as if measured elsewhere): DFlash looks slower
    window.session.record_baseline(BaselineRecord(stats["decode_tok_s"] * 4, 64, time.time(), "cpu"))
    assert shown(window)["speedup"] == pytest.approx(0.25)
    assert panel.speedup_label.text() == "0.25×"
    assert shown(window)["warning"].startswith("DFlash ran slower than plain decoding (0.25×)")
    assert "ms" in shown(window)["warning"]      # the reason, from the measured step times

    with qtbot.waitSignal(window.session.baselineChanged, timeout=ANSWER_TIMEOUT_MS) as changed:
        panel.remeasure_button.click()
    record = changed.args[0]
    assert record.method == "calibration" and record.tokens == session.CALIBRATION_TOKENS
    assert len(record.runs) == session.CALIBRATION_RUNS and min(record.runs) <= record.tok_s <= max(record.runs)
    assert record.cpu_other is not None and 0 <= record.cpu_other <= 1
    assert window.session.baseline() == record           # the one record, saved for the pair
    ratio = stats["decode_tok_s"] / record.tok_s
    assert shown(window)["baseline_tok_s"] == record.tok_s and panel.baseline_label.text() == f"{record.tok_s:.1f}"
    assert shown(window)["speedup"] == pytest.approx(ratio) and panel.speedup_label.text() == f"{ratio:.2f}×"
    assert record.describe() == panel.baseline_note.text()
    assert panel.stats["cpu_other"] is not None          # measured while the answer was written
    assert panel.context["token_ids"] == done["token_ids"]
    assert shown(window)["warning"] == diagnose(panel.stats, record, True, panel.context)
    if ratio >= 1:   # the echo pair writes one token over and over: its speedup is flagged as repetition
        assert "comes from repetition" in shown(window)["warning"]


def test_live_charts_start_empty_and_show_only_this_answer(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    send_and_wait(qtbot, window, "x = ")
    assert shown(window)["histogram"]            # the first answer's charts
    seen: list[tuple] = []
    steps: list = []

    def on_tokens(ev):
        steps.extend(s for s in ev.get("steps", []) if s[0] > 0)
        seen.append((list(shown(window)["histogram"]), len(steps)))

    chat_worker.tokens.connect(on_tokens)
    try:
        window.chat_view.input.setPlainText("y = ")
        window.chat_view.submit()
        assert shown(window)["histogram"] == [] and shown(window)["position_rates"] == []   # nothing of answer 1
        assert window.stats_panel.dflash_label.text() == "—"
        qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS).wait()
    finally:
        chat_worker.tokens.disconnect(on_tokens)
    # Qt delivers the panel's update before ours: each live histogram counts exactly the passes so far
    assert seen and all(sum(hist) == n for hist, n in seen if n)


def test_the_panel_follows_the_chat_on_screen(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    c = window.controller
    first = send_and_wait(qtbot, window, "a = ")["stats"]
    chat_a = c.conversation_id
    window.new_chat_action.trigger()
    assert shown(window)["dflash_tok_s"] is None and shown(window)["histogram"] == []
    assert window.stats_panel.subject.text() == "No answer in this chat yet."
    assert window.stats_panel.dflash_metric.caption.text() == "tok/s"   # no method claimed before an answer
    second = send_and_wait(qtbot, window, "b = ")["stats"]
    chat_b = c.conversation_id
    assert shown(window)["dflash_tok_s"] == second["decode_tok_s"]
    c.open_conversation(chat_a)
    assert shown(window)["dflash_tok_s"] == first["decode_tok_s"] and shown(window)["histogram"] == first["histogram"]
    assert window.stats_panel.subject.text() == "Answer 1 of this chat — Echo test pair  ·  DFlash"   # and who wrote it
    c.open_conversation(chat_b)
    assert shown(window)["dflash_tok_s"] == second["decode_tok_s"]


def test_every_figure_has_a_tooltip_that_says_what_it_is(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    stats = send_and_wait(qtbot, window, "z = ")["stats"]
    panel = window.stats_panel
    figures = [w for w in panel.findChildren(QWidget) if isinstance(w, (Metric, BarChart, Sparkline))]
    assert len(figures) == 8
    labels = [w for w in panel.findChildren(QLabel) if w.isVisible()]
    missing = [w.text() for w in [*figures, *labels] if not w.toolTip()]
    assert not missing, missing
    assert panel.acceptance_metric.toolTip().startswith(f"{stats['accepted']} of {stats['drafted']} drafted tokens")
    assert "÷" in panel.speedup_metric.toolTip()
    # the echo drafter ranks no tokens: its draft pass is timed over every token
    assert panel.draft_note.isVisible() and panel.draft_note.text() == (
        f"Draft pass: {stats['draft_ms']:.1f} ms a step, over every token.")


@pytest.mark.parametrize("stats, words", [
    ({"drafted": 40, "draft_ms": 3.47, "draft_vocab": 4596}, "Draft pass: 3.5 ms a step, from the 4,596 tokens"),
    ({"drafted": 40, "draft_ms": None, "draft_vocab": 8192}, "The drafter drafts from the 8,192 tokens"),
    ({"drafted": 40, "draft_ms": None, "draft_vocab": None}, "The drafter drafts over every token."),
    ({"drafted": 0, "draft_ms": None, "draft_vocab": 8192}, ""),                   # decoded plainly
    ({"drafted": 9, "draft_ms": 0.2, "speculation": "ngram"}, ""),                 # n-gram lookup has no drafter
    ({"drafted": 9, "draft_ms": 1.25, "speculation": "dspark"}, "Draft pass: 1.2 ms a step, over every token."),
    ({"drafted": 9, "draft_ms": 4.0, "draft_vocab": 32000, "speculation": "eagle3"},   # its own head's tokens
     "Draft pass: 4.0 ms a step, from the 32,000 tokens"),
    ({"drafted": 9, "draft_ms": None, "speculation": "eagle3"}, ""),     # llama.cpp's: nothing it can say
])
def test_the_draft_pass_in_words(stats, words):
    text = draft_pass(stats)
    assert text.startswith(words) and bool(text) == bool(words)


def test_the_speedup_demos_plain_run_becomes_the_panels_baseline(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair)
    calibration = window.session.baseline()
    assert calibration.method == "calibration"
    window.toggle_demo(True)
    demo = window.demo
    with qtbot.waitSignal(window.session.baselineChanged, timeout=ANSWER_TIMEOUT_MS) as changed:
        assert demo.start("def g(y):", {"max_new_tokens": 200, "temperature": 0.0})   # runs long enough to agree
    record = changed.args[0]
    assert record.method == "speedup demo" and record.tokens == 200
    assert record.tok_s == pytest.approx(demo.plain.stats["decode_tok_s"])
    assert window.session.baseline() == record and window.stats_panel.baseline_label.text() == f"{record.tok_s:.1f}"
    assert "speedup demo" in window.stats_panel.baseline_note.text()
    qtbot.waitUntil(lambda: demo.state == "finished", timeout=ANSWER_TIMEOUT_MS)
    assert "now the pair's baseline" in demo.speedup_detail.text()


def test_the_panel_shows_the_memory_the_worker_measured(qtbot, home, chat_worker, echo_pair):
    """Off CUDA: the engine process's peak from the real answer. On CUDA (no GPU here, so the worker's
    loaded event is written as a CUDA worker reports it): torch's peak and reserved bytes."""
    window = make_window(qtbot, chat_worker, echo_pair)
    panel = window.stats_panel
    stats = send_and_wait(qtbot, window, "m = ")["stats"]
    assert stats["cuda_peak_bytes"] is None and stats["peak_memory_bytes"] > 0
    peak = stats["peak_memory_bytes"]
    size = f"{peak / 2**20:.0f} MB" if peak < 2**30 else f"{peak / 1e9:.1f} GB"
    assert shown(window)["memory"] == f"Engine memory in this answer: {size} at peak"
    assert panel.memory.isVisible() and panel.memory.toolTip()
    panel.set_runtime(LoadedPair.of({"engine": "torch", "device": "cuda:0", "dtype": "bfloat16",
                                     "cuda_peak_bytes": 3_000_000_000, "cuda_reserved_bytes": 3_500_000_000}))
    assert shown(window)["memory"] == "GPU memory after loading: 3.0 GB at peak · 3.5 GB reserved by torch"
    panel.set_runtime(LoadedPair.of({"engine": "torch", "device": "cpu", "dtype": "float32",
                                     "cuda_peak_bytes": None, "cuda_reserved_bytes": None}))
    assert shown(window)["memory"] is None and not panel.memory.isVisible()


def test_an_answer_decoded_plainly_shows_no_speedup(qtbot, home, chat_worker, echo_pair):
    """Block size 1 (as when llama.cpp's calibration chose plain decoding): the answer drafted nothing, so
    a ratio against the baseline would compare plain with plain; the panel shows none and says why."""
    window = make_window(qtbot, chat_worker, echo_pair,
                         settings=settings_mod.Settings(max_new_tokens=24, draft_cutoff=0.0, block_size=1))
    assert window.session.baseline() is not None
    panel = window.stats_panel
    live: list[tuple] = []      # what the panel showed while the answer streamed (after each batch of tokens)

    def snapshot(_ev: dict) -> None:
        live.append((panel.speedup_label.text(), panel.acceptance_label.text(), panel.dflash_metric.caption.text()))
    chat_worker.tokens.connect(snapshot)
    try:
        stats = send_and_wait(qtbot, window, "p = ")["stats"]
    finally:
        chat_worker.tokens.disconnect(snapshot)
    assert stats["drafted"] == 0 and stats["decode_tok_s"] > 0 and stats["method"] == "plain"
    assert live and all(shown[:2] == ("—", "—") and "DFlash" not in shown[2] for shown in live), live
    assert window.chat_view.messages[-1].role_label.text() == "Echo test pair  ·  plain decoding"
    assert shown(window)["speedup"] is None and window.stats_panel.speedup_label.text() == "—"
    assert window.stats_panel.speedup_metric.toolTip().startswith("This answer drafted nothing")
    assert panel.acceptance_label.text() == panel.tau_label.text() == "—"     # not "0%" of nothing drafted
    assert panel.acceptance_metric.toolTip().startswith("This answer drafted nothing")
    footer = window.chat_view.messages[-1].footer.text()
    assert "plain decoding" in footer and "τ" not in footer
    assert shown(window)["dflash_tok_s"] == stats["decode_tok_s"]


def test_each_chat_keeps_the_figures_of_the_model_that_wrote_it(qtbot, home, chat_worker, echo_pair):
    """A chat with the echo pair (DFlash), then a switch to its target alone (no drafter: it speculates with
    n-gram lookup) in a new chat: each answer is headed by its own model and method, and reopening the first chat
    shows its speedup against its own baseline, never the loaded model's, nor a diagnosis of the other model."""
    window = make_window(qtbot, chat_worker, echo_pair)
    panel, c = window.stats_panel, window.controller
    first = send_and_wait(qtbot, window, "def f(x):")["stats"]
    chat_a, speed_a = c.conversation_id, shown(window)["speedup"]
    baseline_a = window.session.baseline()
    assert speed_a == pytest.approx(first["decode_tok_s"] / baseline_a.tok_s)

    alone = {**echo_pair, "id": "echo-alone", "name": "Echo target alone", "draft_dir": None}
    c.new_chat()
    with qtbot.waitSignal(window.session.pairLoaded, timeout=ANSWER_TIMEOUT_MS):
        window.load_pair(alone)
    qtbot.waitUntil(lambda: window.session.ready, timeout=ANSWER_TIMEOUT_MS)
    assert window.pair_label.text().endswith("·  n-gram lookup, up to 8 drafts a step")
    # the target alone gets its own baseline, far from the echo pair's (its own calibration)
    record = BaselineRecord(baseline_a.tok_s * 10, 64, time.time(), "cpu")
    window.session.record_baseline(record)
    second = send_and_wait(qtbot, window, "def g(y):")["stats"]
    stored = window.store.messages(c.conversation_id)[-1].stats
    assert second["speculation"] == "ngram" and stored["model"]["name"] == "Echo target alone"
    assert stored["model"]["has_drafter"] and stored["model"]["baseline_key"] == window.session.baseline_key   # drafts
    words = "n-gram lookup" if second["method"] == "dflash" else "plain decoding"   # no repeat: nothing drafted
    assert window.chat_view.messages[-1].role_label.text() == f"Echo target alone  ·  {words}"
    assert shown(window)["speedup"] == pytest.approx(second["decode_tok_s"] / record.tok_s)

    c.open_conversation(chat_a)
    answer = window.chat_view.messages[-1]
    assert answer.role_label.text() == "Echo test pair  ·  DFlash"
    assert shown(window)["speedup"] == pytest.approx(speed_a)          # its own baseline, not the loaded one's
    assert shown(window)["acceptance_rate"] == first["acceptance_rate"]
    assert panel.subject.text() == "Answer 1 of this chat — Echo test pair  ·  DFlash"
    assert "No drafter" not in (shown(window)["warning"] or "")
    window.session.record_baseline(BaselineRecord(1.0, 64, time.time(), "cpu"))   # the loaded model's, again
    assert shown(window)["speedup"] == pytest.approx(speed_a)          # still the echo pair's own
