"""The loaded pair's life in the window: load (local or a server), unload, the baseline calibration and the
baseline record. Each worker call carries its own callback (QtWorker delivers it on the GUI thread), so no
event is matched by id here. The chat controller writes answers; it waits for `readyChanged`."""
from __future__ import annotations

import functools
from typing import Callable
import time

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
    loadFailed = Signal(dict, object, str, object)   # the error, a way out (button text, slot) or None, the
    #                                                  name of the pair that failed, that of the one still loaded
    pairUnloaded = Signal()               # the user unloaded the model: memory freed
    baselineChanged = Signal(object)      # the loaded pair's BaselineRecord (or None): one source of truth
    readyChanged = Signal()               # a load or a calibration ended: answers waiting for it may start

    def __init__(self, worker: QtWorker, settings: settings_mod.Settings, panel: StatsPanel,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.worker, self.settings, self.panel = worker, settings, panel
        # the engines a catalog pair lists (the window's catalog; None: a pair from disk, any engine that reads it)
        self.engines_of: Callable[[PairRequest], list[str] | None] = lambda pair: None
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
        self._previous: tuple[PairRequest, LoadedPair] | None = None   # the pair loaded before this load
        panel.remeasureRequested.connect(self.calibrate)

    @property
    def ready(self) -> bool:
        """A pair is loaded and no load or calibration is in flight; other callers' generations (the speedup
        demo, the local server) do not matter: the job queue runs ours after them."""
        return self.loaded is not None and not self._loading and not self._measuring

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
        if self.loaded is not None:           # what stays if this load fails and the worker kept it
            self._previous = (self.pair, self.loaded)
        self.pair, self.loaded = PairRequest.of(pair), None
        self._show_baseline(None)             # baselines are per engine: known once the pair loads
        pair = self.pair
        if pair.remote:
            self.worker.load_remote(**pair.remote, on_event=on_event)
            self.loadingChanged.emit(True, f"Connecting to {pair.remote['base_url']}…")
            return
        plan = pair.run_plan
        self.worker.load_pair(pair.target_dir, pair.draft_dir, **plan, on_event=on_event,
                              compare=self.planned_by_app(pair) and (self.engines_of(pair) or True))
        where = "" if plan["device"] == "auto" else f" on {plan['device']}"
        self.loadingChanged.emit(True, f"Loading {pair.name or 'the model'}{where}…")

    def planned_by_app(self, pair: PairRequest) -> bool:
        """The engine is the app's plan (the model picker's, or the worker's own pick), not one the user chose in
        the settings or by a way-out button: the worker may run it with another engine measured faster here."""
        return self.settings.engine == "auto" and (pair.plan is None or pair.plan == pair.planned
                                                   or pair.plan.get("engine") == "auto")

    def reload(self) -> None:
        """The same pair again (after the user unloaded it, or after a crash)."""
        if self.pair is not None and not self._loading:
            self.load_pair(self.pair)

    def other_engine_way_out(self, ev: dict, pair: PairRequest | None = None):
        """The other engine a crashed one leaves, or the one that runs a pair this engine refused (the worker
        names those that run it here), as a button."""
        others = ev.get("alternatives") or []
        pair = pair or self.pair                # the same pair with another engine that runs it
        if ev.get("code") not in ("engine_crashed", "unsupported_architecture") or not others or pair is None:
            return None
        name = others[0]
        label = f"Load with {ENGINES[name].label if name in ENGINES else name}"
        return label, lambda: self.load_pair(pair.with_plan(engine=name, device="auto", dtype=None))

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
            self._load_failed(ev)

    def _load_failed(self, ev: dict) -> None:
        """The worker says what is loaded after a failed load: the pair loaded before, when there was room to
        keep it while the new one loaded (engine/backends/choice.py), else nothing."""
        self._loading = False
        failed, previous, self._previous = self.pair, self._previous, None
        device = failed.run_plan["device"] if failed else "cpu"
        way_out = (("Load on the CPU", lambda: self.load_pair(failed.with_plan(device="cpu", dtype=None)))
                   if ev.get("code") in ("device_unavailable", "out_of_memory") and device != "cpu"
                   else self.other_engine_way_out(ev, failed))
        still = ev.get("pair")
        kept = previous if previous and still and previous[1].target == still.get("target") else None
        if kept is not None:
            self.pair, self.loaded = kept
            self.panel.set_runtime(self.loaded)
            self.panel.set_baseline(self.baseline())
        self.loadingChanged.emit(False, "")
        name = kept[0].name if kept else None
        self.statusMessage.emit(f"Could not load {failed.name if failed else 'the model'}: {ev.get('message', '')}"
                                + (f" {name} is still loaded." if name else ""))
        what = (failed.name if failed else "") or "the model"
        if kept and failed and kept[0].id == failed.id:      # the same pair another way: say which way failed
            plan = failed.run_plan
            what += f" with {plan['engine']} on {plan['device']}"
        self.loadFailed.emit(ev, way_out, what, name)
        if kept is not None:
            self.readyChanged.emit()

    def _loaded(self, ev: dict) -> None:
        loaded = LoadedPair.of(ev)
        self._loading, self.loaded = False, loaded
        if self.pair.remote:   # named after the model the server serves
            self.pair = self.pair.named(loaded.name)
            settings_mod.remember_server(self.settings, loaded.base_url, self.pair.remote.get("api_key") or "")
        self.settings.last_pair = self.pair.to_dict()
        settings_mod.remember_pair(self.settings, self.pair.to_dict())
        if loaded.measured and loaded.offers.local:
            settings_mod.remember_measured(self.settings, self.pair.measured_key, loaded.method, loaded.measured,
                                           loaded.engine if loaded.engine_choice else None)
        self.save_settings()
        self.panel.has_drafter, self.panel.method_label = loaded.speculates, loaded.method_label
        self.loadingChanged.emit(False, "")
        if not loaded.offers.local:
            self.statusMessage.emit(f"{loaded.name} ready on {loaded.device}: chats run there; this computer's "
                                    "engine is not started.")
        else:
            if loaded.device_note:
                self.statusMessage.emit(loaded.device_note)
            self.ready_text = (f"{self.display_name} ready: {loaded.engine} engine on {loaded.where}, "
                               f"{loaded.dtype} (block size {loaded.block_size}, "
                               f"ready {time.monotonic() - self._load_started:.1f} s after you asked; "
                               f"reading the model took {loaded.load_s:.1f} s of that)")
            self.statusMessage.emit(self.ready_text)
        self.panel.set_runtime(loaded)
        self._show_baseline(self.baseline())          # known now: baselines are per engine too
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

    def engine_memory(self) -> int | None:
        """Resident bytes of the engine: the worker and what it started (llama.cpp's server holds the model)."""
        try:
            root = psutil.Process(self.worker_pid()) if self.worker_pid() else None
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) if root else None
        except (psutil.Error, ValueError):
            return None

    # -- baseline -----------------------------------------------------------------------------------
    @property
    def baseline_key(self) -> str | None:
        """The loaded pair's baselines key (pair and engine; None until it loads)."""
        return self.pair.baseline_key(self.loaded.engine) if self.pair and self.loaded else None

    def baseline(self, key: str | None = None) -> BaselineRecord | None:
        """The baseline stored under ``key`` (default: the loaded pair's)."""
        key = key or self.baseline_key
        return BaselineRecord.from_dict(self.settings.baselines.get(key)) if key else None

    def baseline_of(self, model: dict | None) -> BaselineRecord | None:
        """The baseline of the model an answer names (its stats' `model`); None when it names none."""
        key = (model or {}).get("baseline_key")
        return self.baseline(key) if key else None

    def record_baseline(self, record: BaselineRecord, key: str | None = None) -> None:
        """Make ``record`` the baseline under ``key`` (default: the loaded pair's) on this machine: saved, shown,
        and every figure derived from it recomputed. The calibration and the speedup demo both come here."""
        key = key or self.baseline_key
        if key is None:
            return
        self.settings.baselines[key] = record.to_dict()
        self.save_settings()
        if key == self.baseline_key:
            self._show_baseline(record)

    def _show_baseline(self, record: BaselineRecord | None) -> None:
        self.panel.set_baseline(record)
        self.baselineChanged.emit(record)

    def answer_model(self) -> dict | None:
        """Who writes an answer now, kept in its stats: every figure shown beside it later belongs to this model
        (its name, engine, weights and baseline), whatever is loaded by then."""
        if self.pair is None or self.loaded is None:
            return None
        loaded = self.loaded
        return {"id": self.pair.id, "name": self.display_name, "engine": loaded.engine, "device": loaded.device,
                "dtype": loaded.dtype, "has_drafter": loaded.speculates, "chat": loaded.chat_template,
                "baseline_key": self.baseline_key}

    def calibrate(self) -> None:
        """Measure plain decoding of the same target on this machine: CALIBRATION_RUNS runs of 64 tokens, greedy,
        the median kept with the range and the busiest CPU share. Each run waits in the job queue behind an
        answer being written, so none shares the CPU with one."""
        if self.loaded is None or self._measuring or self._loading:
            return
        if not self.loaded.offers.baseline:
            self.statusMessage.emit("A server runs its own speculative decoding on every request, so plain "
                                    "decoding cannot be measured there.")
            return
        self._measuring = True
        self.panel.set_baseline(self.baseline(), measuring=True)
        self._calibration_run(self._epoch, self.baseline_key, self.loaded.device, [])

    def _calibration_run(self, epoch: int, key: str, device: str, runs: list) -> None:
        self.loadingChanged.emit(True, f"Measuring the baseline (plain decoding, {session.CALIBRATION_TOKENS} tokens, "
                                       f"run {len(runs) + 1} of {session.CALIBRATION_RUNS})…")
        meter = CpuMeter([self.worker_pid()]).start()
        on_event = functools.partial(self._on_calibration_event, epoch, key, device, runs, meter)
        self.worker.generate(prompt=session.CALIBRATION_PROMPT, mode="baseline", settings={
            "max_new_tokens": session.CALIBRATION_TOKENS, "temperature": 0.0}, on_event=on_event)

    def _on_calibration_event(self, epoch: int, key: str, device: str, runs: list, meter: CpuMeter,
                              ev: dict) -> None:
        if ev.get("event") not in ("done", "error"):
            return
        cpu_other = meter.stop()
        if ev["event"] == "done" and ev.get("stop_reason") != "cancelled":
            runs.append((ev, cpu_other))
            if len(runs) < session.CALIBRATION_RUNS:
                if epoch == self._epoch:           # another load since: it measures its own pair
                    self._calibration_run(epoch, key, device, runs)
                return
        record = BaselineRecord.median_of(runs, device) if len(runs) == session.CALIBRATION_RUNS else None
        if record is not None:    # it measured that pair, even if another one was asked for since
            self.record_baseline(record, key)
        if epoch != self._epoch:
            return
        self._measuring = False
        self.loadingChanged.emit(False, "")
        if record is not None:
            self.statusMessage.emit(record.describe())
        else:
            self.panel.set_baseline(self.baseline())
            self.statusMessage.emit(f"Baseline measurement failed: {ev.get('message', 'it was stopped')}")
        self.readyChanged.emit()

    def save_settings(self) -> None:
        try:
            settings_mod.save(self.settings)
        except OSError as exc:
            self.statusMessage.emit(f"Settings could not be saved: {exc}")
