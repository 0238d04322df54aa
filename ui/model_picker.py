"""Choose, download and load a model and the way it speculates, with an honest answer to "will it run on this
computer?".

Catalog loading, the hardware probe and the disk scan for finished downloads run on a background
thread; downloads run on DownloadJob's own thread and reach the widgets only through queued signals.
"""
from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

from PySide6.QtCore import QModelIndex, QObject, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPalette
from PySide6.QtWidgets import (QApplication, QComboBox, QDialog, QFrame, QHBoxLayout, QLabel, QLineEdit, QListView,
                               QProgressBar, QPushButton, QScrollArea, QSplitter, QStyle, QStyledItemDelegate,
                               QStyleOptionViewItem, QVBoxLayout, QWidget)

from dflash_desktop import downloads, variant_folder
from dflash_desktop.catalog import Catalog, load_catalog
from dflash_desktop.hardware import HardwareReport, detect_live
from dflash_desktop.pairs import PairRequest, measured_key
from dflash_desktop.run_plan import runs_line

from .pair_list_model import (PairListModel, Roles, build_row, build_rows, local_dirs_for, pair_dirs,
                              speculation_label)
from .local_pair_dialog import LocalPairDialog
from .remote_dialog import AddServerDialog

BADGE_COLORS = {"fits": QColor(46, 160, 67), "slow": QColor(120, 140, 40), "tight": QColor(191, 135, 0),
                "target_only": QColor(56, 139, 253),
                "wont_fit": QColor(218, 54, 51), "unsupported": QColor(128, 128, 128), "unknown": QColor(128, 128, 128)}


def describe_progress(p: downloads.Progress) -> str:
    """'42% · 12.3 MB/s · 1 min 20 s left' for the list and the detail pane."""
    parts = [f"{p.fraction:.0%}"]
    if p.speed_bps > 0:
        parts.append(f"{p.speed_bps / 1e6:.1f} MB/s")
    if p.eta_s is not None:
        m, s = divmod(int(p.eta_s), 60)
        parts.append(f"{m} min {s} s left" if m else f"{s} s left")
    if p.state == "verifying":
        parts.append("verifying")
    return "Downloading " + " · ".join(parts)


class _Bridge(QObject):
    """Carries DownloadJob callbacks (download thread) to the GUI thread as queued signals."""

    progress = Signal(object)
    finished = Signal(object)


class _Loader(QObject):
    ready = Signal(object, object, object)  # catalog, hardware report, {pair id: {role: folder}}
    failed = Signal(str)


class _TokenCheck(QObject):
    answered = Signal(str)  # "" when the token was stored, else the problem


class _HubCheck(QObject):
    answered = Signal(str, bool)  # endpoint, reachable


def hub_reachable(endpoint: str, timeout: float = 5.0) -> bool:
    """Any HTTP answer from the hub counts (even an error status); no answer at all does not."""
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


