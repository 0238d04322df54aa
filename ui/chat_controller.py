"""Glue between the chat view, the chat store, the stats panel and the worker for answers: what happens on
send, stop, regenerate, edit-and-resend, versions and dropping turns (the loaded pair's life is
pair_session.py's). Every worker call returns at once and carries its own callback."""
from __future__ import annotations

import functools
import logging

from PySide6.QtCore import QObject, Signal

from dflash_desktop import session
from dflash_desktop import settings as settings_mod
from dflash_desktop.catalog import drafter_training
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.cpu_load import CpuMeter
from dflash_desktop.pairs import LoadedPair
from dflash_desktop.qt_worker import QtWorker
from dflash_desktop.session import author_text
from engine.limits import LIMITS

from .chat_settings_dialog import greedy_question
from .chat_view import ChatView
from .message_widget import MessageWidget
from .pair_session import PairSession
from .stats_panel import StatsPanel

log = logging.getLogger(__name__)


class ChatController(QObject):
    statusMessage = Signal(str)           # one line for the status bar
    conversationsChanged = Signal()
    currentConversationChanged = Signal(int)   # -1: a new chat not saved yet
    answerFinished = Signal(dict)         # the done or error event that ended an answer
    chatUnreadable = Signal(str)          # a stored chat could not be shown: why, in a sentence for a dialog

    def __init__(self, worker: QtWorker, pair: PairSession, store: ChatStore, settings: settings_mod.Settings,
                 view: ChatView, panel: StatsPanel, parent: QObject | None = None):
        super().__init__(parent)
        self.worker, self.session, self.store, self.settings = worker, pair, store, settings
        self.view, self.panel = view, panel
        self.conversation_id: int | None = None
        self._pending_system_prompt = ""
        self._pending_overrides: dict = {}   # chat settings chosen before the chat's first message
        self._gen: dict | None = None      # id, widget, message_id, conversation_id
        self._waiting = False              # an answer is queued behind a load or a calibration
        self._count: tuple[str, int | None, str] | None = None   # the count asked last: id, chat, typed text
        pair.pairLoaded.connect(self._on_loaded)
        pair.readyChanged.connect(self._run_waiting)
        pair.baselineChanged.connect(self._baseline_changed)
        worker.warning.connect(self._on_warning)   # any request's (a bound method: the worker outlives us)
        view.sendRequested.connect(self.send_typed)
        view.stopRequested.connect(self.stop)
        view.regenerateRequested.connect(self.regenerate)
        view.editSubmitted.connect(self.edit_and_resend)
        view.versionRequested.connect(self.show_version)
        view.systemPromptChanged.connect(self.set_system_prompt)
        view.contextCountWanted.connect(self.count_context)
        view.thinking.toggled.connect(self._on_thinking_toggled)

    @property
    def loaded(self) -> LoadedPair | None:
        return self.session.loaded

    @property
    def generating(self) -> bool:
        return self._gen is not None

    def _on_loaded(self, loaded: LoadedPair) -> None:
        """What the chat shows depends on the model: thinking switch, starter cards, context meter."""
        pair = self.session.pair
        self.view.thinking.setVisible(loaded.supports_thinking)
        if pair.thinking is not None:   # match the drafter's training, so drafts get accepted
            self.view.thinking.setChecked(pair.thinking)
        self.view.set_examples(loaded.chat_template, demo=pair.id == "demo")
        self.view.set_context(limit=self.context_limit())
        self.count_context()

    def fail_waiting(self, ev: dict) -> bool:
        """A load failed: the answer waiting for it ends with the error (in its chat). False when none waits,
        and the window says it in a dialog instead."""
        if self._gen is None or not self._waiting:
            return False
        self._finish(ev)
        return True

    # -- conversations ------------------------------------------------------------------------------
    def new_chat(self) -> None:
        if self._gen:
            self.stop()
        self.conversation_id = None
        self._pending_system_prompt = ""
        self._pending_overrides = {}
        self.view.load([], "")
        self.view.show_chat_settings({})
        self.view.set_context(used=0, **({"limit": self.context_limit()} if self.loaded else {}))
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
            self.view.load(messages, conv.system_prompt, self.loaded)
            self.view.show_chat_settings(conv.overrides)
            if self.loaded:
                self.view.set_context(limit=self.context_limit())
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
        self._show_answer_stats(messages, answers[-1])

    def _show_answer_stats(self, messages, last) -> None:
        """A stored answer's figures, against the baseline of the model that wrote it (none when it does not
        say: answers stored before answers kept their model)."""
        before = [m for m in messages if m.role == "user" and m.id < last.id]
        context = self._context(last.stats, text=last.content, prompt=before[-1].content if before else "")
        number = sum(1 for m in messages if m.role == "assistant" and m.id <= last.id)
        self.panel.set_stats(last.stats, context, subject=f"Answer {number} of this chat — {author_text(last.stats)}",
                             baseline=self.session.baseline_of(last.stats.get("model")))

    def _baseline_changed(self, record) -> None:
        """The loaded model's baseline was measured again: the answer on screen follows it if that model wrote
        it (an answer of another model keeps its own)."""
        shown = self.panel.stats
        if shown and self.session.baseline_key and \
                (shown.get("model") or {}).get("baseline_key") == self.session.baseline_key:
            self.panel.set_answer_baseline(record)

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
        """The settings the chat on screen sets itself (not the global ones)."""
        if self.conversation_id is None:
            return dict(self._pending_overrides)
        conv = self.store.conversation(self.conversation_id)
        return conv.overrides if conv else {}

    def set_chat_overrides(self, overrides: dict) -> None:
        """{} goes back to the global settings; used from the chat's next answer on."""
        if self.conversation_id is None:
            self._pending_overrides = dict(overrides)
        else:
            self.store.set_chat_settings(self.conversation_id, overrides)
        self.view.show_chat_settings(overrides)
        own = ", ".join(f"{LIMITS[k].label.lower()} {v:g}" for k, v in overrides.items())
        self.statusMessage.emit(f"This chat now uses its own {own}." if own else
                                "This chat now follows the global settings.")
        if self.loaded:
            self.view.set_context(limit=self.context_limit())

    def context_limit(self) -> int:
        """The tokens the chat on screen may hold: the loaded model's context, or less by the context length."""
        own = self.generation_settings().get("context_length")
        return min(self.loaded.max_positions, own or self.loaded.max_positions)

    def generation_settings(self) -> dict:
        """The worker's settings for the chat on screen: the global ones, with the chat's own on top."""
        return {**self.settings.generation(self.loaded.block_size if self.loaded else None), **self.chat_overrides()}

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
                self.store.set_chat_settings(conv.id, self._pending_overrides)
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
            self.view.set_error_under(widget, shown.error, self.loaded)
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
        widget.set_author(None, self.session.display_name or None)
        self.view.set_busy(True)
        self.view.mark_last()
        self.panel.start_answer()
        if self.session.ready:
            self._launch()
        else:
            widget.footer.setText("waiting for the model…")
            self._waiting = True
            if self.session.unloaded:
                self.session.reload()      # unloaded by the user: this message loads it again
            if self.session.pair is None:
                self.statusMessage.emit("No model loaded: choose one with Models… (Ctrl+M).")

    def _on_thinking_toggled(self, on: bool) -> None:
        trained = self.session.pair.thinking if self.session.pair else None
        if trained is None or on == trained:
            return
        mode = "on" if trained else "off"
        self.statusMessage.emit(f"This drafter was trained with thinking {mode}. With thinking "
                                f"{'on' if on else 'off'} far fewer drafts are accepted, and DFlash may switch to "
                                "plain decoding for the rest of an answer; the text is the same either way.")

    def _on_warning(self, ev: dict) -> None:
        self.statusMessage.emit(ev.get("message", ""))

    def _run_waiting(self) -> None:
        if self._waiting and self.session.ready and self._gen is not None:
            self._launch()

    def _request(self, history: list[dict]) -> dict:
        """generate()'s prompt fields for this chat with `history` as its turns; count_tokens takes the same."""
        conv = self.store.conversation(self.conversation_id) if self.conversation_id is not None else None
        request = session.request_for(history, conv.system_prompt if conv else self._pending_system_prompt,
                                      self.loaded.chat_template)
        thinking = self.view.thinking.isChecked() if self.view.thinking.isVisible() else None
        return {**request, "enable_thinking": thinking}

    def count_context(self, typed: str | None = None) -> None:
        """Ask the engine to count the chat on screen with `typed` (default: the message box) as its next
        message, exactly as the next generate would send it. Not while this chat's answer is written (the
        answer is not stored yet; its end sets the meter from its stats), and not without a local model:
        the meter then keeps its estimate."""
        typed = self.view.input.toPlainText() if typed is None else typed
        if self.loaded is None or self._gen is not None:
            return
        messages = self.store.messages(self.conversation_id) if self.conversation_id is not None else []
        history = [{"role": m.role, "content": m.content} for m in messages]
        if typed:
            history.append({"role": "user", "content": typed})
        if not history:
            self.view.set_counted(typed, 0)
            return
        asked = (object(), self.conversation_id, typed)
        self._count = asked
        if self.worker.count_tokens(**self._request(history), on_event=functools.partial(self._counted, asked)) is None:
            self._count = None

    def _counted(self, asked: tuple, ev: dict) -> None:
        if self._count is not asked:
            return                       # a later count replaced this one
        self._count = None
        _, conversation_id, typed = asked
        if ev.get("event") == "count" and conversation_id == self.conversation_id and self._gen is None:
            self.view.set_counted(typed, ev["tokens"], self.context_limit() if self.loaded else ev.get("context"))
        # an error: no count (the chat is far too long, a model without tokenizer); the estimate stays

    def _launch(self) -> None:
        self._waiting = False
        gen = self._gen
        history = [{"role": m.role, "content": m.content} for m in self.store.messages(self.conversation_id)
                   if m.id != gen["message_id"]]
        request = self._request(history)
        gen["widget"].footer.setText("thinking…")
        gen["prompt"] = next((m["content"] for m in reversed(history) if m["role"] == "user"), "")
        if self.loaded.offers.local:   # a server's answer does not run on this machine's CPU
            gen["meter"] = CpuMeter([self.session.worker_pid()]).start()
        gen["model"] = self.session.answer_model()      # who writes it, kept with its stats
        gen["widget"].set_author(None, self.session.display_name)
        gen["id"] = self.worker.generate(**request, settings={**self.generation_settings(), **gen["overrides"]},
                                         on_event=functools.partial(self._on_answer_event, gen))

    def _on_answer_event(self, gen: dict, ev: dict) -> None:
        if self._gen is not gen:
            return
        if ev.get("event") in ("done", "error"):
            self._finish(ev)
        elif ev.get("event") == "tokens":
            self._on_tokens(gen, ev)

    def _on_tokens(self, gen: dict, ev: dict) -> None:
        if gen["conversation_id"] == self.conversation_id:
            gen["widget"].append_spans(ev.get("spans") or [])
            gen["widget"].footer.setText(f"{ev.get('generated', 0)} tokens…")
        else:
            gen.setdefault("late_spans", []).extend(ev.get("spans") or [])
            return                       # the panel describes the chat on screen, not this one
        self.panel.update_live(ev)

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
        if stats and gen.get("model"):
            stats = {**stats, "model": gen["model"]}
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
                self.view.add_error(ev, self.loaded, action=("Drop the oldest turns and retry",
                                                                self.drop_oldest_and_retry))
            elif is_error:
                self.view.add_error(ev, self.loaded, action=self.session.other_engine_way_out(ev))
            self.view.mark_last()
        self.view.set_busy(False)
        if is_error and ev.get("code") == "prompt_too_long":
            self.statusMessage.emit("This chat no longer fits the model's context: drop its oldest turns, or start "
                                    "a new chat.")
        elif is_error:
            self.statusMessage.emit(f"Error: {ev.get('message', '')}")
        elif stats and visible:
            context = self._context(stats, text=text, prompt=gen.get("prompt", ""), token_ids=ev.get("token_ids"))
            self.panel.set_stats(stats, context, subject=f"The last answer — {author_text(stats)}",
                                 baseline=self.session.baseline_of(gen.get("model")))
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
                           self.loaded)
            return
        oldest = [m.id for m in messages if m.id < users[1].id]
        self.store.delete_messages(oldest)
        if failed is not None:
            self.store.new_version(failed.id, retry_prompt)
        kept = self.store.messages(self.conversation_id)
        self.view.load(kept, conv.system_prompt if conv else "", self.loaded)
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
        trained = self.session.pair.thinking if self.session.pair else None
        thinking = self.view.thinking.isChecked() if self.view.thinking.isVisible() else None
        return {"cpu_other": stats.get("cpu_other"), "cpu_wall_s": stats.get("cpu_wall_s"), "text": text, "prompt": prompt, "token_ids": token_ids,
                "chat_template": self.loaded.chat_template if self.loaded else None,
                "thinking_mismatch": trained is not None and thinking is not None and thinking != trained,
                "drafter_training": drafter_training(self.session.pair.id) if self.session.pair else None}
