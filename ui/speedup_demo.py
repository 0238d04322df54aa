"""Side-by-side speed comparison: plain decoding against DFlash, on the same prompt and model.

Running both at once on one device would make each slow the other down, so the comparison would lie.
Instead the runs are measured one after the other on the same worker, every token chunk is stamped with the
engine's own clock (`elapsed_s` in each `tokens` event: seconds since the request began, prefill included,
free of pipe and repaint delays), and the two panes are then replayed together at exactly those timings. The
label says so.

One pair of runs is one draw from a noisy machine: the methods alternate for ROUNDS rounds (plain, DFlash, then
DFlash, plain, ...), each run's share of the CPU that other programs took is measured, and the headline is the
median of the rounds' ratios with their range. When other programs took much of the CPU, or the rounds
disagree, the demo shows the range and says why instead of a headline.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QComboBox, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton,
                               QSizePolicy, QTextEdit, QVBoxLayout, QWidget)

from dflash_desktop.cpu_load import CpuMeter
from dflash_desktop.offers import Offers
from dflash_desktop.pairs import LoadedPair
from dflash_desktop import session
from dflash_desktop.session import BUSY_SHARE
from dflash_desktop.qt_worker import QtWorker
from engine.backends import METHODS

from . import theme

DEFAULT_PROMPT = (  # a code model without a chat template continues this text; no final newline: the
    # tokenizer merges a newline with the next line's indent, so leave both to the model. Chosen among
    # four openings because the demo target continues it with varied code rather than a loop.
    '"""Utilities for reading and writing configuration files."""\n\n'
    "import os\nimport sys\n\n\n"
    "def read_config(path):\n"
    '    """Return a dict of the key = value lines in the file at path."""'
)
DEFAULT_CHAT_PROMPT = ("Write a Python function that returns the paths of all .py files under a folder, sorted, "
                       "with a docstring and two pytest tests.")  # chat drafters accept code answers best
# plain_fallback off: the DFlash run drafts all the way, also where the engine would decode answers plainly
# (llama.cpp's calibrated choice on a CPU, or the fallback when acceptance is low): the demo measures DFlash
DEFAULT_SETTINGS = {"max_new_tokens": 200, "temperature": 0.0, "seed": 0, "plain_fallback": False}
WARMUP_TOKENS = 8
ROUNDS = 3                # alternations of the two methods: a median and a range, not a single draw
SPREAD_LIMIT = 2.0        # rounds whose ratios lie further apart than this are too noisy to headline
BAD_COLOR = "#d1242f"  # readable on both themes; the theme has no text colour for "bad"
REPLAY_NOTE = "Replay at measured speed — runs were measured one after the other"
PLAIN_TITLE, DFLASH_TITLE = "Plain decoding (baseline)", "DFlash"
CHOICE = "The engine's choice"     # the right side's default: how answers speculate (its calibration's pick)


def methods_of(info: dict | None) -> list[str]:
    """The methods a loaded pair runs (engine.backends.METHODS keys), plain decoding first."""
    info = info or {}
    return list(info.get("methods") or (["none", "dflash"] if info.get("has_drafter") else ["none"]))


@dataclass
class Measurement:
    """One measured run: its token chunks stamped with engine time, and the final result."""

    mode: str
    warmup: bool = False  # a short untimed run, so the timed runs pay no first-call costs
    chunks: list[tuple[float, list]] = field(default_factory=list)  # (elapsed_s, [[text, drafted], ...])
    generated: int = 0
    token_ids: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    stop_reason: str = ""
    cpu_other: float | None = None   # share of the CPU other programs used during the run
    cpu_wall_s: float = 0.0          # over how long that share was measured
    done: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seconds(self) -> float:
        """Engine time from the request to its last token: what the replay takes."""
        return self.chunks[-1][0] if self.chunks else 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def set_text(label: QLabel, text: str) -> None:
    """Repaint only on change: the replay ticks at 60 Hz but its labels change far less often."""
    if label.text() != text:
        label.setText(text)


class _Pane(QFrame):
    """One side: a title, the generated text (drafted spans tinted) and a stats line."""

    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.setObjectName("speedupPane")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel(title)
        font = self.title.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.title.setFont(font)
        self.text = QTextEdit(readOnly=True)
        self.text.setFont(QFont("monospace"))
        self.text.document().setDocumentMargin(8)
        self.text.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.stats = QLabel("—")
        self.stats.setWordWrap(True)
        self.stats.setMinimumHeight(self.stats.fontMetrics().lineSpacing() * 2 + 4)  # both panes stay level
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.stats)

    def clear(self) -> None:
        self.text.clear()
        self.stats.setText("—")

    def append(self, spans: list, highlight: bool) -> None:
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for text, drafted in spans:
            fmt = QTextCharFormat()
            if highlight and drafted:
                fmt.setBackground(QColor(theme.current().drafted))
            cursor.insertText(text, fmt)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()

    def plain_text(self) -> str:
        return self.text.toPlainText()


class SpeedupDemo(QWidget):
    """Measures plain decoding then DFlash on the loaded pair, then replays both at measured speed."""

    stateChanged = Signal(str)  # idle, measuring, replaying, finished
    # the plain run's done event and the CPU share other programs took meanwhile: it becomes the pair's
    # one baseline (PairSession.record_baseline), so the stats panel and this demo agree; only from a quiet
    # machine whose rounds agree (`headline`)
    baselineMeasured = Signal(dict, object)

    def __init__(self, worker: QtWorker, parent: QWidget | None = None):
        super().__init__(parent)
        self.worker = worker
        self.settings = dict(DEFAULT_SETTINGS)
        self.state = "idle"
        self.plain: Measurement | None = None     # the run shown for each method: the latest while measuring,
        self.dflash: Measurement | None = None    # the median one once all rounds are in
        self.runs: list[Measurement] = []         # the timed runs, in the order they ran
        self._current: Measurement | None = None
        self._queue: list[Measurement] = []
        self._rid: str | None = None
        self._prompt = ""
        self._chat = False
        self._replay_t0 = 0.0
        self._replay_pos = {"baseline": 0, "dflash": 0}
        self._replay_timer = QTimer(self, interval=16)
        self._replay_timer.timeout.connect(self._replay_tick)
        self._build()
        worker.tokens.connect(self._on_tokens)
        worker.done.connect(self._on_done)
        worker.error.connect(self._on_error)
        worker.warning.connect(self._on_warning)
        worker.loaded.connect(self._suggest_prompt)
        self._suggest_prompt(worker.pair_info)
        self._set_state("idle")

    # -- layout -----------------------------------------------------------------------------------
    def _build(self) -> None:
        self.prompt_edit = QPlainTextEdit(DEFAULT_PROMPT)
        self.prompt_edit.setFont(QFont("monospace"))
        self.prompt_edit.setPlaceholderText("Prompt for both runs (code prompts show DFlash best)")
        self.prompt_edit.setFixedHeight(self.prompt_edit.fontMetrics().lineSpacing() * 6 + 16)
        self.run_button = QPushButton("Run comparison")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(lambda: self.start(self.prompt_edit.toPlainText(), self.settings))
        self.replay_button = QPushButton("Replay")
        self.replay_button.clicked.connect(self.replay)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.status = QLabel("Runs plain decoding, then DFlash, on the loaded model and compares their speed.")
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(160)
        self.progress.hide()
        buttons = QHBoxLayout()
        for w in (self.run_button, self.replay_button, self.stop_button):
            buttons.addWidget(w)
        buttons.addSpacing(12)
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.progress)

        self.error_label = QLabel()
        self.error_label.setObjectName("speedupError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        c = theme.current()
        self.error_label.setStyleSheet(f"QLabel#speedupError {{ background: {c.error_bg}; border: 1px solid "
                                       f"{c.error_border}; border-radius: 6px; padding: 8px; }}")
        self.error_label.hide()
        self.replay_label = QLabel(REPLAY_NOTE)
        self.replay_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.replay_label.setStyleSheet("color: palette(placeholder-text); font-style: italic;")

        # the two sides race any two of the pair's methods: plain decoding against the engine's choice at first
        self.left_method, self.right_method = QComboBox(), QComboBox()
        self.left_method.setAccessibleName("Left side's method")
        self.right_method.setAccessibleName("Right side's method")
        self.left_method.setToolTip("How the left side decodes: plain decoding is the baseline users run today.")
        self.right_method.setToolTip("How the right side decodes: the engine's choice is what your answers use.")
        race = QHBoxLayout()
        race.addWidget(QLabel("Race"))
        race.addWidget(self.left_method)
        race.addWidget(QLabel("against"))
        race.addWidget(self.right_method)
        race.addStretch(1)
        self.plain_pane, self.dflash_pane = _Pane(PLAIN_TITLE), _Pane(DFLASH_TITLE)
        panes = QHBoxLayout()
        panes.addWidget(self.plain_pane, 1)
        panes.addWidget(self.dflash_pane, 1)

        self.speedup_label = QLabel("")
        self.speedup_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        big = self.speedup_label.font()
        big.setPointSizeF(big.pointSizeF() * 2.6)
        big.setBold(True)
        self.speedup_label.setFont(big)
        self.speedup_detail = QLabel("")
        self.speedup_detail.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.speedup_detail.setWordWrap(True)
        self.identical_label = QLabel("")
        self.identical_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.identical_label.setWordWrap(True)
        legend = QLabel(f'<span style="background: {theme.current().drafted}">&nbsp;&nbsp;&nbsp;&nbsp;</span>'
                        "&nbsp; text drafted by DFlash and accepted by the target model")
        legend.setAlignment(Qt.AlignmentFlag.AlignRight)
        for w in (self.speedup_label, self.speedup_detail, self.identical_label):
            w.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Prompt (used for both runs)"))
        layout.addWidget(self.prompt_edit)
        layout.addLayout(race)
        layout.addLayout(buttons)
        layout.addWidget(self.error_label)
        layout.addWidget(self.replay_label)
        layout.addLayout(panes, 1)
        layout.addWidget(legend)
        layout.addWidget(self.speedup_label)
        layout.addWidget(self.speedup_detail)
        layout.addWidget(self.identical_label)

    def _suggest_prompt(self, info: dict | None) -> None:
        """Swap in the default prompt that suits the loaded model, unless the user wrote their own."""
        if info and self.prompt_edit.toPlainText() in (DEFAULT_PROMPT, DEFAULT_CHAT_PROMPT):
            self.prompt_edit.setPlainText(DEFAULT_CHAT_PROMPT if info.get("chat_template") else DEFAULT_PROMPT)
        self._offer_methods(info)

    def _offer_methods(self, info: dict | None) -> None:
        """The pickers list what the loaded pair runs; plain decoding against the engine's choice to begin."""
        methods = methods_of(info)
        chosen = ((info or {}).get("speculation") or {}).get("method")
        for combo, options in ((self.left_method, methods),
                               (self.right_method, [None] + [m for m in methods if m != "none"])):
            kept = combo.currentData() if combo.count() else None
            combo.clear()
            for m in options:
                label = (f"{CHOICE} ({METHODS[chosen]})" if m is None and chosen else CHOICE if m is None
                         else METHODS.get(m, m))
                combo.addItem(label, m)
            if kept in options:                      # a pick that the pair (loaded again) still runs stays
                combo.setCurrentIndex(options.index(kept))
        for combo in (self.left_method, self.right_method):
            combo.setEnabled(combo.count() > 1)

    def method_of(self, mode: str) -> str | None:
        """The method a side runs: "baseline" is the left pane, "dflash" the right (None: the engine's choice)."""
        combo = self.left_method if mode == "baseline" else self.right_method
        return combo.currentData() if combo.count() else ("none" if mode == "baseline" else None)

    def label_of(self, mode: str) -> str:
        method = self.method_of(mode)
        return METHODS[method] if method else LoadedPair.of(self.worker.pair_info or {}).method_label

    @property
    def against_plain(self) -> bool:
        """The classic race: plain decoding against the engine's choice (a baseline, and the calibration's say)."""
        return self.method_of("baseline") == "none" and self.method_of("dflash") is None

    def _set_state(self, state: str) -> None:
        self.state = state
        busy = state in ("measuring", "replaying")
        self.run_button.setEnabled(not busy)
        self.prompt_edit.setReadOnly(busy)
        self.replay_button.setEnabled(not busy and self._measured())
        self.stop_button.setEnabled(busy)
        for combo in (self.left_method, self.right_method):
            combo.setEnabled(not busy and combo.count() > 1)
        self.progress.setVisible(state == "measuring")
        self.replay_label.setVisible(state in ("replaying", "finished"))
        self.stateChanged.emit(state)

    def _measured(self) -> bool:
        return bool(self.plain and self.dflash and self.plain.chunks and self.dflash.chunks)

    # -- measuring --------------------------------------------------------------------------------
    def start(self, prompt: str, settings: dict | None = None) -> bool:
        """Measure plain decoding, then DFlash, then replay both. False (with a message) if it cannot start."""
        if self.state in ("measuring", "replaying"):
            return False
        if settings:
            self.settings = {**DEFAULT_SETTINGS, **settings}
        if prompt != self.prompt_edit.toPlainText():
            self.prompt_edit.setPlainText(prompt)
        info = self.worker.pair_info
        if not prompt.strip():
            return self._refuse("Type a prompt first.")
        if info is None:
            return self._refuse("No model is loaded. Load a model pair first, then run the comparison.")
        if len(methods_of(info)) < 2:
            return self._refuse(f"{info.get('name', 'This model')} was loaded without its DFlash drafter, "
                                "so there is nothing to compare. Load a pair whose drafter fits.")
        if self.method_of("baseline") == self.method_of("dflash"):
            return self._refuse("Both sides would run the same method: choose two different ones to race.")
        if not Offers.of(info).baseline:
            return self._refuse(f"{info.get('name', 'This model')} runs on a server, which decides itself how to "
                                "decode every request: plain decoding cannot be measured there. Load a pair on "
                                "this computer to compare.")
        self._prompt, self._chat = prompt, bool(info.get("chat_template"))
        self.error_label.hide()
        self.plain = self.dflash = None
        for pane in (self.plain_pane, self.dflash_pane):
            pane.clear()
        self.plain_pane.title.setText(PLAIN_TITLE if self.method_of("baseline") == "none" else self.label_of("baseline"))
        self.dflash_pane.title.setText(self.label_of("dflash") if self.method_of("dflash") != "none" else "Plain decoding")
        self.speedup_label.clear()
        self.speedup_detail.clear()
        self.identical_label.clear()
        self.progress.setRange(0, int(self.settings.get("max_new_tokens", 256)))
        self._set_state("measuring")
        # plain, DFlash, then DFlash, plain, ...: neither method always runs first in a round
        order = [("baseline", "dflash") if r % 2 == 0 else ("dflash", "baseline") for r in range(ROUNDS)]
        self.runs = [Measurement(mode) for pair in order for mode in pair]
        self._queue = [Measurement("baseline", warmup=True), Measurement("dflash", warmup=True), *self.runs]
        self._measure(self._queue.pop(0))
        return True

    def _refuse(self, message: str) -> bool:
        self._show_error(message)
        return False

    def _measure(self, m: Measurement) -> None:
        self._current = m
        if not m.warmup:            # its pane shows this run as it streams
            if m.mode == "baseline":
                self.plain = m
            else:
                self.dflash = m
            self._pane_of(m).clear()
        self._meter = CpuMeter([getattr(self.worker.client, "pid", None)]).start()
        self.progress.setValue(0)
        self._show_progress(0)
        settings = {**self.settings, "max_new_tokens": WARMUP_TOKENS} if m.warmup else dict(self.settings)
        method = self.method_of(m.mode)
        mode = "baseline" if method == "none" else "dflash"
        if method not in (None, "none"):
            settings["method"] = method
        if self._chat:  # chat models answer through their template, thinking off as the drafters were trained
            self._rid = self.worker.generate(messages=[{"role": "user", "content": self._prompt}], mode=mode,
                                             settings=settings, enable_thinking=False)
        else:
            self._rid = self.worker.generate(prompt=self._prompt, raw=True, mode=mode, settings=settings)

    def _show_progress(self, tokens: int) -> None:
        if self._current.warmup:
            self.status.setText("Warming up: a short untimed run of each method, so neither pays first-call costs…")
            return
        what = self.label_of(self._current.mode)
        step = f"run {self.runs.index(self._current) + 1} of {len(self.runs)}"
        set_text(self.status, f"Measuring {what}… {tokens} tokens  ({step}, each run alone on this device)")
        self.progress.setValue(min(tokens, self.progress.maximum()))

    def _pane_of(self, m: Measurement) -> _Pane:
        return self.plain_pane if m.mode == "baseline" else self.dflash_pane

    def _on_tokens(self, ev: dict) -> None:
        m = self._current
        if m is None or m.warmup or ev.get("id") != self._rid:
            return
        m.chunks.append((float(ev["elapsed_s"]), [list(s) for s in ev["spans"]]))
        m.generated = int(ev.get("generated", m.generated))
        self._pane_of(m).append(ev["spans"], highlight=self.method_of(m.mode) != "none")
        self._show_progress(m.generated)

    def _on_done(self, ev: dict) -> None:
        m = self._current
        if m is None or ev.get("id") != self._rid:
            return
        m.token_ids, m.stats, m.stop_reason = list(ev.get("token_ids") or []), ev.get("stats") or {}, ev["stop_reason"]
        m.done = ev
        self._current, self._rid = None, None
        m.cpu_other = self._meter.stop() if getattr(self, "_meter", None) else None
        m.cpu_wall_s = (self._meter.wall_s or 0.0) if m.cpu_other is not None else 0.0
        if m.stop_reason == "cancelled":
            self._queue, self.plain, self.dflash, self.runs = [], None, None, []
            self.status.setText("Stopped. Run again to measure both methods.")
            self._set_state("idle")
        elif self._queue:
            self._measure(self._queue.pop(0))
        else:
            self.plain, self.dflash = self._median_run("baseline"), self._median_run("dflash")
            self._set_state("finished")
            self._show_results()
            if self.headline and self.method_of("baseline") == "none" and float(self.plain.stats.get("decode_tok_s") or 0):
                self.baselineMeasured.emit(self.plain.done, self.plain.cpu_other)
            self.replay()

    def _on_error(self, ev: dict) -> None:
        if self._current is None or ev.get("id") not in (self._rid, None):
            return
        self._current, self._rid, self._queue, self.runs = None, None, [], []
        self.plain = self.dflash = None
        self._show_error(ev.get("message") or "The engine reported an error.")
        self.status.setText("The comparison did not finish. Fix the problem above and run it again.")
        self._set_state("idle")

    def _on_warning(self, ev: dict) -> None:
        if self._current is not None and ev.get("id") == self._rid:
            self._show_error(ev.get("message", ""))

    def _show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()

    # -- results ----------------------------------------------------------------------------------
    def _median_run(self, mode: str) -> Measurement:
        runs = sorted((m for m in self.runs if m.mode == mode), key=lambda m: m.tok_s)
        return runs[len(runs) // 2]

    @property
    def ratios(self) -> list[float]:
        """DFlash tok/s over plain tok/s, round by round (each round: one run of each, back to back)."""
        if not self._measured():
            return []
        plain = [m for m in self.runs if m.mode == "baseline"]
        dflash = [m for m in self.runs if m.mode == "dflash"]
        return [d.tok_s / p.tok_s for p, d in zip(plain, dflash) if p.tok_s > 0]

    @property
    def speedup(self) -> float | None:
        """The median of the rounds' ratios."""
        ratios = sorted(self.ratios)
        return ratios[len(ratios) // 2] if ratios else None

    @property
    def busiest(self) -> float | None:
        """The share of the CPU other programs took over all the timed runs (each run weighed by its length: a
        run of a few ticks alone says little)."""
        measured = [m for m in self.runs if m.cpu_other is not None and m.cpu_wall_s > 0]
        wall = sum(m.cpu_wall_s for m in measured)
        return sum(m.cpu_other * m.cpu_wall_s for m in measured) / wall if wall else None

    @property
    def headline(self) -> bool:
        """Whether the rounds can be summed up in one number: a quiet machine, and rounds that agree."""
        ratios = self.ratios
        if not ratios:
            return False
        quiet = self.busiest is None or self.busiest < BUSY_SHARE
        return quiet and max(ratios) <= SPREAD_LIMIT * min(ratios)

    @property
    def greedy(self) -> bool:
        return float(self.settings.get("temperature", 0.0)) == 0.0

    @property
    def identical(self) -> bool | None:
        """For greedy decoding, whether every DFlash run produced exactly the plain tokens (None otherwise)."""
        if not (self.greedy and self._measured()):
            return None
        return all(first_difference(self.plain.token_ids, m.token_ids) is None for m in self.runs)

    def _final_stats(self, m: Measurement) -> str:
        text = f"<b>{m.tok_s:.1f} tok/s</b> · {m.seconds:.2f} s · {m.tokens} tokens<br>"
        if self.method_of(m.mode) != "none":
            tau, rate = m.stats.get("tau", 0.0), m.stats.get("acceptance_rate", 0.0)
            return text + f"τ {tau:.2f} tokens per target pass · {rate:.0%} of drafted tokens accepted"
        return text + "one token per target pass"

    def _show_results(self) -> None:
        s, ratios = self.speedup or 0.0, self.ratios
        info = self.worker.pair_info or {}
        where = f" on {info.get('device', 'this device')}" if info else ""
        spread = f"{min(ratios):.2f}×–{max(ratios):.2f}×"
        rounds = f"median of {len(ratios)} rounds, {spread}"
        if not self.headline:
            busy = self.busiest is not None and self.busiest >= BUSY_SHARE
            self.speedup_label.setText(spread)
            self.speedup_label.setStyleSheet("")
            why = (f"The machine was busy: other programs used {self.busiest:.0%} of the CPU during the runs"
                   if busy else "The rounds disagree")
            self.speedup_detail.setText(f"{why}, so the {len(ratios)} rounds measured {self.label_of('dflash')} at "
                                        f"{spread} of {self.label_of('baseline')}'s speed: no single figure would be "
                                        "honest. Run it again when the "
                                        "computer is quiet. The baseline in the stats panel was left as it was.")
        else:
            self.speedup_label.setText(f"{s:.2f}× faster" if s >= 1 else f"{s:.2f}× — slower than "
                                       f"{self.label_of('baseline')}")
            color = theme.current().good if s >= 1 else BAD_COLOR
            self.speedup_label.setStyleSheet(f"color: {color};")
            detail = (f"{self.label_of('dflash')} {self.dflash.tok_s:.1f} tok/s vs {self.label_of('baseline')} "
                      f"{self.plain.tok_s:.1f} tok/s{where}, each run alone, {rounds}.")
            tau = self.dflash.stats.get("tau", 0.0)
            if s < 1 and tau < 2:
                detail += (f" The target kept few drafted tokens (τ {tau:.2f}); drafters do best on the kind of text "
                           "they were trained on.")
            elif s < 1:
                detail += (f" Drafts were accepted (τ {tau:.2f}), but here a draft-and-verify step costs more than "
                           "the tokens it saves; DFlash pays off with larger models, on a GPU.")
            agreement = session.calibration_agreement(info.get("speculation"), s) if self.against_plain else ""
            if agreement:
                detail += " " + agreement
            plain_decode = float(self.plain.stats.get("decode_tok_s") or 0.0)
            if plain_decode and self.method_of("baseline") == "none":
                detail += (f" The median plain run is now the pair's baseline in the stats panel: {plain_decode:.1f} "
                           "tok/s decoding alone, the first token and the prompt not counted.")
            self.speedup_detail.setText(detail)
        if self.identical is None:
            self.identical_label.setText("Sampling (temperature > 0): the outputs may differ, but both follow the "
                                         "target model's own distribution exactly.")
            self.identical_label.setStyleSheet("")
        elif self.identical:
            self.identical_label.setText(f"Outputs identical ✓  (all {self.plain.tokens} tokens of every run, greedy "
                                         "decoding)")
            self.identical_label.setStyleSheet(f"color: {theme.current().good}; font-weight: bold;")
        else:
            other = next(m for m in self.runs if first_difference(self.plain.token_ids, m.token_ids) is not None)
            i = first_difference(self.plain.token_ids, other.token_ids)
            self.identical_label.setText(f"Outputs differ ✗  first difference at token {i} of "
                                         f"{max(self.plain.tokens, other.tokens)}. Greedy speculation should "
                                         "match plain decoding exactly; please report this.")
            self.identical_label.setStyleSheet(f"color: {BAD_COLOR}; font-weight: bold;")

    # -- replay -----------------------------------------------------------------------------------
    def replay(self) -> None:
        """Play both measured runs together, each at the timing recorded when it ran alone."""
        if not self._measured() or self.state in ("measuring", "replaying"):
            return
        for pane in (self.plain_pane, self.dflash_pane):
            pane.clear()
        self._replay_pos = {"baseline": 0, "dflash": 0}
        self._replay_t0 = time.perf_counter()
        self._set_state("replaying")
        self._replay_tick()
        if self.state == "replaying":
            self._replay_timer.start()

    def _replay_tick(self) -> None:
        now = time.perf_counter() - self._replay_t0
        for m in (self.plain, self.dflash):
            pane, pos = self._pane_of(m), self._replay_pos[m.mode]
            while pos < len(m.chunks) and m.chunks[pos][0] <= now:
                pane.append(m.chunks[pos][1], highlight=self.method_of(m.mode) != "none")
                pos += 1
            self._replay_pos[m.mode] = pos
            set_text(pane.stats, self._final_stats(m) if pos >= len(m.chunks) else f"{now:.1f} s …")
        total = max(self.plain.seconds, self.dflash.seconds)
        set_text(self.status, f"Replaying… {min(now, total):.1f} s of {total:.1f} s")
        if all(self._replay_pos[m.mode] >= len(m.chunks) for m in (self.plain, self.dflash)):
            self._replay_timer.stop()
            self.status.setText("Done. Replay shows both runs again at their measured speed.")
            self._set_state("finished")

    def stop(self) -> None:
        if self.state == "measuring" and self._rid:
            self.worker.cancel(self._rid)
            self.status.setText("Stopping…")
        elif self.state == "replaying":
            self._replay_timer.stop()
            self.status.setText("Replay stopped.")
            self._set_state("finished")