class _PairDelegate(QStyledItemDelegate):
    """Two lines per pair (name; size, licence, mode) with a fit badge and the download state."""

    def sizeHint(self, option, index) -> QSize:
        return QSize(360, option.fontMetrics.height() * 3 + 14)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        pal = opt.palette
        fg = pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        dim = QColor(fg)
        dim.setAlphaF(0.65)
        r = opt.rect.adjusted(10, 6, -10, -6)
        fm = opt.fontMetrics
        line = fm.height()

        verdict, label = index.data(Roles.Verdict), index.data(Roles.VerdictLabel)
        badge_w = fm.horizontalAdvance(label) + 16
        badge = QRect(r.right() - badge_w, r.top(), badge_w, line + 2)
        color = BADGE_COLORS.get(verdict, BADGE_COLORS["unknown"])
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(color)
        painter.drawRoundedRect(badge, badge.height() / 2, badge.height() / 2)
        painter.setPen(QColor("white"))
        painter.drawText(badge, Qt.AlignmentFlag.AlignCenter, label)

        bold = QFont(opt.font)
        bold.setBold(True)
        painter.setFont(bold)
        painter.setPen(fg)
        name_rect = QRect(r.left(), r.top(), r.width() - badge_w - 8, line + 2)
        painter.drawText(name_rect, Qt.AlignmentFlag.AlignVCenter, fm.elidedText(index.data(Roles.Name),
                                                                               Qt.TextElideMode.ElideRight, name_rect.width()))
        painter.setFont(opt.font)
        painter.setPen(dim)
        sub = QRect(r.left(), r.top() + line + 4, r.width(), line)
        painter.drawText(sub, Qt.AlignmentFlag.AlignVCenter, fm.elidedText(index.data(Roles.Subtitle),
                                                                         Qt.TextElideMode.ElideRight, sub.width()))
        state = index.data(Roles.DownloadState)
        third = QRect(r.left(), r.top() + 2 * line + 6, r.width(), line)
        if state == "downloading":
            bar = QRect(third.left(), third.center().y() - 2, third.width() // 2, 4)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(dim.red(), dim.green(), dim.blue(), 60))
            painter.drawRoundedRect(bar, 2, 2)
            painter.setBrush(pal.color(QPalette.ColorRole.Highlight) if not selected else fg)
            painter.drawRoundedRect(QRect(bar.left(), bar.top(), int(bar.width() * index.data(Roles.DownloadFraction)),
                                          bar.height()), 2, 2)
            third.setLeft(bar.right() + 8)
        painter.setPen(BADGE_COLORS["wont_fit"] if state == "error" and not selected else dim)
        painter.drawText(third, Qt.AlignmentFlag.AlignVCenter, fm.elidedText(index.data(Roles.DownloadText),
                                                                           Qt.TextElideMode.ElideRight, third.width()))
        painter.restore()


class ModelPicker(QDialog):
    """Lists the catalog pairs with fit and download state; emits `pairChosen` for the pair to load."""

    pairChosen = Signal(object)  # a PairRequest: a catalog pair (no draft_dir when only the target fits), one
    #                              from disk (Open from disk…) or a server (Add a server…)
    ready = Signal()           # catalog, hardware and disk scan are in

    def __init__(self, parent: QWidget | None = None, catalog: Catalog | None = None,
                 hardware: HardwareReport | None = None, servers: list[dict] | None = None,
                 measured: dict | None = None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(980, 620)
        self.catalog, self.hardware = catalog, hardware
        self.servers = servers or []     # remote servers used before, the latest first
        self.measured = measured or {}   # pairs.measured_key -> {method, summary}: what loading it last measured fastest
        self.server_dialog: AddServerDialog | None = None
        self.model = PairListModel(self)
        self.online: bool | None = None   # the hub answered (None: not asked yet, or offline mode)
        self._jobs: dict[str, downloads.DownloadJob] = {}
        self._build()
        self._load_in_background()

    # -- layout -----------------------------------------------------------------------------------
    def _build(self) -> None:
        self.hardware_label = QLabel("Checking this computer…")
        self.hardware_label.setWordWrap(True)
        self.offline_label = QLabel()
        self.offline_label.setTextFormat(Qt.TextFormat.RichText)
        top = QVBoxLayout()
        top.addWidget(self.hardware_label)
        top.addWidget(self.offline_label)

        self.list = QListView()
        self.list.setModel(self.model)
        self.list.setItemDelegate(_PairDelegate(self.list))
        self.list.setUniformItemSizes(True)
        self.list.setMinimumWidth(380)
        self.list.setAccessibleName("Model pairs")
        self.list.selectionModel().currentChanged.connect(lambda *_: self._refresh_detail())
        self.list.doubleClicked.connect(lambda *_: self.load_selected())
        self.model.dataChanged.connect(lambda *_: self._refresh_detail())

        self.title = QLabel()
        big = self.title.font()
        big.setPointSizeF(big.pointSizeF() * 1.4)
        big.setBold(True)
        self.title.setFont(big)
        self.badge = QLabel()
        self.facts = QLabel()
        self.method_box = QComboBox()
        self.method_box.setAccessibleName("Speculation method")
        self.method_box.setToolTip("How this model speculates: a drafter of its own (downloaded beside it), its "
                                   "own MTP heads or n-gram lookup (nothing more to download). Loading measures "
                                   "every method whose files are here and keeps the fastest.")
        self.method_box.activated.connect(self._choose_method)
        self.method_row = QWidget()
        method_line = QHBoxLayout(self.method_row)
        method_line.setContentsMargins(0, 0, 0, 0)
        method_line.addWidget(QLabel("Speculation:"))
        method_line.addWidget(self.method_box, 1)
        self.fit_sentence = QLabel()
        self.fit_numbers = QLabel()
        self.fit_numbers.setStyleSheet("color: palette(placeholder-text);")
        self.notes = QLabel()
        self.measured_label = QLabel()
        self.measured_label.setAccessibleName("Measured on this computer")
        self.reason = QLabel()
        self.reason.setObjectName("pickerReason")
        self.reason.setStyleSheet("QLabel#pickerReason { color: rgb(218,54,51); font-weight: bold; }")
        for w in (self.facts, self.fit_sentence, self.fit_numbers, self.notes, self.measured_label, self.reason):
            w.setWordWrap(True)
            w.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress_text = QLabel()
        self.token_box = self._token_box()

        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download_selected)
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.cancel_selected)
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(self.load_selected)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        self.server_button = QPushButton("Add a server…")
        self.server_button.setToolTip("Chat with a model on a vLLM or SGLang server started with DFlash, for models "
                                      "this computer cannot hold")
        self.server_button.clicked.connect(self.add_server)
        self.local_button = QPushButton("Open from disk…")
        self.local_button.setToolTip("Load a model you already have: a GGUF file or a model folder, with its drafter "
                                     "(DFlash, DFlash2, DSpark, EAGLE-3 or a Gemma 4 assistant) if it has one")
        self.local_button.clicked.connect(self.open_local)
        buttons = QHBoxLayout()
        buttons.addWidget(self.local_button)
        buttons.addWidget(self.server_button)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        buttons.addWidget(close)
        buttons.addWidget(self.load_button)

        detail = QWidget()
        d = QVBoxLayout(detail)
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.badge)
        d.addLayout(head)
        about = QWidget()                    # what is known of the pair: it scrolls where the window is short
        a = QVBoxLayout(about)
        a.setContentsMargins(0, 0, 0, 0)
        for w in (self.facts, self.method_row, self.measured_label, self.fit_sentence, self.fit_numbers, self.notes):
            a.addWidget(w)
        a.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidget(about)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        d.addWidget(scroll, 1)
        d.addWidget(self.token_box)
        d.addWidget(self.progress_text)
        d.addWidget(self.progress)
        d.addWidget(self.reason)
        d.addLayout(buttons)

        self.search = QLineEdit()
        self.search.setPlaceholderText("Search models (name, size, licence, chat mode)")
        self.search.setAccessibleName("Search models")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._filter)
        self.model.modelReset.connect(lambda: self._filter(self.search.text()))
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.search)
        column.addWidget(self.list, 1)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(detail)
        split.setStretchFactor(1, 1)
        split.setSizes([420, 560])
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(split, 1)
        self._refresh_offline()
        self._refresh_detail()

    def _token_box(self) -> QFrame:
        box = QFrame()
        box.setFrameShape(QFrame.Shape.StyledPanel)
        self.token_help = QLabel()
        self.token_help.setWordWrap(True)
        self.token_help.setOpenExternalLinks(True)
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_… (read access is enough)")
        self.token_save = QPushButton("Save token")
        self.token_save.clicked.connect(self.save_token)
        self.token_status = QLabel()
        self.token_status.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.token_edit, 1)
        row.addWidget(self.token_save)
        lay = QVBoxLayout(box)
        lay.addWidget(self.token_help)
        lay.addLayout(row)
        lay.addWidget(self.token_status)
        return box

    # -- loading ----------------------------------------------------------------------------------
    def _load_in_background(self) -> None:
        # no parent: the thread may finish after the picker is closed and deleted, and its signals then
        # reach no one instead of a deleted object
        self._loader = _Loader()
        self._loader.ready.connect(self._on_loaded)
        self._loader.failed.connect(self.hardware_label.setText)
        catalog, hardware, loader = self.catalog, self.hardware, self._loader

        def work():
            try:
                cat = catalog or load_catalog()
                report = hardware or detect_live()
                loader.ready.emit(cat, report, local_dirs_for(cat, downloads.find_cached, report))
            except Exception as exc:  # noqa: BLE001 (a broken catalog or probe must not leave the dialog spinning)
                loader.failed.emit(f"Could not read the model catalog or this computer's hardware: {exc}")

        threading.Thread(target=work, name="model-picker-load", daemon=True).start()

    def _on_loaded(self, catalog: Catalog, report: HardwareReport, local: dict) -> None:
        self.catalog, self.hardware = catalog, report
        self.model.set_rows(build_rows(catalog, report, local))
        self.hardware_label.setText(report.reason[:1].upper() + report.reason[1:])
        self.list.setCurrentIndex(self.model.index(0))
        self.ready.emit()

    def _refresh_offline(self) -> None:
        """Offline mode is a setting; being online is a fact, so it is checked (on a thread)."""
        if downloads.offline_mode():
            self._show_online(None, False)
            return
        endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")  # as DownloadJob
        self.offline_label.setText('<span style="color:gray">●</span> Checking the connection…')
        check = _HubCheck(self)
        check.answered.connect(self._show_online)
        threading.Thread(target=lambda: check.answered.emit(endpoint, hub_reachable(endpoint)),
                         name="hub-check", daemon=True).start()

    def _show_online(self, endpoint: str | None, reachable: bool) -> None:
        self.online = None if endpoint is None else reachable     # offline mode asks no hub
        if endpoint is None:
            text = '<span style="color:#bf8700">●</span> Offline mode: no downloads; downloaded models still load'
        elif reachable:
            text = f'<span style="color:#2ea043">●</span> Online ({endpoint.split("//")[-1]})'
        else:
            text = (f'<span style="color:#d1242f">●</span> Can\'t reach {endpoint.split("//")[-1]}: '
                    "downloaded models still load")
        self.offline_label.setText(text)
        self._refresh_detail()          # Download follows what the hub answered

    def _filter(self, text: str) -> None:
        """Rows whose name, id or subtitle hold every word typed; the selection moves to one still shown."""
        words = text.lower().split()
        for i in range(self.model.rowCount()):
            idx = self.model.index(i)
            hay = " ".join(str(idx.data(role) or "") for role in (Roles.Name, Roles.Id, Roles.Subtitle)).lower()
            self.list.setRowHidden(i, not all(w in hay for w in words))
        current = self.list.currentIndex()
        if not current.isValid() or self.list.isRowHidden(current.row()):
            shown = next((i for i in range(self.model.rowCount()) if not self.list.isRowHidden(i)), None)
            if shown is not None:
                self.list.setCurrentIndex(self.model.index(shown))
            self._refresh_detail()

    # -- detail pane ------------------------------------------------------------------------------
    def _refresh_detail(self) -> None:
        idx = self.list.currentIndex()
        has = idx.isValid()
        for w in (self.download_button, self.load_button, self.cancel_button):
            w.setEnabled(False)
        self.token_box.setVisible(False)
        self.progress.setVisible(False)
        self.progress_text.setVisible(False)
        self.method_row.setVisible(False)
        if not has:
            self.title.setText("Models")
            self.badge.clear()
            self.badge.setStyleSheet("")
            for w in (self.facts, self.fit_sentence, self.fit_numbers, self.notes, self.measured_label, self.reason):
                w.clear()
            return
        row = self.model.pair_row(idx.row())
        verdict, state = idx.data(Roles.Verdict), idx.data(Roles.DownloadState)
        self.title.setText(idx.data(Roles.Name))
        color = BADGE_COLORS.get(verdict, BADGE_COLORS["unknown"]).name()
        self.badge.setStyleSheet(f"background: {color}; color: white; border-radius: 10px; padding: 3px 12px;")
        self.badge.setText(idx.data(Roles.VerdictLabel))
        gated = " · gated: needs a Hugging Face token and accepted licence" if idx.data(Roles.Gated) else ""
        measured = self.measured.get(measured_key(idx.data(Roles.Id), idx.data(Roles.DraftDir)))
        runs = runs_line(idx.data(Roles.PlanLabel), (idx.data(Roles.Plan) or {}).get("engine"),
                         (measured or {}).get("engine"))
        drafter = (f"Drafter block size {row.pair.block_size} · chat mode: {idx.data(Roles.ChatMode)}\n"
                   if row.pair.drafter else "")
        self.facts.setText(f"{idx.data(Roles.SizeText)} · licence {idx.data(Roles.License)}{gated}\n"
                           f"{drafter}{runs}{idx.data(Roles.DownloadText)}")
        self._show_methods(row)
        self.fit_sentence.setText(idx.data(Roles.FitSentence))
        self.fit_numbers.setText(idx.data(Roles.FitDetails))
        self.notes.setText(idx.data(Roles.Notes))
        self.measured_label.setText(f"Measured fastest here when last loaded: {measured['summary']}" if measured
                                    else "")
        self.measured_label.setVisible(bool(measured))
        self.reason.setText(idx.data(Roles.Reason) if state in ("ready", "error") or verdict in
                            ("wont_fit", "unsupported") else "")
        downloading = state == "downloading"
        self.progress.setVisible(downloading)
        self.progress_text.setVisible(downloading)
        if downloading:
            self.progress.setValue(int(1000 * idx.data(Roles.DownloadFraction)))
            self.progress_text.setText(idx.data(Roles.DownloadText) +
                                       "\nClosing this window pauses the download; it resumes where it stopped.")
        can_download = (row.pair.needs_download and state in ("not_downloaded", "error")
                        and verdict not in ("wont_fit", "unsupported", "unknown"))
        self.download_button.setVisible(row.pair.needs_download and not downloading)
        unreachable = self.online is False and not downloads.offline_mode()
        self.download_button.setEnabled(can_download and not downloads.offline_mode() and not unreachable)
        self.download_button.setToolTip("Offline mode: downloads are off." if downloads.offline_mode() else
                                        "The hub cannot be reached: check the connection, then open Models… "
                                        "again." if unreachable else "")
        self.cancel_button.setVisible(downloading)
        self.cancel_button.setEnabled(downloading)
        self.load_button.setEnabled(bool(idx.data(Roles.CanLoad)))
        if idx.data(Roles.Gated) and state != "ready":
            repo = next(m.repo_id for m in row.pair.models if m.gated)
            self.token_help.setText(f'This model is gated. Accept its licence on <a href="https://huggingface.co/{repo}">'
                                    f"huggingface.co/{repo}</a>, then paste an access token.")
            if downloads.current_token() and not self.token_status.text():
                self.token_status.setText("A Hugging Face token is already set on this computer.")
            self.token_box.setVisible(True)

    def _show_methods(self, row) -> None:
        """The speculation box: every way this pair speculates here, the chosen one selected; hidden when there
        is no choice, and fixed while a download of the chosen one runs."""
        options = row.pair.speculations
        self.method_row.setVisible(len(options) > 1)
        self.method_box.clear()
        for s in options:
            text, engines = speculation_label(s, self.catalog)
            self.method_box.addItem(text, s.key)
            self.method_box.setItemData(self.method_box.count() - 1, engines, Qt.ToolTipRole)
        self.method_box.setCurrentIndex(next(i for i, s in enumerate(options) if s.key == row.pair.speculation))
        self.method_box.setEnabled(row.download_state != "downloading")

    def _choose_method(self, index: int) -> None:
        """Another speculation for the selected pair: its row is rebuilt (size, fit, plan, what is on disk)."""
        idx = self.list.currentIndex()
        key = self.method_box.itemData(index)
        if not idx.isValid() or key is None:
            return
        row = self.model.pair_row(idx.row())
        if key == row.pair.speculation:
            return
        pair = row.pair.choosing(key)
        self.model.replace_row(build_row(pair, self.catalog, self.hardware,
                                         pair_dirs(pair, downloads.find_cached, self.hardware,
                                                   self.catalog.dtype_bytes)))

    # -- actions ----------------------------------------------------------------------------------
    def load_selected(self) -> None:
        idx = self.list.currentIndex()
        if not idx.isValid() or not idx.data(Roles.CanLoad):
            return
        row = self.model.pair_row(idx.row())
        self.pairChosen.emit(PairRequest(idx.data(Roles.Id), idx.data(Roles.Name), idx.data(Roles.TargetDir),
                                         idx.data(Roles.DraftDir), plan=idx.data(Roles.Plan),
                                         planned=idx.data(Roles.Plan), thinking=row.pair.thinking))
        self.accept()

    def open_local(self) -> LocalPairDialog:
        """Ask for a target and drafter on disk; Load loads them as the pair."""
        self.local_dialog = LocalPairDialog(self)
        self.local_dialog.accepted.connect(lambda: (self.pairChosen.emit(self.local_dialog.pair()), self.accept()))
        self.local_dialog.open()
        return self.local_dialog

    def add_server(self) -> AddServerDialog:
        """Ask for a server's address and key; Connect loads it as the pair."""
        self.server_dialog = AddServerDialog(self.servers, self)
        self.server_dialog.accepted.connect(lambda: (self.pairChosen.emit(self.server_dialog.pair()), self.accept()))
        self.server_dialog.open()
        return self.server_dialog

    def download_selected(self) -> None:
        idx = self.list.currentIndex()
        if not idx.isValid() or not self.download_button.isEnabled():
            return
        row = self.model.pair_row(idx.row())
        pair, plan = row.pair, row.fit.plan if row.fit else None
        bridge = _Bridge(self)
        bridge.progress.connect(lambda p, pid=pair.id: self._on_progress(pid, p))
        bridge.finished.connect(lambda job, pid=pair.id: self._on_finished(pid, job))
        job = downloads.DownloadJob.for_pair(pair, engine=plan.engine if plan else None,
                                             on_progress=bridge.progress.emit, on_finished=bridge.finished.emit)
        self._jobs[pair.id] = job
        self.model.set_download(pair.id, "downloading", 0.0, "Starting download…")
        job.start()

    def cancel_selected(self) -> None:
        idx = self.list.currentIndex()
        job = self._jobs.get(idx.data(Roles.Id)) if idx.isValid() else None
        if job:
            job.cancel()

    def _on_progress(self, pair_id: str, p: downloads.Progress) -> None:
        if pair_id in self._jobs and not self._jobs[pair_id].finished:
            self.model.set_download(pair_id, "downloading", p.fraction, describe_progress(p))

    def _on_finished(self, pair_id: str, job: downloads.DownloadJob) -> None:
        self._jobs.pop(pair_id, None)
        row = self.model.pair_row(self.model.row_of(pair_id))
        if job.state == "done":
            plan = row.fit.plan if row.fit else None
            target = (variant_folder.assemble(row.pair, plan.files_variant, job.cache_dir)
                      if plan and plan.files_variant else job.result[row.pair.target.repo_id])
            dirs = {"target": target, **({"drafter": job.result[row.pair.drafter.repo_id]} if row.pair.drafter
                                         else {})}
            self.model.set_download(pair_id, "ready", 1.0, dirs=dirs)
        elif job.state == "cancelled":
            self.model.set_download(pair_id, "not_downloaded", 0.0)
        else:
            self.model.set_download(pair_id, "error", 0.0, error=job.error.message if job.error else "unknown error")

    def save_token(self) -> None:
        """Store the token where huggingface_hub keeps it (checked online, on a thread; never logged)."""
        token = self.token_edit.text().strip()
        if not token:
            return
        self.token_save.setEnabled(False)
        self.token_status.setText("Checking the token…")
        check = _TokenCheck(self)
        check.answered.connect(self._token_saved)

        def work():
            try:
                downloads.save_token(token)
                check.answered.emit("")
            except Exception as exc:  # noqa: BLE001 (the hub's errors come in many kinds; each is shown)
                check.answered.emit(f"The token was not accepted: {str(exc).replace(token, '…')}")

        threading.Thread(target=work, name="hf-token", daemon=True).start()

    def _token_saved(self, problem: str) -> None:
        self.token_save.setEnabled(True)
        self.token_edit.clear()
        self.token_status.setText(problem or "Token saved. Downloads of gated models will use it.")

    def done(self, result: int) -> None:
        for job in self._jobs.values():  # partial files are kept: the next Download resumes
            job.cancel()
        super().done(result)
