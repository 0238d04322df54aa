"""The DFlash stats dock: live speed next to the measured baseline, acceptance, per-position bars,
the acceptance-length histogram and a tok/s sparkline, all drawn with QPainter (QtCharts is not part
of PySide6-Essentials). When DFlash is not paying off it says so in words."""
from __future__ import annotations

import time

from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (QDockWidget, QFrame, QGridLayout, QHBoxLayout, QLabel, QPushButton, QScrollArea,
                               QVBoxLayout, QWidget)

from dflash_desktop.session import BaselineRecord, diagnose, method_of, speedup
from dflash_desktop.pairs import LoadedPair

from . import theme
from .pair_list_model import memory


NO_DRAFTER = "Plain decoding: no drafter is loaded, so there is no acceptance or DFlash speedup to show."


class BarChart(QWidget):
    """Vertical bars with labels under them; values are drawn relative to `maximum` (or their max)."""

    def __init__(self, accessible: str, maximum: float | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.values: list[float] = []
        self.labels: list[str] = []
        self.maximum = maximum
        self.setAccessibleName(accessible)
        self.setMinimumHeight(90)

    def set_values(self, values: list[float], labels: list[str] | None = None) -> None:
        self.values = [float(v) for v in values]
        self.labels = labels or [str(i + 1) for i in range(len(values))]
        self.update()

    def paintEvent(self, _event) -> None:
        c = theme.current()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(2, 4, -2, -16)
        p.setPen(QPen(QColor(c.border)))
        p.drawLine(rect.bottomLeft(), rect.bottomRight())
        if not self.values:
            p.setPen(QColor(c.muted))
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "no data yet")
            return
        top = self.maximum or max(self.values) or 1.0
        n = len(self.values)
        slot = rect.width() / n
        p.setPen(Qt.PenStyle.NoPen)
        for i, v in enumerate(self.values):
            h = rect.height() * min(v / top, 1.0)
            p.setBrush(QColor(c.accent))
            p.drawRoundedRect(QRectF(rect.left() + i * slot + slot * 0.15, rect.bottom() - h, slot * 0.7, h), 2, 2)
        p.setPen(QColor(c.muted))
        step = max(1, n // 8)
        for i in range(0, n, step):
            p.drawText(QRectF(rect.left() + i * slot, rect.bottom() + 1, slot * step, 14),
                       Qt.AlignmentFlag.AlignLeft, self.labels[i])


class Sparkline(QWidget):
    """tok/s over the current answer."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.points: list[float] = []
        self.setAccessibleName("Tokens per second over the current answer")
        self.setMinimumHeight(70)

    def set_points(self, points: list[float]) -> None:
        self.points = list(points)
        self.update()

    def paintEvent(self, _event) -> None:
        c = theme.current()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(2, 4, -2, -18)
        if len(self.points) < 2:
            p.setPen(QColor(c.muted))
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "no data yet")
            return
        top = max(self.points) or 1.0
        path = QPainterPath()
        for i, v in enumerate(self.points):
            x = rect.left() + rect.width() * i / (len(self.points) - 1)
            y = rect.bottom() - rect.height() * v / top
            path.moveTo(x, y) if i == 0 else path.lineTo(x, y)
        p.setPen(QPen(QColor(c.accent), 2))
        p.drawPath(path)
        p.setPen(QColor(c.muted))
        p.drawText(QRectF(self.rect()).adjusted(2, 0, -2, 0), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom,
                   f"peak {top:.0f} tok/s")


class Metric(QWidget):
    """One headline figure: a big value over a short caption, both carrying the same tooltip."""

    def __init__(self, caption: str, accessible: str, tip: str, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.value = QLabel("—")
        self.value.setObjectName("bigNumber")
        self.value.setAccessibleName(accessible)
        self.caption = QLabel(caption)
        self.caption.setObjectName("muted")
        self.caption.setWordWrap(True)
        for label in (self.value, self.caption):
            layout.addWidget(label)
        self.set_tip(tip)

    def set_tip(self, tip: str) -> None:
        for w in (self, self.value, self.caption):
            w.setToolTip(tip)

    def setText(self, text: str) -> None:   # noqa: N802 (reads like a QLabel's)
        self.value.setText(text)

    def text(self) -> str:
        return self.value.text()

    def needed_width(self) -> int:
        fm, cfm = self.value.fontMetrics(), self.caption.fontMetrics()
        caption = self.caption.text()
        # a short caption ("Baseline tok/s") stays on one line; a long one may wrap between words
        words = cfm.horizontalAdvance(caption) if len(caption) <= 16 else max(
            cfm.horizontalAdvance(w) for w in caption.split())
        return max(fm.horizontalAdvance(self.value.text()), fm.horizontalAdvance("00.00×"), words) + 12


class MetricGrid(QWidget):
    """Metrics side by side while they fit, wrapping onto more rows when the panel is narrow or the font
    large, so no number is ever clipped."""

    def __init__(self, metrics: list[Metric], parent: QWidget | None = None):
        super().__init__(parent)
        self.metrics = metrics
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setHorizontalSpacing(10)
        self.grid.setVerticalSpacing(6)
        self._columns = 0
        self._place(len(metrics))

    def _place(self, columns: int) -> None:
        if columns == self._columns:
            return
        self._columns = columns
        for m in self.metrics:
            self.grid.removeWidget(m)
        for i, m in enumerate(self.metrics):
            self.grid.addWidget(m, i // columns, i % columns)
        for c in range(len(self.metrics)):
            self.grid.setColumnStretch(c, 1 if c < columns else 0)
        self.updateGeometry()

    def reflow(self) -> None:
        widest = max(m.needed_width() for m in self.metrics)
        fit = max(1, (self.width() + 10) // (widest + 10))
        self._place(min(len(self.metrics), fit))

    def minimumSizeHint(self) -> QSize:   # noqa: N802
        hint = super().minimumSizeHint()
        return QSize(max(m.needed_width() for m in self.metrics), hint.height())

    def resizeEvent(self, event) -> None:   # noqa: N802
        super().resizeEvent(event)
        self.reflow()


def _caption(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("muted")
    return label


def _section(text: str, tip: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("section")
    label.setWordWrap(True)
    label.setToolTip(tip)
    return label


TIPS = {
    "dflash": "Decoding speed of this answer with DFlash: tokens after the first one, per second of decoding "
              "(the prompt's prefill is not counted). Live while the answer streams, exact when it ends.",
    "baseline": "Plain decoding speed of the same target model on this machine (one token per target pass), "
                "from the one baseline measurement shown below. Re-measure or the speedup demo replaces it.",
    "speedup": "DFlash tok/s divided by the baseline tok/s above. Recomputed whenever the baseline changes.",
    "acceptance": "Of the tokens the drafter proposed and the target checked in this answer, the share the "
                  "target accepted (accepted ÷ drafted).",
    "tau": "τ: mean number of tokens committed per target pass (accepted drafts + the target's own token). "
           "Plain decoding commits 1.",
    "positions": "For each slot of the draft block, the share of target passes in which the drafted token at "
                 "that slot was accepted. Later slots are accepted only if all earlier ones were.",
    "histogram": "How many target passes committed 1, 2, 3 … tokens in this answer (the bar at n counts "
                 "passes that committed n tokens).",
    "sparkline": "Tokens per second over this answer, measured between token batches as they streamed.",
    "draft": "What the drafter's own pass cost in this answer, and which tokens it could propose. A drafter that "
             "proposes only the tokens its model uses most computes far fewer scores per draft; the model still "
             "checks every token, so the answer is the same.",
}


def draft_pass(stats: dict) -> str:
    """The answer's draft pass in words ('' when nothing was drafted by a drafter)."""
    ms, size, method = stats.get("draft_ms"), stats.get("draft_vocab"), stats.get("speculation", "dflash")
    if (not stats.get("drafted") or method not in ("dflash", "dflash2", "dspark", "eagle3")
            or stats.get("remote")     # a server's own drafter: its pass and vocabulary are not reported
            or (method == "eagle3" and not ms)):   # llama.cpp's EAGLE-3: neither its pass nor its head's size
        return ""
    tokens = f"from the {size:,} tokens this model uses most" if size else "over every token"
    return f"Draft pass: {ms:.1f} ms a step, {tokens}." if ms else f"The drafter drafts {tokens}."


class StatsPanel(QDockWidget):
    remeasureRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("DFlash stats", parent)
        self.setObjectName("statsPanel")
        self.setAccessibleName("DFlash statistics")
        self.baseline: BaselineRecord | None = None
        self.has_drafter = True         # answers may draft (a drafter, or n-gram lookup): LoadedPair.speculates
        self.method_label = "DFlash"     # how they draft (LoadedPair.method_label)
        self.remote = False      # a pair on a server: acceptance is known only from what it reports at the end
        self.values: dict = {}   # what is shown, in numbers (tests and the screenshot script read it)
        self.stats: dict | None = None     # the shown answer's final stats (None: live or nothing)
        self.context: dict = {}            # what the diagnosis needs besides the stats (session.diagnose)
        self.answer_baseline: BaselineRecord | None = None   # the shown answer's own model's baseline
        self.answer_has_drafter = True
        self._live_steps: list[list[int]] = []
        self._live_rates: list[float] = []
        self._live_tok_s = 0.0
        self._last_point: tuple[float, int] | None = None

        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(12, 10, 12, 12)
        layout.setSpacing(6)
        self.runtime = QLabel("No model loaded.")
        self.runtime.setObjectName("muted")
        self.runtime.setWordWrap(True)
        self.runtime.setAccessibleName("Where the model runs")
        self.runtime.setToolTip("The engine, device and number format the worker actually loaded the model with.")
        layout.addWidget(self.runtime)
        self.memory = QLabel("")
        self.memory.setObjectName("muted")
        self.memory.setWordWrap(True)
        self.memory.setAccessibleName("Memory the model uses")
        self.memory.setToolTip("Memory as the worker measured it: on an NVIDIA GPU torch's allocated peak and "
                               "what its caching allocator reserves; elsewhere the engine process's peak "
                               "resident memory.")
        self.memory.hide()
        layout.addWidget(self.memory)
        self.subject = QLabel("No answer in this chat yet.")
        self.subject.setObjectName("muted")
        self.subject.setWordWrap(True)
        self.subject.setAccessibleName("Which answer these figures describe")
        self.subject.setToolTip("The figures below describe this answer of the chat on screen.")
        layout.addWidget(self.subject)
        self.dflash_metric = Metric("DFlash tok/s", "DFlash tokens per second", TIPS["dflash"])
        self.baseline_metric = Metric("Baseline tok/s", "Baseline tokens per second", TIPS["baseline"])
        self.speedup_metric = Metric("Speedup", "Speedup over baseline", TIPS["speedup"])
        self.dflash_label, self.baseline_label, self.speedup_label = (
            self.dflash_metric, self.baseline_metric, self.speedup_metric)
        self.speed_grid = MetricGrid([self.dflash_metric, self.baseline_metric, self.speedup_metric])
        layout.addWidget(self.speed_grid)

        self.baseline_note = QLabel("Baseline not measured yet.")
        self.baseline_note.setObjectName("muted")
        self.baseline_note.setWordWrap(True)
        self.baseline_note.setAccessibleName("How the baseline was measured")
        self.baseline_note.setToolTip("When, how and on how many tokens the baseline was measured, and how busy "
                                      "the CPU was meanwhile.")
        self.remeasure_button = QPushButton("Re-measure")
        self.remeasure_button.setAccessibleName("Measure the baseline again")
        self.remeasure_button.setToolTip("Measure plain decoding of the same target again (64 tokens, greedy); "
                                         "the speedup and the warnings follow the new value.")
        self.remeasure_button.clicked.connect(self.remeasureRequested)
        layout.addWidget(self.baseline_note)
        row = QHBoxLayout()
        row.addWidget(self.remeasure_button)
        row.addStretch(1)
        layout.addLayout(row)

        self.warning = QLabel("")
        self.warning.setObjectName("warning")
        self.warning.setWordWrap(True)
        self.warning.setAccessibleName("DFlash warning")
        self.warning.setToolTip("Why DFlash is not paying off on this answer (or why its speedup is not "
                                "representative), from this answer's measurements.")
        self.warning.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.warning.hide()
        layout.addWidget(self.warning)

        self.acceptance_metric = Metric("of drafted tokens accepted", "Acceptance rate", TIPS["acceptance"])
        self.tau_metric = Metric("τ, tokens per target pass", "Mean acceptance length tau", TIPS["tau"])
        self.acceptance_label, self.tau_label = self.acceptance_metric, self.tau_metric
        self.accept_grid = MetricGrid([self.acceptance_metric, self.tau_metric])
        layout.addWidget(self.accept_grid)
        self.draft_note = QLabel("")
        self.draft_note.setObjectName("muted")
        self.draft_note.setWordWrap(True)
        self.draft_note.setAccessibleName("Draft pass")
        self.draft_note.setToolTip(TIPS["draft"])
        self.draft_note.hide()
        layout.addWidget(self.draft_note)

        layout.addSpacing(8)
        layout.addWidget(_section("Acceptance by draft position", TIPS["positions"]))
        self.position_bars = BarChart("Acceptance rate by draft position", maximum=1.0)
        self.position_bars.setToolTip(TIPS["positions"])
        layout.addWidget(self.position_bars)
        layout.addSpacing(8)
        layout.addWidget(_section("Tokens committed per target pass", TIPS["histogram"]))
        self.histogram = BarChart("Acceptance length histogram")
        self.histogram.setToolTip(TIPS["histogram"])
        layout.addWidget(self.histogram)
        layout.addSpacing(8)
        layout.addWidget(_section("tok/s over this answer", TIPS["sparkline"]))
        self.sparkline = Sparkline()
        self.sparkline.setToolTip(TIPS["sparkline"])
        layout.addWidget(self.sparkline)
        layout.addLayout(self._legend())
        layout.addStretch(1)

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(body)
        self.setWidget(scroll)
        self.setMinimumWidth(200)

    def _legend(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.legend = QLabel()
        self.legend.setObjectName("muted")
        self.legend.setWordWrap(True)
        self.legend.setAccessibleName("Highlight legend")
        self.legend.setToolTip("What the tint in the answers means.")
        row.addWidget(self.legend)
        self.restyle()
        theme.follow(self.restyle)
        return row

    def restyle(self) -> None:
        """Theme colours drawn into rich text and charts (the style sheet covers the rest); runs on every theme
        change (theme.follow)."""
        c = theme.current()
        self.legend.setText(f'<span style="background:{c.drafted}">&nbsp;tinted&nbsp;</span> text was proposed '
                            "by the drafter and accepted by the target; untinted text is the target's own token "
                            "(toggle: Highlight drafted).")
        for chart in (self.position_bars, self.histogram, self.sparkline):
            chart.update()

    # -- updates ------------------------------------------------------------------------------------
    def set_runtime(self, loaded: LoadedPair) -> None:
        """The loaded pair's engine, device and dtype, as the worker (or the remote server) reports them."""
        self.remote = not loaded.offers.local
        text = (f"Runs on {loaded.device} · remote server, its own speculative decoding" if self.remote else
                f"Runs on {loaded.where} · {loaded.engine} engine · {loaded.dtype} weights")
        if loaded.speculation:        # an engine that chose DFlash's settings or plain decoding itself
            text += f"\n{loaded.speculation['reason']}"
        for why in loaded.engine_reasons:
            text += f"\n{why}"
        if loaded.device_note:        # not on the GPU asked for, or only partly
            text += f"\n{loaded.device_note}"
        if not self.remote and not loaded.speculates:
            text += f"\n{NO_DRAFTER}"
        self.runtime.setText(text)
        self.values["runtime"] = text
        self._show_memory(loaded.event, "after loading")

    def set_baseline(self, record: BaselineRecord | None, measuring: bool = False) -> None:
        """The loaded pair's one baseline changed (or is being measured): the live figures follow; a finished
        answer keeps its own model's baseline (set_stats), which the chat controller passes again when it
        changes."""
        self.baseline = record
        if measuring:
            self.baseline_note.setText("Measuring the baseline: plain decoding of the same target, 64 tokens…")
        else:
            self.baseline_note.setText(record.describe() if record else "Baseline not measured yet.")
        self.remeasure_button.setEnabled(not measuring)
        self.baseline_label.setText(f"{record.tok_s:.1f}" if record else "—")
        self.values["baseline_tok_s"] = record.tok_s if record else None
        if self.stats is None:
            self._show(self._live_tok_s, None, None, keep=True)

    def clear_answer(self, subject: str = "No answer in this chat yet.") -> None:
        """Nothing to describe (a new chat, a chat without answers): no figure of another answer stays."""
        self.stats, self.context = None, {}
        self._live_steps, self._live_rates, self._last_point, self._live_tok_s = [], [], None, 0.0
        self.subject.setText(subject)
        self.dflash_label.setText("—")
        self.dflash_metric.caption.setText("tok/s")    # which method writes the next answer is not known yet
        self.speedup_label.setText("—")
        self.acceptance_label.setText("—")
        self.tau_label.setText("—")
        self.position_bars.set_values([])
        self.histogram.set_values([])
        self.sparkline.set_points([])
        self.values.update(dflash_tok_s=None, speedup=None, acceptance_rate=None, tau=None, position_rates=[],
                           histogram=[])
        self.draft_note.hide()
        self.set_diagnosis(None)

    def start_answer(self, subject: str = "The answer being written (live).") -> None:
        self.clear_answer(subject)

    def update_live(self, event: dict) -> None:
        """A (coalesced) tokens event: running tok/s, acceptance, the sparkline and both bar charts, all from
        this answer's steps only."""
        self._live_steps += [s for s in event.get("steps", []) if s[0] > 0]
        generated, elapsed = int(event.get("generated") or 0), float(event.get("elapsed_s") or 0.0)
        if self._last_point is None:   # rates start after the first token (prefill is not decoding)
            self._last_point = (elapsed, generated)
        t0, g0 = self._last_point
        if elapsed - t0 >= 0.05 and generated > g0:
            self._live_rates.append((generated - g0) / (elapsed - t0))
            self._last_point = (elapsed, generated)
            self.sparkline.set_points(self._live_rates)
        proposed = sum(s[0] for s in self._live_steps)
        accepted = sum(s[1] for s in self._live_steps)
        tau = (accepted + len(self._live_steps)) / len(self._live_steps) if self._live_steps else 0.0
        rate = generated / elapsed if elapsed > 0 else 0.0
        self._live_tok_s = rate
        if self.remote:   # a server reports its counts when the answer ends, if at all
            self._show(rate, None, None)
            return
        self._show(rate, accepted / proposed if proposed else 0.0, tau)
        if self._live_steps:
            width = max(s[0] for s in self._live_steps)
            hist = [0] * (width + 1)
            positions = [0] * width
            for p, a in self._live_steps:
                hist[min(a, width)] += 1
                for k in range(min(a, width)):
                    positions[k] += 1
            rates = [n / len(self._live_steps) for n in positions]
            self.position_bars.set_values(rates)
            self.histogram.set_values(hist)
            self.values.update(position_rates=rates, histogram=hist)

    def set_stats(self, stats: dict, context: dict | None = None, subject: str = "The last answer.",
                  baseline: BaselineRecord | None = None) -> None:
        """Final numbers of an answer (the done event's, or a stored answer's); they replace the live estimates
        exactly. Counts a server did not report (`unknown`) are shown as not reported, never as zeros.
        context: what session.diagnose needs to explain a slow or unrepresentative answer. baseline: plain
        decoding of the model that wrote this answer (None: not measured, or the answer does not say which
        model wrote it), so a ratio never mixes two models."""
        self.stats, self.context = dict(stats), dict(context or {})
        self.answer_baseline = baseline
        model = self.stats.get("model") or {}
        self.answer_has_drafter = bool(model.get("has_drafter", self.has_drafter))
        self.subject.setText(subject)
        self._show_memory(self.stats, "in this answer")
        self._render_final()

    def set_answer_baseline(self, record: BaselineRecord | None) -> None:
        """The shown answer's model was measured again: its figures follow."""
        self.answer_baseline = record
        if self.stats is not None:
            self._render_final()

    def _render_final(self) -> None:
        stats = self.stats or {}
        unknown = set(stats.get("unknown") or ())
        rate = None if unknown & {"drafted", "accepted"} else float(stats.get("acceptance_rate") or 0.0)
        tau = None if unknown & {"accepted", "steps"} else float(stats.get("tau") or 0.0)
        self._show(float(stats.get("decode_tok_s") or 0.0), rate, tau, missing="not reported")
        rates = list(stats.get("position_rates") or [])
        hist = list(stats.get("histogram") or [])
        self.position_bars.set_values(rates)
        self.histogram.set_values(hist)
        self.values.update(position_rates=rates, histogram=hist)
        self.draft_note.setText(draft_pass(stats))
        self.draft_note.setVisible(bool(self.draft_note.text()))
        note = (stats.get("remote") or {}).get("note") if unknown else None
        self.set_diagnosis(note or diagnose(stats, self.answer_baseline, self.answer_has_drafter, self.context))

    def _show(self, tok_s: float, acceptance: float | None, tau: float | None, missing: str = "—",
              keep: bool = False) -> None:
        """None: not known, shown as `missing` (not yet, or never reported by a server). keep: only the
        baseline changed, leave acceptance and tau as they are."""
        # without a drafter, or in an answer the engine decoded plainly (llama.cpp's calibrated choice, or
        # the plain fallback from the first token), both numbers measure plain decoding: a ratio would only
        # show noise and the window's own share of the CPU, not DFlash
        final = self.stats is not None
        stats = self.stats or {}
        # live: nothing is drafted until a step proposes drafts (a plainly decoded answer never does)
        plain = method_of(stats) == "plain" if final else not self._live_steps
        baseline = self.answer_baseline if final else self.baseline
        has_drafter = self.answer_has_drafter if final else self.has_drafter
        ratio = speedup({"decode_tok_s": tok_s}, baseline) if has_drafter and not plain else None
        self.dflash_label.setText(f"{tok_s:.1f}" if tok_s else "—")
        self.speedup_label.setText(f"{ratio:.2f}×" if ratio else "—")
        self.values.update(dflash_tok_s=tok_s or None, speedup=ratio)
        if plain and has_drafter:
            self.speedup_metric.set_tip("This answer drafted nothing: the engine decoded it plainly (the lines "
                                        f"above say why), so it has no DFlash speedup. {TIPS['speedup']}")
        elif final and has_drafter and not ratio and not self.remote:
            self.speedup_metric.set_tip("No baseline of the model that wrote this answer is measured on this "
                                        f"machine, so it has no speedup to show. {TIPS['speedup']}")
        if ratio:
            base = baseline
            self.speedup_metric.set_tip(f"{tok_s:.1f} tok/s with DFlash ÷ {base.tok_s:.1f} tok/s plain (baseline "
                                        f"measured {time.strftime('%H:%M', time.localtime(base.measured_at))}) "
                                        f"= {ratio:.2f}×. {TIPS['speedup']}")
        if keep:
            return
        self.dflash_metric.caption.setText(f"{self.method_label} tok/s" if has_drafter and not plain else
                                           "tok/s, plain decoding" if final or not has_drafter else "tok/s")
        if not has_drafter:                # plain decoding by design: say so instead of empty figures
            acceptance, tau, missing = None, None, "no drafter"
            for metric in (self.acceptance_metric, self.tau_metric, self.speedup_metric):
                metric.set_tip(f"{NO_DRAFTER} Load a pair with a DFlash drafter to see how many drafted tokens "
                               "the target accepts.")
        elif plain:                        # nothing drafted: no rate to show, and tau is trivially 1
            acceptance, tau, missing = None, None, "—"
            for metric in (self.acceptance_metric, self.tau_metric):
                metric.set_tip(f"This answer drafted nothing, so there is nothing to accept. "
                               f"{TIPS['acceptance' if metric is self.acceptance_metric else 'tau']}")
        self.acceptance_label.setText(missing if acceptance is None else f"{acceptance * 100:.0f}%")
        self.tau_label.setText(missing if tau is None else f"{tau:.2f}")
        self.values.update(acceptance_rate=acceptance, tau=tau)
        if acceptance is not None and stats.get("drafted"):
            self.acceptance_metric.set_tip(f"{stats.get('accepted')} of {stats.get('drafted')} drafted tokens "
                                           f"accepted by the target in this answer. {TIPS['acceptance']}")

    def _show_memory(self, figures: dict, when: str) -> None:
        """CUDA's peak and reserved bytes when the worker reports them, else the process peak (stats only)."""
        peak, reserved = figures.get("cuda_peak_bytes"), figures.get("cuda_reserved_bytes")
        if peak is not None:
            text = f"GPU memory {when}: {memory(peak)} at peak"
            if reserved is not None:
                text += f" · {memory(reserved)} reserved by torch"
        elif figures.get("peak_memory_bytes"):
            text = f"Engine memory {when}: {memory(int(figures['peak_memory_bytes']))} at peak"
        else:
            text = ""
        self.memory.setText(text)
        self.memory.setVisible(bool(text))
        self.values["memory"] = text or None

    def set_diagnosis(self, text: str | None) -> None:
        self.warning.setText(text or "")
        self.warning.setVisible(bool(text))
        self.values["warning"] = text
