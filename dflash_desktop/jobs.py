"""One owner for the engine: loads, generations and unloads from the chat, the speedup demo and the local
server all go through one first-in-first-out queue, one job at a time.

The worker refuses a second generation with `busy`; a window that also serves other programs would hit
that all the time. Here a job waits its turn instead, can be cancelled while it waits (it then ends with
the same final event a cancelled request gets from the worker), and its events go to the caller that
submitted it. Qt-free and thread-safe: the server submits from its event loop, the window from the GUI
thread, and events arrive on the worker client's reader thread.

`count_tokens` is not queued: it only reads the tokenizer, the worker answers it beside a running
generation, and the context meter must follow typing while an answer streams; behind a long answer it
would arrive after the text it counted had changed. Its events belong to no job and reach `on_event`.
"""
from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable

from engine import protocol as P

QUEUED = ("load_pair", "generate", "unload")
EventCallback = Callable[[dict], None]


@dataclass(eq=False)
class Job:
    id: str
    cmd: str
    fields: dict
    owner: str                            # "app", "server", ...: shown in the window, never interpreted
    on_event: EventCallback | None        # None: the queue's own listener gets the events
    backend: object | None = None         # None: whichever backend holds the loaded pair when it starts
    state: str = "queued"                 # queued, running, finished
    final: dict | None = None
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait(self, timeout: float | None) -> dict:
        """The job's terminal event (done, loaded, ok or error); timeout None waits as long as it takes."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"No answer to {self.id} within {timeout} s")
        return self.final


class JobQueue:
    """Runs QUEUED commands one at a time on `backend` (a WorkerClient, or anything with its `request`,
    `cancel` and `pair_info`, whose events are fed to `intake`). `on_event` gets the events of jobs
    submitted without a callback and the backend's events that belong to no job; `on_change()` is called
    whenever a job is queued, starts or ends."""

    def __init__(self, backend=None, on_event: EventCallback | None = None,
                 on_change: Callable[[], None] | None = None):
        self.backend = backend
        self._on_event = on_event or (lambda ev: None)
        self._on_change = on_change or (lambda: None)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._queue: list[Job] = []
        self._running: Job | None = None
        self._jobs: dict[str, Job] = {}     # id -> job, while queued or running
        self.finished: collections.deque[Job] = collections.deque(maxlen=32)   # the latest, newest last

    # -- submitting ---------------------------------------------------------------------------------
    def submit(self, cmd: str, owner: str = "app", on_event: EventCallback | None = None, backend=None,
               **fields) -> Job:
        if cmd not in QUEUED:
            raise ValueError(f"{cmd} is not a queued command ({', '.join(QUEUED)})")
        job = Job(f"{owner}-{cmd}-{next(self._ids)}", cmd, fields, owner, on_event, backend)
        with self._lock:
            self._queue.append(job)
            self._jobs[job.id] = job
        self._on_change()
        self._pump()
        return job

    def cancel(self, job_id: str | None) -> bool:
        """Stop a job: a queued one ends at once (a generation with `done` cancelled, a load or unload with
        `error` cancelled); a running one is cancelled on its backend and ends as the backend says. None
        means the running job. False when no such job is queued or running."""
        with self._lock:
            job = self._running if job_id is None else self._jobs.get(job_id)
            if job is None:
                return False
            if job.state == "queued":
                self._queue.remove(job)
                del self._jobs[job.id]
            backend = job.backend
        if job.state == "running":
            backend.cancel(job.id)
            return True
        if job.cmd == "generate":
            final = {"event": "done", "id": job.id, "stop_reason": "cancelled", "text": "", "token_ids": [],
                     "stats": None}
        else:
            final = P.error_event("cancelled", f"The {job.cmd} was cancelled before it started.", job.id)
        self._end(job, final)
        self._on_change()
        return True

    # -- state ----------------------------------------------------------------------------------------
    @property
    def running(self) -> Job | None:
        return self._running

    @property
    def queued(self) -> list[Job]:
        with self._lock:
            return list(self._queue)

    @property
    def busy(self) -> bool:
        """A generation is queued or running."""
        with self._lock:
            return any(j.cmd == "generate" for j in self._jobs.values())

    @property
    def pair_info(self) -> dict | None:
        return getattr(self.backend, "pair_info", None)

    # -- events -------------------------------------------------------------------------------------
    def intake(self, event: dict) -> None:
        """A backend's event (any thread): to the job it belongs to, else to the queue's listener."""
        with self._lock:
            job = self._jobs.get(event.get("id"))
        if job is None:
            self._on_event(event)
            return
        if not P.is_terminal(event):
            self._deliver(job, event)
            return
        with self._lock:
            self._jobs.pop(job.id, None)
            if self._running is job:
                self._running = None
            if event.get("event") == "loaded":
                self.backend = job.backend   # the pair now lives there: later jobs go to it
        self._end(job, event)
        self._on_change()
        self._pump()

    def _deliver(self, job: Job, event: dict) -> None:
        (job.on_event or self._on_event)(event)

    def _end(self, job: Job, final: dict) -> None:
        job.state, job.final = "finished", final
        self.finished.append(job)
        self._deliver(job, final)
        job._finished.set()

    def _pump(self) -> None:
        """Start the next job when none runs. The backend may answer at once (a request it cannot send),
        which calls intake and _pump again from inside request: the lock is re-entrant and a job is marked
        running before it is sent, so each job starts exactly once."""
        with self._lock:
            if self._running is not None or not self._queue:
                return
            job = self._queue.pop(0)
            job.backend = job.backend or self.backend
            job.state, self._running = "running", job
        self._on_change()
        job.backend.request(job.cmd, id=job.id, **job.fields)
