"""Glue between the chat view, the chat store, the stats panel and the worker: what happens on send,
stop, regenerate, edit-and-resend, model load and baseline calibration. Every worker call returns at
once; results come back as QtWorker signals, matched to our requests by id."""
from __future__ import annotations

import logging
import time

import psutil
from PySide6.QtCore import QObject, Signal

from dflash_desktop import run_plan, session
from engine.backends import ENGINES
from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.cpu_load import CpuMeter
from dflash_desktop.offers import Offers
from dflash_desktop.qt_worker import QtWorker
from dflash_desktop.session import BaselineRecord

from .chat_settings_dialog import greedy_question
from .chat_view import ChatView
from .message_widget import MessageWidget
from .stats_panel import StatsPanel

log = logging.getLogger(__name__)


class ChatController(QObject):
    statusMessage = Signal(str)           # one line for the status bar
    loadingChanged = Signal(bool, str)    # busy loading or measuring?, what is happening
    conversationsChanged = Signal()
    currentConversationChanged = Signal(int)   # -1: a new chat not saved yet
    pairLoaded = Signal(dict)             # the loaded event (+ the pair's display name as "display_name")
    answerFinished = Signal(dict)         # the done or error event that ended an answer
    pairUnloaded = Signal()               # the user unloaded the model: memory freed
    baselineChanged = Signal(object)      # the loaded pair's BaselineRecord (or None): one source of truth
    chatUnreadable = Signal(str)          # a stored chat could not be shown: why, in a sentence for a dialog

    def __init__(self, worker: QtWorker, store: ChatStore, settings: settings_mod.Settings, view: ChatView,
                 panel: StatsPanel, parent: QObject | None = None):
        super().__init__(parent)
        self.worker, self.store, self.settings, self.view, self.panel = worker, store, settings, view, panel
        self.pair: dict | None = None
        self.pair_info: dict | None = None
        self.conversation_id: int | None = None
        self._pending_system_prompt = ""
        self._pending_overrides: dict = {}   # chat settings chosen before the chat's first message
        self._load_id: str | None = None
        self._calib_id: str | None = None
        self._gen: dict | None = None      # id, widget, message_id, conversation_id
        self._waiting = False              # an answer is queued behind a load or a calibration
        self._calib_meter: CpuMeter | None = None
        self._load_started = 0.0           # when the user asked for the load: the wait they really had
        self.ready_text = ""               # the last "ready" line (the status bar may have moved on)
        self._unload_id: str | None = None
        self._unloaded = False             # the user unloaded the pair: the next message loads it again
        self._rss_before_unload: int | None = None
        self._count: tuple[str, int | None, str] | None = None   # the count asked last: id, chat, typed text
        worker.ok.connect(self._on_ok)
        worker.progress.connect(self._on_progress)
        worker.loaded.connect(self._on_loaded)
        worker.tokens.connect(self._on_tokens)
        worker.done.connect(self._on_done)
        worker.error.connect(self._on_error)
        # Bound methods, not lambdas: the worker outlives a controller, and Qt drops a deleted
        # receiver's connections only for its own methods.
        worker.warning.connect(self._on_warning)
        # an answer queued behind someone else's generation (the speedup demo) starts when it ends
        worker.done.connect(self._run_waiting)
        worker.error.connect(self._run_waiting)
        view.sendRequested.connect(self.send_typed)
        view.stopRequested.connect(self.stop)
        view.regenerateRequested.connect(self.regenerate)
        view.editSubmitted.connect(self.edit_and_resend)
        view.versionRequested.connect(self.show_version)
        view.systemPromptChanged.connect(self.set_system_prompt)
        view.contextCountWanted.connect(self.count_context)
        worker.counted.connect(self._on_counted)
        view.thinking.toggled.connect(self._on_thinking_toggled)
        panel.remeasureRequested.connect(self.calibrate)

    # -- model --------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """A pair is loaded and no load or calibration of ours is in flight; other callers' generations (the
        speedup demo, the local server) do not matter: the job queue runs ours after them."""
        return self.pair_info is not None and self._load_id is None and self._calib_id is None

    @property
    def generating(self) -> bool:
        return self._gen is not None

    def load_pair(self, pair: dict) -> None:
        """pair: {id, name, target_dir, draft_dir, plan: {engine, device, dtype} (run_plan.py; absent:
        the engine's own choice), thinking}, or {id, name, remote: {base_url, api_key}} for a pair on a
        server; remembered as the last pair once it loads."""
        if self._gen:
            self.stop()
        self._submit_load(pair)

    def _submit_load(self, pair: dict) -> None:
        self._unloaded = False
        self._load_started = time.monotonic()
        self.pair, self.pair_info = dict(pair), None
        self._calib_id = None
        self.panel.set_baseline(self.baseline())
        self.baselineChanged.emit(self.baseline())
        if pair.get("remote"):
            self._load_id = self.worker.load_remote(**pair["remote"])
            self.loadingChanged.emit(True, f"Connecting to {pair['remote']['base_url']}…")
            return
        plan = pair.get("plan") or run_plan.AUTO
        self._load_id = self.worker.load_pair(pair["target_dir"], pair.get("draft_dir"), **plan)
        where = "" if plan["device"] == "auto" else f" on {plan['device']}"
        self.loadingChanged.emit(True, f"Loading {pair.get('name', 'model')}{where}…")

    def load_on_cpu(self) -> None:
        """After the chosen device failed: the same pair with the engine's CPU defaults."""
        if self.pair is not None:
            self._load_again((self.pair.get("plan") or run_plan.AUTO)["engine"], "cpu")

    def load_with_engine(self, engine: str) -> None:
        """After the engine crashed on this computer: the same pair with another engine that runs it."""
        self._load_again(engine, "auto")

    def _load_again(self, engine: str, device: str) -> None:
        if self.pair is not None:
            self.load_pair({**self.pair, "plan": {"engine": engine, "device": device, "dtype": None}})

    def _crash_way_out(self, ev: dict):
        """The other engine a crashed one leaves (the worker names those that run the pair here), as a button."""
        others = ev.get("alternatives") or []
        if ev.get("code") != "engine_crashed" or not others:
            return None
        name = others[0]
        return f"Load with {ENGINES[name].label if name in ENGINES else name}", lambda: self.load_with_engine(name)

    def baseline(self) -> BaselineRecord | None:
        return BaselineRecord.from_dict(self.settings.baselines.get(session.pair_key(self.pair)))

    def record_baseline(self, record: BaselineRecord, pair: dict | None = None) -> None:
        """Make ``record`` the baseline of ``pair`` (default: the loaded one) on this machine: saved, shown, and
        every figure derived from it recomputed. The calibration and the speedup demo both come here."""
        key = session.pair_key(pair or self.pair)
        if not key:
            return
        self.settings.baselines[key] = record.to_dict()
        self.save_settings()
        if key == session.pair_key(self.pair):
            self.panel.set_baseline(record)
            self.baselineChanged.emit(record)

    def worker_pid(self) -> int | None:
        client = getattr(self.worker, "client", None)
        try:
            return client.pid if client is not None else None
        except Exception:   # noqa: BLE001 - a worker being restarted has no pid yet
            return None

    def calibrate(self) -> None:
        """Measure plain decoding of the same target on this machine (64 tokens, greedy)."""
        if self.pair_info is None or self._gen is not None or self._calib_id is not None:
            return
        if not Offers.of(self.pair_info).baseline:
            self.statusMessage.emit("A server runs its own speculative decoding on every request, so plain "
                                    "decoding cannot be measured there.")
            return
        self.panel.set_baseline(self.baseline(), measuring=True)
        self.loadingChanged.emit(True, "Measuring the baseline (plain decoding, 64 tokens)…")
        self._calib_meter = CpuMeter([self.worker_pid()]).start()
        self._calib_id = self.worker.generate(prompt=session.CALIBRATION_PROMPT, mode="baseline", settings={
            "max_new_tokens": session.CALIBRATION_TOKENS, "temperature": 0.0})

    def _on_progress(self, ev: dict) -> None:
        if ev.get("id") == self._load_id:
            waited = time.monotonic() - self._load_started
            self.loadingChanged.emit(True, f"{ev.get('message', 'Loading…')}  ({waited:.0f} s so far)")

    def unload(self) -> None:
        """Free the model's memory (the worker keeps running); the next message loads the same pair again."""
        if not Offers.of(self.pair_info).unload or self._unload_id:
            return
        if self._gen:
            self.stop()
        self._rss_before_unload = self._worker_rss()
        self._unload_id = self.worker.unload()
        self.loadingChanged.emit(True, "Unloading the model…")

    def _worker_rss(self) -> int | None:
        try:
            return psutil.Process(self.worker_pid()).memory_info().rss if self.worker_pid() else None
        except (psutil.Error, ValueError):
            return None

    def _on_ok(self, ev: dict) -> None:
        if ev.get("id") is None or ev.get("id") != self._unload_id:
            return
        self._unload_id, self.pair_info, self._unloaded = None, None, True
        before, after = self._rss_before_unload, self._worker_rss()
        memory = (f" The engine process went from {before / 2**20:,.0f} MB to {after / 2**20:,.0f} MB."
                  if before and after else "")
        self.loadingChanged.emit(False, "")
        self.statusMessage.emit(f"Model unloaded: its memory is freed.{memory} Your next message loads it again.")
        self.pairUnloaded.emit()

    def _on_loaded(self, ev: dict) -> None:
        if ev.get("id") != self._load_id:
            return
        self._load_id, self.pair_info = None, ev
        if self.pair.get("remote"):   # named after the model the server serves
            self.pair = {**self.pair, "name": ev.get("name")}
            settings_mod.remember_server(self.settings, ev["base_url"], self.pair["remote"].get("api_key") or "")
        self.settings.last_pair = self.pair
        self.save_settings()
        self.view.thinking.setVisible(bool(ev.get("supports_thinking")))
        if self.pair.get("thinking") is not None:   # match the drafter's training, so drafts get accepted
            self.view.thinking.setChecked(bool(self.pair["thinking"]))
        self.view.set_examples(bool(ev.get("chat_template")), demo=self.pair.get("id") == "demo")
        self.panel.has_drafter = bool(ev.get("has_drafter"))
        self.view.set_context(limit=ev.get("max_positions") or 0)
        self.count_context()
        self.loadingChanged.emit(False, "")
        if not Offers.of(ev).local:
            self.statusMessage.emit(f"{ev.get('name')} ready on {ev.get('device')}: chats run there; this computer's "
                                    "engine is not started.")
        else:
            self.ready_text = (f"{self.pair.get('name', ev.get('name'))} ready: {ev.get('engine')} engine on "
                                    f"{ev.get('device')}, {ev.get('dtype')} (block size {ev.get('block_size')}, "
                                    f"ready {time.monotonic() - self._load_started:.1f} s after you asked; "
                                    f"reading the model took {ev.get('load_s', 0):.1f} s of that)")
            self.statusMessage.emit(self.ready_text)
        self.panel.set_runtime(ev)
        self.pairLoaded.emit({**ev, "display_name": self.pair.get("name", ev.get("name"))})
        if self.baseline() is None and Offers.of(ev).baseline:
            self.calibrate()
        self._run_waiting()

    # -- conversations ------------------------------------------------------------------------------
    def new_chat(self) -> None:
        if self._gen:
            self.stop()
        self.conversation_id = None
        self._pending_system_prompt = ""
        self._pending_overrides = {}
        self.view.load([], "")
        self.view.show_chat_settings({})
        self.view.set_context(used=0)
        self.panel.clear_answer()
        self.currentConversationChanged.emit(-1)

    def open_conversation(self, conversation_id: int) -> None:
        """Show a stored chat. One the window cannot draw (a value of the wrong type, stored by an older version's
        import or by another program) is left as it is, with a new chat on screen and ``chatUnreadable`` saying
        why: the window opens the last chat at start, and a chat must never stop the app from starting."""
        if conversation_id == self.conversation_id:
            return
        if self._gen:
            self.stop()
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        self.conversation_id = conv.id
        try:
            messages = self.store.messages(conv.id)
            self.view.load(messages, conv.system_prompt, self.pair_info)
            self.view.show_chat_settings(conv.overrides)
            self.show_stats_of(messages)
        except Exception as exc:  # noqa: BLE001 - whatever a damaged row makes the drawing raise
            log.warning("chat %s could not be shown: %r", conv.id, exc)
            self.new_chat()
            self.chatUnreadable.emit(f"The chat “{conv.title}” could not be shown: it holds a value this version "
                                     f"cannot draw ({type(exc).__name__}: {exc}). It was left as it is: delete it "
                                     "from the chats list, or export it as JSON to look into it.")
            return
        self.currentConversationChanged.emit(conv.id)

    def show_stats_of(self, messages) -> None:
        """The stats panel describes the chat on screen: its answer being written, else its last answer with
        stats, else nothing (never another chat's numbers)."""
        gen = self._gen
        if gen is not None and gen["conversation_id"] == self.conversation_id:
            self.panel.start_answer()
            return
        answers = [m for m in messages if m.role == "assistant" and m.stats]
        used, estimated = self._context_used(messages)
        self.view.set_context(used=used, estimated=estimated)
        self.count_context()
        if not answers:
            self.panel.clear_answer()
            return
        last = answers[-1]
        before = [m for m in messages if m.role == "user" and m.id < last.id]
        context = self._context(last.stats, text=last.content, prompt=before[-1].content if before else "")
        number = sum(1 for m in messages if m.role == "assistant" and m.id <= last.id)
        self.panel.set_stats(last.stats, context, subject=f"Answer {number} of this chat.")

    def delete_conversation(self, conversation_id: int) -> None:
        if conversation_id == self.conversation_id:
            self.new_chat()
        self.store.delete_conversation(conversation_id)
        self.conversationsChanged.emit()

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.update_conversation(conversation_id, title=title)
        self.conversationsChanged.emit()

    def set_system_prompt(self, text: str) -> None:
        if self.conversation_id is None:
            self._pending_system_prompt = text
        else:
            self.store.update_conversation(self.conversation_id, system_prompt=text)

    def chat_overrides(self) -> dict:
        """The temperature and max tokens the chat on screen sets itself (not the global ones)."""
        if self.conversation_id is None:
            return dict(self._pending_overrides)
        conv = self.store.conversation(self.conversation_id)
        return conv.overrides if conv else {}

    def set_chat_overrides(self, overrides: dict) -> None:
        """{} goes back to the global settings; used from the chat's next answer on."""
        if self.conversation_id is None:
            self._pending_overrides = dict(overrides)
        else:
            self.store.set_chat_settings(self.conversation_id, temperature=overrides.get("temperature"),
                                         max_new_tokens=overrides.get("max_new_tokens"))
        self.view.show_chat_settings(overrides)
        own = ", ".join(f"{k.replace('max_new_tokens', 'max tokens')} {v:g}" for k, v in overrides.items())
        self.statusMessage.emit(f"This chat now uses its own {own}." if own else
                                "This chat now follows the global temperature and max tokens.")

    def generation_settings(self) -> dict:
        """The worker's settings for the chat on screen: the global ones, with the chat's own on top."""
        return {**self.settings.generation((self.pair_info or {}).get("block_size")), **self.chat_overrides()}

    # -- answers ------------------------------------------------------------------------------------
    def send_typed(self, text: str) -> None:
        """Send what the message box holds; the box is emptied only once the message is stored, so a refused
        save (read-only chats, a full disk) leaves the text there to send again."""
        self.send(text, typed=True)

    def send(self, text: str, typed: bool = False) -> None:
        if self._gen is not None or not text.strip():
            return
        if self.conversation_id is None:
            conv = self.store.create_conversation(session.title_from(text), self._pending_system_prompt)
            if self._pending_overrides:
                self.store.set_chat_settings(conv.id, temperature=self._pending_overrides.get("temperature"),
                                             max_new_tokens=self._pending_overrides.get("max_new_tokens"))
            self.conversation_id = conv.id
            self.currentConversationChanged.emit(conv.id)
        message = self.store.add_message(self.conversation_id, "user", text)
        if typed:
            self.view.input.clear()
        self.view.add_user(message.id, text)
        self.conversationsChanged.emit()
        self._start_answer()

    def _last_answer(self):
        if self._gen is not None or self.conversation_id is None:
            return None
        messages = self.store.messages(self.conversation_id)
        return messages[-1] if messages and messages[-1].role == "assistant" else None

    def regenerate(self):
        """Write the last answer again as a new version (the earlier ones stay, browsable with < >). At
        temperature 0 the same answer would come back, so the user is asked first: returns that question."""
        if self._last_answer() is None:
            return None
        if self.generation_settings()["temperature"] == 0:
            return greedy_question(self.view, self.regenerate_at)
        self.regenerate_at(None)
        return None

    def regenerate_at(self, temperature: float | None) -> None:
        """Regenerate now; ``temperature`` (None: the chat's) is for this answer only."""
        last = self._last_answer()
        if last is None:
            return
        self.store.new_version(last.id)
        widget = self.view.user_widget(last.id)
        if widget is not None:
            self.view.remove_from(widget)   # with the error bubble under it, if any
        self._start_answer(last.id, {} if temperature is None else {"temperature": temperature})

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a user turn and write its answer again: the answer's earlier versions (each with the question
        it answered) are kept; later turns go. A turn without an answer is simply sent again."""
        if self._gen is not None or self.conversation_id is None:
            return
        messages = self.store.messages(self.conversation_id)
        after = [m for m in messages if m.id > message_id]
        if not after or after[0].role != "assistant":
            self.store.delete_from(self.conversation_id, message_id)
            widget = self.view.user_widget(message_id)
            if widget is not None:
                self.view.remove_from(widget)
            self.send(text)
            return
        answer = after[0]
        self.store.delete_messages([m.id for m in after[1:]])
        self.store.new_version(answer.id, text)
        self.view.user_widget(message_id).set_content(text)
        self.view.remove_from(self.view.user_widget(answer.id))
        self.conversationsChanged.emit()
        self._start_answer(answer.id)

    def show_version(self, message_id: int, index: int) -> None:
        """Show another version of an answer (and the question it answered); later turns are sent with it."""
        if self._gen is not None or self.conversation_id is None:
            self.statusMessage.emit("Wait for the answer being written (or stop it) to switch versions.")
            return
        forward = index > self.store.message(message_id).version
        self.store.show_version(message_id, index)
        messages = self.store.messages(self.conversation_id)
        shown = next(m for m in messages if m.id == message_id)
        question = [m for m in messages if m.role == "user" and m.id < message_id]
        widget = self.view.user_widget(message_id)
        if widget is not None:   # updated in place: the arrow being pressed stays, with the keyboard on it
            if question and self.view.user_widget(question[-1].id) is not None:
                self.view.user_widget(question[-1].id).set_content(question[-1].content)
                widget.set_prefix(question[-1].content)
            widget.set_content(shown.content, shown.spans or [[shown.content, False]])
            widget.set_footer(shown.stats, shown.stop_reason)
            self.view.set_error_under(widget, shown.error, self.pair_info)
            ahead, back = ((widget.next_button, widget.previous_button) if forward else
                           (widget.previous_button, widget.next_button))
            on_arrows = ahead.hasFocus() or back.hasFocus()
            widget.set_versions(shown.version, len(shown.versions))
            if on_arrows and not ahead.isEnabled():   # at the first or last version: the other arrow
                back.setFocus()
        self.show_stats_of(messages)

    def stop(self) -> None:
        gen = self._gen
        if gen is None:
            return
        if gen["id"] is None:   # still queued behind a load or a calibration
            self._finish({"event": "done", "id": None, "stop_reason": "cancelled", "text": gen["widget"].text,
                          "stats": None})
        else:
            self.worker.cancel(gen["id"])

    def _start_answer(self, message_id: int | None = None, overrides: dict | None = None) -> None:
        """Write an answer into a new message, or into a new version of ``message_id``; ``overrides``: settings
        for this answer only (a regeneration sampled at another temperature)."""
        users = [w for w in self.view.messages if isinstance(w, MessageWidget) and w.role == "user"]
        widget = self.view.add_assistant(prefix=users[-1].text if users else "")
        message = (self.store.message(message_id) if message_id is not None else
                   self.store.add_message(self.conversation_id, "assistant", "", stop_reason="generating"))
        widget.message_id = message.id
        widget.set_versions(message.version, len(message.versions or ()) or 1)
        self._gen = {"id": None, "widget": widget, "message_id": message.id, "conversation_id": self.conversation_id,
                     "overrides": overrides or {}}
        self.view.set_busy(True)
        self.view.mark_last()
        self.panel.start_answer()
        if self.ready:
            self._launch()
        else:
            widget.footer.setText("waiting for the model…")
            self._waiting = True
            if self._unloaded and self.pair is not None and self._load_id is None:
                self._submit_load(self.pair)      # unloaded by the user: this message loads it again
            if self.pair is None:
                self.statusMessage.emit("No model loaded: choose one with Models… (Ctrl+M).")

    def _on_thinking_toggled(self, on: bool) -> None:
        trained = (self.pair or {}).get("thinking")
        if trained is None or on == trained:
            return
        mode = "on" if trained else "off"
        self.statusMessage.emit(f"This drafter was trained with thinking {mode}. With thinking "
                                f"{'on' if on else 'off'} far fewer drafts are accepted, and DFlash may switch to "
                                "plain decoding for the rest of an answer; the text is the same either way.")

    def _on_warning(self, ev: dict) -> None:
        self.statusMessage.emit(ev.get("message", ""))

    def _run_waiting(self, _event: dict | None = None) -> None:
        if self._waiting and self.ready and self._gen is not None:
            self._launch()

    def _request(self, history: list[dict]) -> dict:
        """generate()'s prompt fields for this chat with `history` as its turns; count_tokens takes the same."""
        conv = self.store.conversation(self.conversation_id) if self.conversation_id is not None else None
        request = session.request_for(history, conv.system_prompt if conv else self._pending_system_prompt,
                                      bool(self.pair_info.get("chat_template")))
        thinking = self.view.thinking.isChecked() if self.view.thinking.isVisible() else None
        return {**request, "enable_thinking": thinking}

    def count_context(self, typed: str | None = None) -> None:
        """Ask the engine to count the chat on screen with `typed` (default: the message box) as its next
        message, exactly as the next generate would send it. Not while this chat's answer is written (the
        answer is not stored yet; its end sets the meter from its stats), and not without a local model:
        the meter then keeps its estimate."""
        typed = self.view.input.toPlainText() if typed is None else typed
        if self.pair_info is None or self._gen is not None:
            return
        messages = self.store.messages(self.conversation_id) if self.conversation_id is not None else []
        history = [{"role": m.role, "content": m.content} for m in messages]
        if typed:
            history.append({"role": "user", "content": typed})
        if not history:
            self.view.set_counted(typed, 0)
            return
        rid = self.worker.count_tokens(**self._request(history))
        self._count = (rid, self.conversation_id, typed) if rid else None

    def _on_counted(self, ev: dict) -> None:
        if self._count is None or ev.get("id") != self._count[0]:
            return
        _, conversation_id, typed = self._count
        self._count = None
        if conversation_id == self.conversation_id and self._gen is None:
            self.view.set_counted(typed, ev["tokens"], ev.get("context"))

    def _launch(self) -> None:
        self._waiting = False
        history = [{"role": m.role, "content": m.content} for m in self.store.messages(self.conversation_id)
                   if m.id != self._gen["message_id"]]
        request = self._request(history)
        self._gen["widget"].footer.setText("thinking…")
        self._gen["prompt"] = next((m["content"] for m in reversed(history) if m["role"] == "user"), "")
        if Offers.of(self.pair_info).local:   # a server's answer does not run on this machine's CPU
            self._gen["meter"] = CpuMeter([self.worker_pid()]).start()
        self._gen["id"] = self.worker.generate(
            **request, settings={**self.generation_settings(), **self._gen["overrides"]})

    def _on_tokens(self, ev: dict) -> None:
        gen = self._gen
        if gen is None or ev.get("id") != gen["id"]:
            return
        if gen["conversation_id"] == self.conversation_id:
            gen["widget"].append_spans(ev.get("spans") or [])
            gen["widget"].footer.setText(f"{ev.get('generated', 0)} tokens…")
        else:
            gen.setdefault("late_spans", []).extend(ev.get("spans") or [])
            return                       # the panel describes the chat on screen, not this one
        self.panel.update_live(ev)

    def _on_done(self, ev: dict) -> None:
        if ev.get("id") is not None and ev.get("id") == self._calib_id:
            self._calib_id = None
            meter, self._calib_meter = self._calib_meter, None
            record = BaselineRecord.from_done(ev, (self.pair_info or {}).get("device", "cpu"), "calibration",
                                              meter.stop() if meter else None)
            self.record_baseline(record)
            self.loadingChanged.emit(False, "")
            self.statusMessage.emit(record.describe())
            self._run_waiting()
        elif self._gen is not None and ev.get("id") == self._gen["id"]:
            self._finish(ev)

    def _on_error(self, ev: dict) -> None:
        rid = ev.get("id")
        if rid is not None and rid == self._load_id:
            self._load_id = None
            self.loadingChanged.emit(False, "")
            self.statusMessage.emit(f"Could not load the model: {ev.get('message', '')}")
            device = (self.pair.get("plan") or run_plan.AUTO)["device"] if self.pair else "cpu"
            way_out = (("Load on the CPU", self.load_on_cpu)
                       if ev.get("code") in ("device_unavailable", "out_of_memory") and device != "cpu"
                       else self._crash_way_out(ev))
            if self._gen is not None:
                self._finish(ev)
            else:
                self.view.add_error(ev, action=way_out)
        elif rid is not None and rid == self._calib_id:
            self._calib_id = None
            self.loadingChanged.emit(False, "")
            self.panel.set_baseline(self.baseline())
            self.statusMessage.emit(f"Baseline measurement failed: {ev.get('message', '')}")
            self._run_waiting()
        elif self._count is not None and rid == self._count[0]:
            self._count = None           # no count (the chat is far too long, a model without tokenizer): ≈ stays
        elif self._gen is not None and (rid == self._gen["id"] or rid is None):
            self._finish(ev)
        else:
            self.statusMessage.emit(ev.get("message", "The engine reported an error."))

    def _finish(self, ev: dict) -> None:
        """Store the answer (partial or whole) with its stop reason; show stats or the error."""
        gen, self._gen = self._gen, None
        self._waiting = False
        widget: MessageWidget = gen["widget"]
        visible = gen["conversation_id"] == self.conversation_id
        spans = widget.spans + [list(s) for s in gen.get("late_spans", [])] if visible else \
            [list(s) for s in gen.get("late_spans", [])]
        text = "".join(s[0] for s in spans)
        is_error = ev.get("event") == "error"
        if not is_error and ev.get("text") is not None and ev["text"] != text:
            text, spans = ev["text"], [[ev["text"], False]]   # the engine's text is the reference
        stats = None if is_error else ev.get("stats")
        meter = gen.get("meter")
        cpu_other = meter.stop() if meter else None
        if stats and cpu_other is not None:   # measured by the window: kept with the answer
            stats = {**stats, "cpu_other": cpu_other, "cpu_wall_s": meter.wall_s}
        stop_reason = "error" if is_error else ev.get("stop_reason")
        error = {k: v for k, v in ev.items() if k != "event"} if is_error else None
        self.store.update_message(gen["message_id"], content=text, spans=spans, stats=stats,
                                  stop_reason=stop_reason, error=error)
        if visible:
            widget.set_content(text, spans)
            widget.set_footer(stats, stop_reason)
            stored = self.store.message(gen["message_id"])
            widget.set_versions(stored.version, len(stored.versions or ()) or 1)
            if stats:
                self.view.set_context(used=int(stats.get("prompt_tokens") or 0) + int(stats.get("generated_tokens") or 0))
            if self.view.input.toPlainText():
                self.count_context()     # typed while the answer was written: count it with the answer
            if is_error and ev.get("code") == "prompt_too_long":
                self.view.add_error(ev, self.pair_info, action=("Drop the oldest turns and retry",
                                                                self.drop_oldest_and_retry))
            elif is_error:
                self.view.add_error(ev, self.pair_info, action=self._crash_way_out(ev))
            self.view.mark_last()
        self.view.set_busy(False)
        if is_error and ev.get("code") == "prompt_too_long":
            self.statusMessage.emit("This chat no longer fits the model's context: drop its oldest turns, or start "
                                    "a new chat.")
        elif is_error:
            self.statusMessage.emit(f"Error: {ev.get('message', '')}")
        elif stats and visible:
            context = self._context(stats, text=text, prompt=gen.get("prompt", ""), token_ids=ev.get("token_ids"))
            self.panel.set_stats(stats, context)
        self.conversationsChanged.emit()
        self.answerFinished.emit(ev)

    @staticmethod
    def _context_used(messages) -> tuple[int, bool]:
        """Tokens the chat uses, and whether that is partly estimated: the engine's count with the last answer,
        plus an estimate of later turns (until the engine counts the chat: count_context)."""
        from .chat_view import CHARS_PER_TOKEN
        used, counted_up_to = 0, 0
        for m in messages:
            if m.role == "assistant" and m.stats:
                used = int(m.stats.get("prompt_tokens") or 0) + int(m.stats.get("generated_tokens") or 0)
                counted_up_to = m.id
        rest = sum(len(m.content.encode("utf-8")) for m in messages if m.id > counted_up_to)
        return used + round(rest / CHARS_PER_TOKEN), rest > 0

    def drop_oldest_and_retry(self) -> None:
        """The chat outgrew the model's context: drop its oldest exchange (a user turn and its answer) and the
        failed answer, then write the answer again. Repeat if it is still too long. A failed answer that
        has earlier versions keeps them: only the failed version goes, and the retry is a new version."""
        if self._gen is not None or self.conversation_id is None:
            return
        messages = self.store.messages(self.conversation_id)
        failed = messages[-1] if messages and messages[-1].role == "assistant" else None
        retry_prompt = None
        if failed is not None:
            messages = messages[:-1]
            if failed.versions and len(failed.versions) > 1:
                retry_prompt = failed.versions[failed.version].get("prompt")
                self.store.discard_shown_version(failed.id)
            else:
                self.store.delete_messages([failed.id])
                failed = None
        users = [m for m in messages if m.role == "user"]
        conv = self.store.conversation(self.conversation_id)
        if len(users) < 2:
            self.statusMessage.emit("Your message alone is longer than the model's context: shorten it, or start "
                                    "a new chat with the part that matters.")
            self.view.load(self.store.messages(self.conversation_id), conv.system_prompt if conv else "",
                           self.pair_info)
            return
        oldest = [m.id for m in messages if m.id < users[1].id]
        self.store.delete_messages(oldest)
        if failed is not None:
            self.store.new_version(failed.id, retry_prompt)
        kept = self.store.messages(self.conversation_id)
        self.view.load(kept, conv.system_prompt if conv else "", self.pair_info)
        if failed is not None:
            self.view.remove_from(self.view.user_widget(failed.id))   # _start_answer draws it again
        used, estimated = self._context_used(kept)
        self.view.set_context(used=used, estimated=estimated)
        self.count_context()
        self.statusMessage.emit(f"Dropped the oldest {len(oldest)} message(s) of this chat to fit the model's "
                                "context; writing the answer again.")
        self._start_answer(failed.id if failed is not None else None)

    def _context(self, stats: dict, text: str, prompt: str, token_ids: list | None = None) -> dict:
        """What session.diagnose needs besides the stats, from measurements and the loaded pair."""
        info = self.pair_info or {}
        trained = (self.pair or {}).get("thinking")
        thinking = self.view.thinking.isChecked() if self.view.thinking.isVisible() else None
        return {"cpu_other": stats.get("cpu_other"), "cpu_wall_s": stats.get("cpu_wall_s"), "text": text, "prompt": prompt, "token_ids": token_ids,
                "chat_template": bool(info.get("chat_template")) if info else None,
                "thinking_mismatch": trained is not None and thinking is not None and thinking != trained}

    def save_settings(self) -> None:
        try:
            settings_mod.save(self.settings)
        except OSError as exc:
            self.statusMessage.emit(f"Settings could not be saved: {exc}")
