"""The side-by-side demo against a real worker and a random pair: measured one run after the other,
replayed together at the engine's own timings, with an honest speed-up and an exactness check."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dflash_desktop.qt_worker import QtWorker
from tests.ui_fixtures import loaded_worker, random_pair  # noqa: F401  (fixtures)
from ui.speedup_demo import (DEFAULT_CHAT_PROMPT, DEFAULT_PROMPT, REPLAY_NOTE, ROUNDS, SpeedupDemo,
                             first_difference)

RUN_TIMEOUT_MS = 90_000


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_run_measures_plain_then_dflash_and_replays_at_measured_speed(qtbot, loaded_worker):
    worker = loaded_worker
    demo = SpeedupDemo(worker)
    qtbot.addWidget(demo)
    demo.show()
    order: list[tuple[str, str]] = []   # (event, request id) as the GUI saw them
    last_elapsed: dict[str, float] = {}
    worker.event.connect(lambda e: order.append((e["event"], e.get("id"))))
    worker.tokens.connect(lambda e: last_elapsed.__setitem__(e["id"], e["elapsed_s"]))
    states: list[tuple[str, float]] = []
    demo.stateChanged.connect(lambda s: states.append((s, time.perf_counter())))

    assert demo.start("def add(a, b):\n", {"max_new_tokens": 48, "draft_cutoff": 0.0})   # the echo drafter is never confident
    assert "Warming up" in demo.status.text()
    qtbot.waitUntil(lambda: "Measuring plain decoding… " in demo.status.text(), timeout=RUN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: demo.state == "finished", timeout=RUN_TIMEOUT_MS)

    # one after the other, alternating: each timed run finished before the next produced anything
    gens = [rid for ev, rid in order if ev == "done"][-2 * ROUNDS:]
    for earlier, later in zip(gens, gens[1:]):
        assert all(rid != later for _, rid in order[:order.index(("done", earlier))])
    assert [m.mode for m in demo.runs] == ["baseline", "dflash", "dflash", "baseline", "baseline", "dflash"]
    assert [demo.plain.mode, demo.dflash.mode] == ["baseline", "dflash"]
    assert demo.plain in demo.runs and demo.dflash in demo.runs      # the median runs are the ones shown
    assert all(m.cpu_other is not None and 0 <= m.cpu_other <= 1 for m in demo.runs)

    # both panes hold the full text of their run
    assert demo.plain.tokens == 48 and demo.dflash.tokens == 48
    assert demo.plain_pane.plain_text() == "".join(t for _, spans in demo.plain.chunks for t, _ in spans)
    assert demo.dflash_pane.plain_text() == "".join(t for _, spans in demo.dflash.chunks for t, _ in spans)
    assert demo.plain_pane.plain_text() and demo.dflash_pane.plain_text()
    assert "tok/s" in demo.plain_pane.stats.text() and "τ" in demo.dflash_pane.stats.text()
    # the DFlash run drafted all the way: no plain fallback in a demo of DFlash (the echo drafter is poor)
    assert demo.dflash.stats["steps"] > 0 and demo.dflash.stats["drafted"] >= demo.dflash.stats["steps"]
    assert demo.dflash.stats.get("fallback") is None

    # greedy DFlash is exactly plain decoding
    assert demo.identical is True and "identical ✓" in demo.identical_label.text()

    # the speed-up is the median of the rounds' ratios of tok/s measured from the engine's own timestamps
    rates = [48 / last_elapsed[rid] for rid in gens]
    plain = [r for r, m in zip(rates, demo.runs) if m.mode == "baseline"]
    dflash = [r for r, m in zip(rates, demo.runs) if m.mode == "dflash"]
    ratios = sorted(d / p for p, d in zip(plain, dflash))
    assert demo.ratios == pytest.approx([d / p for p, d in zip(plain, dflash)])
    assert abs(demo.speedup - ratios[1]) < 1e-9
    if demo.headline:      # a quiet machine whose rounds agree: one figure, with its range beside it
        assert f"{demo.speedup:.2f}×" in demo.speedup_label.text()
        assert f"median of 3 rounds, {ratios[0]:.2f}×–{ratios[-1]:.2f}×" in demo.speedup_detail.text()
    else:                  # this machine was busy or noisy: the range, and why, instead
        assert demo.speedup_label.text() == f"{ratios[0]:.2f}×–{ratios[-1]:.2f}×"

    # the replay is labelled and takes as long as the slower measured run
    assert demo.replay_label.isVisible() and demo.replay_label.text() == REPLAY_NOTE
    t_replay = next(t for s, t in states if s == "replaying")
    t_end = next(t for s, t in states if s == "finished" and t > t_replay)
    assert t_end - t_replay >= max(demo.plain.seconds, demo.dflash.seconds) - 0.02
    assert demo.replay_button.isEnabled() and demo.run_button.isEnabled()

    # Replay again from the button: the panes refill to the same text
    text = demo.dflash_pane.plain_text()
    demo.replay_button.click()
    assert demo.state == "replaying"
    qtbot.waitUntil(lambda: demo.state == "finished", timeout=10_000)
    assert demo.dflash_pane.plain_text() == text


def test_refuses_without_a_model_and_says_why(qtbot):
    demo = SpeedupDemo(QtWorker())  # never started: nothing loaded, no process spawned
    qtbot.addWidget(demo)
    assert not demo.start("def f():\n", {})
    assert demo.state == "idle" and "No model is loaded" in demo.error_label.text()
    assert demo.run_button.isEnabled()


def test_stop_while_measuring_cancels_and_allows_a_new_run(qtbot, loaded_worker):
    demo = SpeedupDemo(loaded_worker)
    qtbot.addWidget(demo)
    assert demo.start("def f(x):\n", {"max_new_tokens": 1800})
    qtbot.waitUntil(lambda: demo.plain is not None and demo.plain.generated > 0, timeout=RUN_TIMEOUT_MS)
    demo.stop_button.click()
    qtbot.waitUntil(lambda: demo.state == "idle", timeout=30_000)
    assert "Stopped" in demo.status.text() and not loaded_worker.busy
    assert demo.run_button.isEnabled() and not demo.replay_button.isEnabled() and demo.speedup is None


def test_prompt_follows_the_loaded_model_unless_the_user_wrote_one(qtbot):
    demo = SpeedupDemo(QtWorker())
    qtbot.addWidget(demo)
    assert demo.prompt_edit.toPlainText() == DEFAULT_PROMPT
    demo._suggest_prompt({"chat_template": True})
    assert demo.prompt_edit.toPlainText() == DEFAULT_CHAT_PROMPT
    demo.prompt_edit.setPlainText("my own prompt")
    demo._suggest_prompt({"chat_template": False})
    assert demo.prompt_edit.toPlainText() == "my own prompt"


def test_worker_killed_mid_run_shows_the_error_and_stays_usable(qtbot, loaded_worker):
    demo = SpeedupDemo(loaded_worker)
    qtbot.addWidget(demo)
    demo.show()
    assert demo.start("class Stack:\n", {"max_new_tokens": 1800})
    qtbot.waitUntil(lambda: demo.plain is not None and demo.plain.generated > 0, timeout=RUN_TIMEOUT_MS)
    os.kill(loaded_worker.client.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: demo.state == "idle", timeout=30_000)
    assert demo.error_label.isVisible() and "killed" in demo.error_label.text()
    assert demo.run_button.isEnabled() and not demo.stop_button.isEnabled()
    assert demo.speedup is None


def test_a_busy_machine_gets_the_range_and_no_headline(qtbot, loaded_worker):
    """Two programs that keep both cores busy while the demo measures: every run records other programs'
    share of the CPU, and the demo shows the rounds' range with the reason instead of one speed-up figure, and
    leaves the pair's baseline alone."""
    demo = SpeedupDemo(loaded_worker)
    qtbot.addWidget(demo)
    demo.show()
    recorded: list = []
    demo.baselineMeasured.connect(lambda done, cpu: recorded.append(cpu))
    if loaded_worker.pair_info is None:     # an earlier test killed the worker: its next request reloads the pair
        loaded_worker.client.wait(loaded_worker.generate(prompt="x", settings={"max_new_tokens": 1}), 60)
    # other programs: started through a shell that exits at once, so they are not this process's children
    # (the meter counts the window's own family as ours)
    spin = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    hogs = [int(subprocess.run(["sh", "-c", spin], capture_output=True, text=True).stdout) for _ in
            range(os.cpu_count() or 2)]
    try:
        assert demo.start("def add(a, b):\n", {"max_new_tokens": 96, "draft_cutoff": 0.0})
        qtbot.waitUntil(lambda: demo.state in ("finished", "replaying"), timeout=RUN_TIMEOUT_MS * 2)
    finally:
        for hog in hogs:
            os.kill(hog, signal.SIGKILL)
    ratios = demo.ratios
    assert len(ratios) == ROUNDS and demo.busiest >= 0.25 and not demo.headline
    assert demo.speedup_label.text() == f"{min(ratios):.2f}×–{max(ratios):.2f}×"
    assert demo.speedup_detail.text().startswith(f"The machine was busy: other programs used {demo.busiest:.0%} of")
    assert "Run it again when the computer is quiet" in demo.speedup_detail.text() and not recorded


