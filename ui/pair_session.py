"""The loaded pair's life in the window: load (local or a server), unload, the baseline calibration and the
baseline record. Each worker call carries its own callback (QtWorker delivers it on the GUI thread), so no
event is matched by id here. The chat controller writes answers; it waits for `readyChanged`."""
from __future__ import annotations

import functools
import time
from dataclasses import replace

import psutil
from PySide6.QtCore import QObject, Signal

from dflash_desktop import session
from dflash_desktop import settings as settings_mod
from dflash_desktop.cpu_load import CpuMeter
from dflash_desktop.pairs import LoadedPair, PairRequest
from dflash_desktop.qt_worker import QtWorker
from dflash_desktop.session import BaselineRecord
from engine.backends import ENGINES

from .stats_panel import StatsPanel


class PairSession(QObject):
    statusMessage = Signal(str)           # one line for the status bar
    loadingChanged = Signal(bool, str)    # busy loading or measuring?, what is happening
    pairLoaded = Signal(object)           # the LoadedPair
    loadFailed = Signal(dict, object)     # the error event, and a way out (button text, slot) or None
    pairUnloaded = Signal()               # the user unloaded the model: memory freed
    baselineChanged = Signal(object)      # the loaded pair's BaselineRecord (or None): one source of truth
    readyChanged = Signal()               # a load or a calibration ended: answers waiting for it may start

    def __init__(self, worker: QtWorker, settings: settings_mod.Settings, panel: StatsPanel,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.worker, self.settings, self.panel = worker, settings, panel
        self.pair: PairRequest | None = None  # what was asked for (remembered once it loads)
        self.loaded: LoadedPair | None = None # what the worker (or the server) says loaded
        self.unloaded = False                 # the user unloaded it: the next message loads it again
        self.ready_text = ""                  # the last "ready" line (the status bar may have moved on)
        self._loading = False
        self._measuring = False
        self._unloading = False
        self._load_started = 0.0              # when the user asked for the load: the wait they really had
        self._rss_before_unload: int | None = None
        self._epoch = 0                       # one per load: a superseded load's or calibration's events are stale
        panel.remeasureRequested.connect(self.calibrate)

    @property
    def ready(self) -> bool:
        """A pair is loaded and no load or calibration is in flight; other callers' generations (the speedup
        demo, the local server) do not matter: the job queue runs ours after them."""
        return self.loaded is not None and not self._loading and not self._measuring

    @property
    def loading(self) -> bool:
        return self._loading

    @property
    def display_name(self) -> str:
        """The pair's own name (the catalog's, the file's), else the name the engine gave it."""
        return (self.pair.name if self.pair else "") or (self.loaded.name if self.loaded else "")

    # -- loading ------------------------------------------------------------------------------------
    def load_pair(self, pair: PairRequest | dict) -> None:
        """Load a pair in place of the loaded one; remembered as the last pair once it loads."""
        self.unloaded, self._measuring, self._loading = False, False, True
        self._epoch += 1
        self._load_started = time.monotonic()
        on_event = functools.partial(self._on_load_event, self._epoch)
        self.pair, self.loaded = PairRequest.of(pair), None
        self.panel.set_baseline(self.baseline())
        self.baselineChanged.emit(self.baseline())
        pair = self.pair
        if pair.remote:
            self.worker.load_remote(**pair.remote, on_event=on_event)
            self.loadingChanged.emit(True, f"Connecting to {pair.remote['base_url']}…")
            return
        plan = pair.run_plan
        self.worker.load_pair(pair.target_dir, pair.draft_dir, **plan, on_event=on_event)
        where = "" if plan["device"] == "auto" else f" on {plan['device']}"
        self.loadingChanged.emit(True, f"Loading {pair.name or 'the model'}{where}…")

    def reload(self) -> None:
        """The same pair again (after the user unloaded it, or after a crash)."""
        if self.pair is not None and not self._loading:
            self.load_pair(self.pair)

    def load_on_cpu(self) -> None:
        """After the chosen device failed: the same pair with the engine's CPU defaults."""
        if self.pair is not None:
            self._load_again(self.pair.run_plan["engine"], "cpu")

    def load_with_engine(self, engine: str) -> None:
        """After the engine crashed on this computer: the same pair with another engine that runs it."""
        self._load_again(engine, "auto")

    def _load_again(self, engine: str, device: str) -> None:
        if self.pair is not None:
            self.load_pair(replace(self.pair, plan={"engine": engine, "device": device, "dtype": None}))

    def crash_way_out(self, ev: dict):
        """The other engine a crashed one leaves (the worker names those that run the pair here), as a button."""
        others = ev.get("alternatives") or []
        if ev.get("code") != "engine_crashed" or not others:
            return None
        name = others[0]
        return f"Load with {ENGINES[name].label if name in ENGINES else name}", lambda: self.load_with_engine(name)

    def _on_load_event(self, epoch: int, ev: dict) -> None:
        if epoch != self._epoch:          # a load asked for since replaces this one
            return
        kind = ev.get("event")
        if kind == "progress":
            waited = time.monotonic() - self._load_started
            self.loadingChanged.emit(True, f"{ev.get('message', 'Loading…')}  ({waited:.0f} s so far)")
        elif kind == "loaded":
            self._loaded(ev)
        elif kind == "error":
            self._loading = False
            self.loadingChanged.emit(False, "")
            self.statusMessage.emit(f"Could not load the model: {ev.get('message', '')}")
            device = self.pair.run_plan["device"] if self.pair else "cpu"
            way_out = (("Load on the CPU", self.load_on_cpu)
                       if ev.get("code") in ("device_unavailable", "out_of_memory") and device != "cpu"
                       else self.crash_way_out(ev))
            self.loadFailed.emit(ev, way_out)

    def _loaded(self, ev: dict) -> None:
        loaded = LoadedPair.of(ev)
        self._loading, self.loaded = False, loaded
        if self.pair.remote:   # named after the model the server serves
            self.pair = self.pair.named(loaded.name)
            settings_mod.remember_server(self.settings, loaded.base_url, self.pair.remote.get("api_key") or "")
        self.settings.last_pair = self.pair.to_dict()
        self.save_settings()
        self.panel.has_drafter = loaded.has_drafter
        self.loadingChanged.emit(False, "")
        if not loaded.offers.local:
            self.statusMessage.emit(f"{loaded.name} ready on {loaded.device}: chats run there; this computer's "
                                    "engine is not started.")
        else:
            self.ready_text = (f"{self.display_name} ready: {loaded.engine} engine on {loaded.device}, "
                               f"{loaded.dtype} (block size {loaded.block_size}, "
                               f"ready {time.monotonic() - self._load_started:.1f} s after you asked; "
                               f"reading the model took {loaded.load_s:.1f} s of that)")
            self.statusMessage.emit(self.ready_text)
        self.panel.set_runtime(loaded)
        self.pairLoaded.emit(loaded)
        if self.baseline() is None and loaded.offers.baseline:
            self.calibrate()
        self.readyChanged.emit()

    # -- unloading ----------------------------------------------------------------------------------
    def unload(self) -> None:
        """Free the model's memory (the worker keeps running); the next message loads the same pair again.
        The chat controller stops an answer being written first (MainWindow.unload)."""
        if self.loaded is None or not self.loaded.offers.unload or self._unloading:
            return
        self._unloading = True
        self._rss_before_unload = self._worker_rss()
        self.worker.unload(on_event=self._on_unload_event)
        self.loadingChanged.emit(True, "Unloading the model…")

    def _on_unload_event(self, ev: dict) -> None:
        self._unloading = False
        self.loadingChanged.emit(False, "")
        if ev.get("event") != "ok":
            self.statusMessage.emit(f"The model could not be unloaded: {ev.get('message', '')}")
            return
        self.loaded, self.unloaded = None, True
        before, after = self._rss_before_unload, self._worker_rss()
        memory = (f" The engine process went from {before / 2**20:,.0f} MB to {after / 2**20:,.0f} MB."
                  if before and after else "")
        self.statusMessage.emit(f"Model unloaded: its memory is freed.{memory} Your next message loads it again.")
        self.pairUnloaded.emit()

    def worker_pid(self) -> int | None:
        client = getattr(self.worker, "client", None)
        try:
            return client.pid if client is not None else None
        except Exception:   # noqa: BLE001 - a worker being restarted has no pid yet
            return None

    def _worker_rss(self) -> int | None:
        try:
            return psutil.Process(self.worker_pid()).memory_info().rss if self.worker_pid() else None
        except (psutil.Error, ValueError):
            return None

    # -- baseline -----------------------------------------------------------------------------------
    def baseline(self) -> BaselineRecord | None:
        return BaselineRecord.from_dict(self.settings.baselines.get(self.pair.key)) if self.pair else None

    def record_baseline(self, record: BaselineRecord, pair: PairRequest | None = None) -> None:
        """Make ``record`` the baseline of ``pair`` (default: the loaded one) on this machine: saved, shown, and
        every figure derived from it recomputed. The calibration and the speedup demo both come here."""
        pair = pair or self.pair
        if pair is None:
            return
        key = pair.key
        self.settings.baselines[key] = record.to_dict()
        self.save_settings()
        if self.pair is not None and key == self.pair.key:
            self.panel.set_baseline(record)
            self.baselineChanged.emit(record)

    def calibrate(self) -> None:
        """Measure plain decoding of the same target on this machine (64 tokens, greedy). It waits in the job
        queue behind an answer being written, so it never shares the CPU with one."""
        if self.loaded is None or self._measuring or self._loading:
            return
        if not self.loaded.offers.baseline:
            self.statusMessage.emit("A server runs its own speculative decoding on every request, so plain "
                                    "decoding cannot be measured there.")
            return
        self._measuring = True
        self.panel.set_baseline(self.baseline(), measuring=True)
        self.loadingChanged.emit(True, "Measuring the baseline (plain decoding, 64 tokens)…")
        meter = CpuMeter([self.worker_pid()]).start()
        on_event = functools.partial(self._on_calibration_event, self._epoch, self.pair, self.loaded.device, meter)
        self.worker.generate(prompt=session.CALIBRATION_PROMPT, mode="baseline", settings={
            "max_new_tokens": session.CALIBRATION_TOKENS, "temperature": 0.0}, on_event=on_event)

    def _on_calibration_event(self, epoch: int, pair: PairRequest, device: str, meter: CpuMeter, ev: dict) -> None:
        if ev.get("event") not in ("done", "error"):
            return
        cpu_other = meter.stop()
        record = BaselineRecord.from_done(ev, device, "calibration", cpu_other) if ev["event"] == "done" else None
        if record is not None:    # it measured that pair, even if another one was asked for since
            self.record_baseline(record, pair)
        if epoch != self._epoch:
            return
        self._measuring = False
        self.loadingChanged.emit(False, "")
        if record is not None:
            self.statusMessage.emit(record.describe())
        else:
            self.panel.set_baseline(self.baseline())
            self.statusMessage.emit(f"Baseline measurement failed: {ev.get('message', '')}")
        self.readyChanged.emit()

    def save_settings(self) -> None:
        try:
            settings_mod.save(self.settings)
        except OSError as exc:
            self.statusMessage.emit(f"Settings could not be saved: {exc}")
