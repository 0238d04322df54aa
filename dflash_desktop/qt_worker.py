"""Qt face of the engine: the job queue (jobs.py) in front of the worker client, or of a remote server
(remote.py) once one is loaded; events become queued signals on the GUI thread.

A caller may pass ``on_event`` with a command: that job's events (its terminal one last) then also reach
that callback, on the GUI thread and in order, so a caller never matches ids by hand. Every event is still
emitted as a signal for listeners that watch everything (the jobs indicator, the speedup demo).

Token chunks are batched so the window repaints at most about 60 times a second however fast the
engine commits: events wait in a buffer (neighbouring chunks of one request merged) and a single-shot
timer flushes the buffer no more often than every `min_interval_ms`. Nothing is dropped or reordered.
"""
from __future__ import annotations

import functools
import threading
import time

from typing import Callable

import shiboken6
from PySide6.QtCore import QObject, Qt, QTimer, Signal

from engine import protocol as P

from .jobs import JobQueue
from .offers import Offers
from .worker_client import WorkerClient, coalesce_into


class QtWorker(QObject):
    event = Signal(dict)          # every event, in order (after merging token chunks)
    hello = Signal(dict)          # handshake answered: protocol, app_version, pid
    progress = Signal(dict)       # load stages: import, weights, ready
    loaded = Signal(dict)         # a pair is ready (name, block_size, device, dtype, load_s...)
    tokens = Signal(dict)         # text spans with drafted flags, token ids, per-step [proposed, accepted]
    done = Signal(dict)           # a generation ended: stop_reason, text, token_ids, stats
    error = Signal(dict)          # code, message (+ exit_code, signal, stderr_tail, log_path on a crash)
    warning = Signal(dict)        # code, message; the request goes on
    hardware = Signal(dict)       # what the engine sees: torch, CUDA devices, MPS, CPU threads
    counted = Signal(dict)        # count_tokens answered: tokens, context
    ok = Signal(dict)             # cancel, unload or shutdown acknowledged
    workerStarted = Signal(dict)  # a worker process was spawned (pid, command, log_path)
    workerStopped = Signal(dict)  # the worker exited after shutdown()
    jobs = Signal(dict)           # the queue changed: running (owner, cmd, id or None), queued per owner

    _wake = Signal()

    _ROUTES = {"hello": "hello", "progress": "progress", "loaded": "loaded", "tokens": "tokens", "done": "done",
               "error": "error", "warning": "warning", "hardware": "hardware", "count": "counted", "ok": "ok",
               "worker_started": "workerStarted", "worker_stopped": "workerStopped", "jobs": "jobs"}

    def __init__(self, parent: QObject | None = None, min_interval_ms: int = 16, **client_options):
        super().__init__(parent)
        self._interval_ms = min_interval_ms
        self._buffer: list[dict] = []
        self._buffer_lock = threading.Lock()
        self._last_flush = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._flush)
        self._wake.connect(self._schedule, Qt.ConnectionType.QueuedConnection)
        self.flushes = 0  # how many batches reached the GUI (tests and diagnostics)
        self._handlers: dict[str, Callable[[dict], None]] = {}   # request id -> its caller's callback (GUI thread)
        self.queue = JobQueue(on_event=self._intake, on_change=self._queue_changed)
        self.client = WorkerClient(on_event=self.queue.intake, **client_options)
        self.queue.backend = self.client

    # -- commands: each returns the request id at once --------------------------------------------------
    def start(self) -> None:
        self.client.start()

    def _handled(self, rid: str | None, on_event: Callable[[dict], None] | None) -> str | None:
        """Register ``on_event`` (a bound method, or a functools.partial of one) for ``rid``. The GUI thread
        submits and flushes, so no event of the job can be delivered before this runs, even one the queue
        answered at once."""
        if rid is not None and on_event is not None:
            self._handlers[rid] = on_event
        return rid

    @staticmethod
    def _receiver_alive(handler: Callable[[dict], None]) -> bool:
        """The worker outlives windows: a handler whose QObject was deleted is dropped, as Qt drops the
        connections of a deleted receiver."""
        func = handler.func if isinstance(handler, functools.partial) else handler
        owner = getattr(func, "__self__", None)
        return not isinstance(owner, QObject) or shiboken6.isValid(owner)

    def load_pair(self, target, draft=None, engine: str = "torch", device: str = "auto",
                  dtype: str | None = None, on_event: Callable[[dict], None] | None = None,
                  compare: bool | list[str] = False) -> str:
        job = self.queue.submit("load_pair", backend=self.client, target=str(target),
                                draft=str(draft) if draft else None, engine=engine, device=device, dtype=dtype,
                                **({"compare": compare} if compare else {}))
        return self._handled(job.id, on_event)

    def load_remote(self, base_url: str, api_key: str = "", model: str | None = None,
                    on_event: Callable[[dict], None] | None = None) -> str:
        """Chat with an OpenAI-compatible server from now on; the local engine is stopped once it answers."""
        from .remote import RemoteClient
        remote = RemoteClient(on_event=self.queue.intake)
        job = self.queue.submit("load_pair", backend=remote, target=base_url, api_key=api_key, model=model)
        return self._handled(job.id, on_event)

    def generate(self, on_event: Callable[[dict], None] | None = None, **kwargs) -> str:
        return self._handled(self.queue.submit("generate", **kwargs).id, on_event)

    def cancel(self, target_id: str | None = None) -> bool:
        """Stop a queued or running job (None: the running one)."""
        return self.queue.cancel(target_id)

    def unload(self, on_event: Callable[[dict], None] | None = None) -> str:
        return self._handled(self.queue.submit("unload").id, on_event)

    def request_hardware(self) -> str:
        return self.client.hardware()

    def count_tokens(self, on_event: Callable[[dict], None] | None = None, **kwargs) -> str | None:
        """Ask the local worker to count a prompt as generate would (client.count_tokens); answered by
        `counted`. None, and nothing sent, when no local pair is loaded (none, or a remote one): the caller
        keeps its own estimate, and no worker is started just to count."""
        if self.queue.backend is not self.client or self.client.pair_info is None or not self.client.running:
            return None
        return self._handled(self.client.count_tokens(**kwargs), on_event)

    def shutdown(self, timeout: float = 5.0) -> int | None:
        """Stop the worker (blocks up to `timeout`, then kills it); call from aboutToQuit."""
        return self.client.shutdown(timeout)

    @property
    def busy(self) -> bool:
        """A generation is queued or running, from any caller."""
        return self.queue.busy

    @property
    def running(self) -> bool:
        """The local worker process is up."""
        return self.client.running

    @property
    def pair_info(self) -> dict | None:
        return self.queue.pair_info

    @property
    def log_path(self):
        return self.client.log_path

    # -- delivery -----------------------------------------------------------------------------------
    def _queue_changed(self) -> None:
        running = self.queue.running
        queued: dict[str, int] = {}
        for job in self.queue.queued:
            queued[job.owner] = queued.get(job.owner, 0) + 1
        self._intake({"event": "jobs", "id": None, "queued": queued, "running": running and {
            "owner": running.owner, "cmd": running.cmd, "id": running.id}})

    def _intake(self, event: dict) -> None:
        """Any thread: buffer the event and wake the GUI thread if the buffer was empty."""
        if event.get("event") == "loaded" and not Offers.of(event).local and self.client.running:
            # a remote pair: the local engine's memory goes back to the computer (it restarts on a local load)
            threading.Thread(target=self.client.shutdown, name="worker-release", daemon=True).start()
        with self._buffer_lock:
            wake = not self._buffer
            coalesce_into(self._buffer, event)
        if wake:
            self._wake.emit()

    def _schedule(self) -> None:
        if self._timer.isActive():
            return
        since_ms = (time.monotonic() - self._last_flush) * 1000.0
        self._timer.start(max(0, int(self._interval_ms - since_ms + 0.999)))

    def _flush(self) -> None:
        with self._buffer_lock:
            events, self._buffer = self._buffer, []
        self._last_flush = time.monotonic()
        if not events:
            return
        self.flushes += 1
        for event in events:
            self.event.emit(event)
            handler = self._handlers.get(event.get("id"))
            if handler is not None:
                if P.is_terminal(event):
                    del self._handlers[event["id"]]
                if self._receiver_alive(handler):
                    handler(event)
            route = self._ROUTES.get(event.get("event"))
            if route:
                getattr(self, route).emit(event)