def test_any_two_of_the_pairs_methods_race_each_measured_alone(qtbot, qapp, tmp_path_factory, monkeypatch):
    """llama.cpp runs the demo pair three ways: the pickers list them, and n-gram lookup races DFlash (greedy,
    both give plain decoding's tokens); no plain run, so the stats panel's baseline is left alone."""
    from engine.backends.llamacpp import build
    try:
        build.find_build()
    except build.BuildMissing as exc:
        pytest.skip(f"no llama.cpp build here ({exc})")
    from engine.bench import DEMO_DIR
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("home")))
    worker = QtWorker()
    try:
        loaded = worker.client.wait(worker.load_pair(DEMO_DIR / "target", DEMO_DIR / "draft", engine="llamacpp"), 300)
        assert loaded["event"] == "loaded" and loaded["methods"] == ["none", "ngram", "dflash"], loaded
        demo = SpeedupDemo(worker)
        qtbot.addWidget(demo)
        demo._offer_methods(worker.pair_info)
        lefts = [demo.left_method.itemData(i) for i in range(demo.left_method.count())]
        rights = [demo.right_method.itemData(i) for i in range(demo.right_method.count())]
        assert lefts == ["none", "ngram", "dflash"] and rights == [None, "ngram", "dflash"]
        assert demo.right_method.itemText(0).startswith("The engine's choice (")
        baselines = []
        demo.baselineMeasured.connect(lambda *a: baselines.append(a))
        demo.left_method.setCurrentIndex(lefts.index("dflash"))
        demo.right_method.setCurrentIndex(rights.index("dflash"))
        assert not demo.start("x = 1\ny = 2\nx = 1\ny = 2\n", {"max_new_tokens": 48})   # the same method twice
        assert "two different ones" in demo.error_label.text()
        demo.right_method.setCurrentIndex(rights.index("ngram"))
        sent = []
        worker.event.connect(lambda e: None)
        generate = worker.generate
        monkeypatch.setattr(worker, "generate", lambda **kw: sent.append(kw) or generate(**kw))
        assert demo.start("x = 1\ny = 2\nx = 1\ny = 2\n", {"max_new_tokens": 48})
        qtbot.waitUntil(lambda: demo.state == "finished", timeout=RUN_TIMEOUT_MS)
        assert {kw["settings"].get("method") for kw in sent} == {"dflash", "ngram"}
        assert all(kw["mode"] == "dflash" for kw in sent)
        assert demo.plain_pane.title.text() == "DFlash" and demo.dflash_pane.title.text() == "n-gram lookup"
        assert demo.identical, "greedy n-gram lookup and DFlash both give plain decoding's tokens"
        detail = demo.speedup_detail.text()      # one figure, or the rounds' range when a busy machine spread them
        assert detail.startswith("n-gram lookup") if demo.headline else "measured n-gram lookup at" in detail
        assert ("vs DFlash" if demo.headline else "of DFlash's speed") in detail
        assert demo.dflash.stats["drafted"] > 0 and demo.plain.stats["drafted"] > 0
        assert baselines == []
    finally:
        worker.shutdown(10)
