"""The DFlash stats dock: live speed next to the measured baseline, acceptance, per-position bars,
the acceptance-length histogram and a tok/s sparkline, all drawn with QPainter (QtCharts is not part
of PySide6-Essentials). When DFlash is not paying off it says so in words."""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (QDockWidget, QFrame, QGridLayout, QHBoxLayout, QLabel, QPushButton, QScrollArea,
                               QVBoxLayout, QWidget)

from dflash_desktop.session import BaselineRecord, diagnose, speedup

from . import theme


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


def _big(accessible: str) -> QLabel:
    label = QLabel("—")
    label.setObjectName("bigNumber")
    label.setAccessibleName(accessible)
    return label


def _caption(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("muted")
    return label


def _section(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("section")
    return label


class StatsPanel(QDockWidget):
    remeasureRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("DFlash stats", parent)
        self.setObjectName("statsPanel")
        self.setAccessibleName("DFlash statistics")
        self.baseline: BaselineRecord | None = None
        self.has_drafter = True
        self.remote = False      # a pair on a server: acceptance is known only from what it reports at the end
        self.values: dict = {}   # what is shown, in numbers (tests and the screenshot script read it)
        self._live_steps: list[list[int]] = []
        self._live_rates: list[float] = []
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
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        self.dflash_label, self.baseline_label, self.speedup_label = (
            _big("DFlash tokens per second"), _big("Baseline tokens per second"), _big("Speedup over baseline"))
        for col, (label, caption) in enumerate(((self.dflash_label, "DFlash tok/s"),
                                                (self.baseline_label, "Baseline tok/s"),
                                                (self.speedup_label, "Speedup"))):
            grid.addWidget(label, 0, col)
            grid.addWidget(_caption(caption), 1, col)
        layout.addLayout(grid)

        self.baseline_note = QLabel("Baseline not measured yet.")
        self.baseline_note.setObjectName("muted")
        self.baseline_note.setWordWrap(True)
        self.baseline_note.setAccessibleName("How the baseline was measured")
        self.remeasure_button = QPushButton("Re-measure")
        self.remeasure_button.setAccessibleName("Measure the baseline again")
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
        self.warning.hide()
        layout.addWidget(self.warning)

        grid2 = QGridLayout()
        self.acceptance_label, self.tau_label = _big("Acceptance rate"), _big("Mean acceptance length tau")
        grid2.addWidget(self.acceptance_label, 0, 0)
        grid2.addWidget(self.tau_label, 0, 1)
        grid2.addWidget(_caption("draft tokens accepted"), 1, 0)
        grid2.addWidget(_caption("τ, tokens per pass"), 1, 1)
        layout.addLayout(grid2)

        layout.addSpacing(8)
        layout.addWidget(_section("Acceptance by draft position"))
        self.position_bars = BarChart("Acceptance rate by draft position", maximum=1.0)
        layout.addWidget(self.position_bars)
        layout.addSpacing(8)
        layout.addWidget(_section("Tokens committed per target pass"))
        self.histogram = BarChart("Acceptance length histogram")
        layout.addWidget(self.histogram)
        layout.addSpacing(8)
        layout.addWidget(_section("tok/s over this answer"))
        self.sparkline = Sparkline()
        layout.addWidget(self.sparkline)
        layout.addLayout(self._legend())
        layout.addStretch(1)

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(body)
        self.setWidget(scroll)
        self.setMinimumWidth(300)

    def _legend(self) -> QHBoxLayout:
        c = theme.current()
        row = QHBoxLayout()
        self.legend = QLabel(f'<span style="background:{c.drafted}">&nbsp;tinted&nbsp;</span> text was proposed '
                             "by the drafter and accepted by the target; untinted text is the target's own token "
                             "(toggle: Highlight drafted).")
        self.legend.setObjectName("muted")
        self.legend.setWordWrap(True)
        self.legend.setAccessibleName("Highlight legend")
        row.addWidget(self.legend)
        return row

    # -- updates ------------------------------------------------------------------------------------
    def set_runtime(self, loaded: dict) -> None:
        """The loaded event's engine, device and dtype, as the worker (or the remote server) reports them."""
        self.remote = loaded.get("engine") == "remote"
        text = (f"Runs on {loaded.get('device')} · remote server, its own speculative decoding" if self.remote else
                f"Runs on {loaded.get('device')} · {loaded.get('engine')} engine · {loaded.get('dtype')} weights")
        if loaded.get("speculation"):        # an engine that chose DFlash's settings or plain decoding itself
            text += f"\n{loaded['speculation']['reason']}"
        if loaded.get("engine_note"):        # the worker's own engine pick could not run the pair
            text += f"\n{loaded['engine_note']}"
        self.runtime.setText(text)
        self.values["runtime"] = text

    def set_baseline(self, record: BaselineRecord | None, measuring: bool = False) -> None:
        self.baseline = record
        if measuring:
            self.baseline_note.setText("Measuring the baseline: plain decoding of the same target, 64 tokens…")
        else:
            self.baseline_note.setText(record.describe() if record else "Baseline not measured yet.")
        self.remeasure_button.setEnabled(not measuring)
        self.baseline_label.setText(f"{record.tok_s:.1f}" if record else "—")
        self.values["baseline_tok_s"] = record.tok_s if record else None

    def start_answer(self) -> None:
        self._live_steps, self._live_rates, self._last_point = [], [], None
        self.sparkline.set_points([])

    def update_live(self, event: dict) -> None:
        """A (coalesced) tokens event: running tok/s, acceptance and the sparkline."""
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
        if self.remote:   # a server reports its counts when the answer ends, if at all
            self._show(rate, None, None)
        else:
            self._show(rate, accepted / proposed if proposed else 0.0, tau)

    def set_stats(self, stats: dict) -> None:
        """Final numbers of the done event; they replace the live estimates exactly. Counts a server did not
        report (`unknown`) are shown as not reported, never as zeros."""
        unknown = set(stats.get("unknown") or ())
        rate = None if unknown & {"drafted", "accepted"} else float(stats.get("acceptance_rate") or 0.0)
        tau = None if unknown & {"accepted", "steps"} else float(stats.get("tau") or 0.0)
        self._show(float(stats.get("decode_tok_s") or 0.0), rate, tau, missing="not reported")
        rates = list(stats.get("position_rates") or [])
        hist = list(stats.get("histogram") or [])
        self.position_bars.set_values(rates)
        self.histogram.set_values(hist)
        self.values.update(position_rates=rates, histogram=hist)
        note = (stats.get("remote") or {}).get("note") if unknown else None
        self.set_diagnosis(note or diagnose(stats, self.baseline, self.has_drafter))

    def _show(self, tok_s: float, acceptance: float | None, tau: float | None, missing: str = "—") -> None:
        """None: not known, shown as `missing` (not yet, or never reported by a server)."""
        # without a drafter both numbers measure the same plain decoding: a ratio would only show noise
        ratio = speedup({"decode_tok_s": tok_s}, self.baseline) if self.has_drafter else None
        self.dflash_label.setText(f"{tok_s:.1f}")
        self.speedup_label.setText(f"{ratio:.2f}×" if ratio else "—")
        self.acceptance_label.setText(missing if acceptance is None else f"{acceptance * 100:.0f}%")
        self.tau_label.setText(missing if tau is None else f"{tau:.2f}")
        self.values.update(dflash_tok_s=tok_s, speedup=ratio, acceptance_rate=acceptance, tau=tau)

    def set_diagnosis(self, text: str | None) -> None:
        self.warning.setText(text or "")
        self.warning.setVisible(bool(text))
        self.values["warning"] = text
