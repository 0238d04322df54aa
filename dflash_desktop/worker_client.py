"""The GUI side of the engine worker, free of Qt so it can be tested and scripted on its own.

It starts the worker as a subprocess (never importing torch here), writes commands as JSON lines,
reads events on a background thread and hands each one to a callback. When the worker dies, every
request still in flight gets an error event that says why, and the next request starts a new worker
and reloads the last pair, so a crash costs one answer, not the session.
"""
from __future__ import annotations

import collections
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from engine import protocol as P

from .logs import WorkerLog

EventCallback = Callable[[dict], None]
_SOURCE_ROOT = Path(__file__).resolve().parent.parent
_RESULTS_KEPT = 256
# what runs on the worker's job thread: their events (progress, tokens) show that thread is alive
LONG_JOBS = ("load_pair", "generate", "unload")


def worker_command(frozen: bool | None = None, executable: str | None = None) -> list[str]:
    """How to start the worker: a frozen app runs itself with --worker (see worker_entry), a source
    checkout runs the same interpreter with -m. Never a PATH lookup for 'python'."""
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    exe = executable or sys.executable
    return [exe, "--worker"] if frozen else [exe, "-m", "engine.worker"]


def worker_env(base: dict | None = None, frozen: bool | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    if not frozen and (_SOURCE_ROOT / "engine" / "protocol.py").is_file():
        # the worker must find `engine` even when the app was started from another folder
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SOURCE_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def describe_exit(returncode: int | None, started: bool) -> str:
    """A plain-language reason for a worker's death, from its exit status."""
    sig = signal_name(returncode)
    if sig == "SIGKILL":
        return ("The engine process was killed (SIGKILL). This usually means the computer ran out of memory; "
                "try a smaller model or close other programs.")
    if sig in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT") or returncode in (0xC0000005, -1073741819):
        return (f"The engine process crashed ({sig or 'access violation'}) inside a native library "
                "(CUDA, Metal or llama.cpp).")
    if sig:
        return f"The engine process was stopped by {sig}."
    if not started:
        return f"The engine process could not start (exit code {returncode})."
    return f"The engine process exited unexpectedly (exit code {returncode})."


class _Proc:
    """One worker process and what we know about it."""

    def __init__(self, popen: subprocess.Popen, tail_lines: int):
        self.popen = popen
        self.pid = popen.pid
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.hello_id: str | None = None
        self.started = False           # the handshake succeeded
        self.expected_exit = False     # we asked it to stop
        self.failure: tuple[str, str] | None = None  # (code, message) when we killed it on purpose
        self.load_timers: dict[str, threading.Timer] = {}  # load_pair id -> its silence check
        self.last_heard = time.monotonic()   # its job thread's last event: a load is overdue after silence only
        self.stderr_thread: threading.Thread | None = None
        self.reader: threading.Thread | None = None


class WorkerClient:
    """Thread-safe; every method returns at once. Events reach `on_event` on a background thread.

    A worker that does not answer `hello` within `start_timeout` seconds, or that says nothing for
    `load_timeout` seconds while a load_pair is pending (an import or a file read that hangs), is killed and
    reported, so no request waits for ever; the next request starts a fresh worker. A load that keeps
    reporting progress (a first load comparing engines on a busy CPU) runs as long as it needs."""

    def __init__(self, on_event: EventCallback | None = None, command: list[str] | None = None,
                 env: dict | None = None, start_timeout: float = 60.0, log_path: Path | None = None,
                 stderr_tail: int = 40, app_version: str | None = None, load_timeout: float = 600.0):
        self._on_event = on_event or (lambda ev: None)
        self._command = list(command) if command else worker_command()
        self._env = env if env is not None else worker_env()
        self._start_timeout = start_timeout
        self._load_timeout = load_timeout
        self._tail_lines = stderr_tail
        self._app_version = app_version
        self._log = WorkerLog(log_path)
        self._lock = threading.RLock()         # process state and the stdin pipe
        self._cond = threading.Condition()     # finished requests, for wait()
        self._proc: _Proc | None = None
        self._ids = itertools.count(1)
        self._pending: dict[str, tuple[str, _Proc, bool]] = {}   # id -> (cmd, process, internal)
        self._results: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._load_args: dict[str, dict] = {}
        self._last_pair: dict | None = None    # load_pair fields of the pair the worker holds (reloaded after a crash)
        self.pair_info: dict | None = None     # the `loaded` event of that pair, None when nothing is loaded
        self.hello_info: dict | None = None
        self._spawn_error = ""

    # -- public API ---------------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self._log.path

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc else None

    @property
    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.popen.poll() is None

    @property
    def busy(self) -> bool:
        """A generate request is in flight."""
        with self._lock:
            return any(cmd == "generate" for cmd, _, _ in self._pending.values())

    def start(self) -> None:
        """Start the worker now (otherwise the first request does)."""
        with self._lock:
            self._ensure_worker("start")

    def load_pair(self, target: str | Path, draft: str | Path | None = None, engine: str = "torch",
                  device: str = "auto", dtype: str | None = None, compare: bool | list[str] = False) -> str:
        """compare: the engine is the app's plan, not the user's pick, so the worker may run the pair with another
        engine that a first load here measured faster (engine/fastest.py): any engine (True), or those listed."""
        return self.request("load_pair", id=self._next_id("load"), target=str(target),
                            draft=str(draft) if draft else None, engine=engine, device=device, dtype=dtype,
                            **({"compare": compare} if compare else {}))

    def generate(self, messages: list[dict] | None = None, prompt: str | None = None,
                 prompt_ids: list[int] | None = None, settings: dict | None = None, mode: str = "dflash",
                 raw: bool = False, enable_thinking: bool | None = None) -> str:
        fields: dict[str, Any] = {"settings": settings or {}, "mode": mode, "raw": raw,
                                  "enable_thinking": enable_thinking}
        for key, value in (("messages", messages), ("prompt", prompt), ("prompt_ids", prompt_ids)):
            if value is not None:
                fields[key] = value
        return self.request("generate", **fields)

    def cancel(self, target_id: str | None = None) -> str | None:
        """Stop a generation or a load (target_id None: the generation, else the load that runs). No worker,
        nothing to cancel."""
        if not self.running:
            return None
        return self.request("cancel", target_id=target_id)

    def unload(self) -> str:
        return self.request("unload")

    def hardware(self) -> str:
        return self.request("hardware")

    def count_tokens(self, messages: list[dict] | None = None, prompt: str | None = None, raw: bool = False,
                     enable_thinking: bool | None = None) -> str:
        """How many tokens generate() would feed the model for this prompt; answered with a `count` event."""
        fields: dict[str, Any] = {"raw": raw, "enable_thinking": enable_thinking}
        fields.update({k: v for k, v in (("messages", messages), ("prompt", prompt)) if v is not None})
        return self.request("count_tokens", **fields)

    def request(self, cmd: str, **fields) -> str:
        """Send any protocol command; returns its id. Starts (or restarts) the worker when needed."""
        rid = fields.pop("id", None) or self._next_id(cmd)
        if cmd == "load_pair":  # the pair to reload after a crash, once the worker says it loaded
            self._load_args[rid] = fields
        with self._lock:
            proc = self._ensure_worker(cmd)
            if proc is None:  # could not even spawn: the error event is already out
                self._finish(P.error_event("worker_start_failed", self._spawn_error, rid))
                return rid
            self._send(proc, {"cmd": cmd, "id": rid, **fields}, internal=False)
        return rid

    def wait(self, request_id: str, timeout: float) -> dict:
        """Block until the request's terminal event (done, loaded, ok, hardware, hello or error)."""
        with self._cond:
            if not self._cond.wait_for(lambda: request_id in self._results, timeout):
                raise TimeoutError(f"No answer to {request_id} within {timeout} s")
            return self._results.pop(request_id)

    def shutdown(self, timeout: float = 10.0) -> int | None:
        """Ask the worker to stop; kill it if it has not exited within `timeout`. Returns its exit code."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return None
            proc.expected_exit = True
            self._send(proc, {"cmd": "shutdown", "id": self._next_id("shutdown")}, internal=True)
        try:
            proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(5)
        if proc.reader and proc.reader is not threading.current_thread():
            proc.reader.join(timeout)
        return proc.popen.returncode

    close = shutdown

    # -- process management -------------------------------------------------------------------------
    def _next_id(self, cmd: str) -> str:
        return f"{cmd}-{next(self._ids)}"

    def _ensure_worker(self, cmd: str) -> _Proc | None:
        proc = self._proc
        if proc is not None and proc.popen.poll() is None:
            return proc
        if cmd == "shutdown":
            return None
        proc = self._spawn()
        if proc is None:
            return None
        proc.hello_id = f"auto-hello-{next(self._ids)}"
        self._send(proc, {"cmd": "hello", "id": proc.hello_id, "protocol": P.PROTOCOL_VERSION,
                          "app_version": self._app_version}, internal=True)
        if self._last_pair and cmd == "generate":  # a fresh worker after a crash: reload what was loaded
            rid = f"auto-reload-{next(self._ids)}"
            self._load_args[rid] = self._last_pair
            self._send(proc, {"cmd": "load_pair", "id": rid, **self._last_pair}, internal=True)
        return proc

    def _spawn(self) -> _Proc | None:
        self._spawn_error = ""
        flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if sys.platform == "win32" else 0
        try:
            popen = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=self._env, creationflags=flags)
        except OSError as exc:
            self._spawn_error = f"The engine process could not be started: {exc} (command: {self._command})."
            self._log.write(self._spawn_error)
            return None
        proc = _Proc(popen, self._tail_lines)
        self._proc = proc
        self._log.write(f"started worker: {' '.join(self._command)}", popen.pid)
        proc.stderr_thread = threading.Thread(target=self._read_stderr, args=(proc,), daemon=True,
                                              name=f"worker-stderr-{proc.pid}")
        proc.reader = threading.Thread(target=self._read_events, args=(proc,), daemon=True,
                                       name=f"worker-events-{proc.pid}")
        proc.stderr_thread.start()
        proc.reader.start()
        timer = threading.Timer(self._start_timeout, self._check_started, args=(proc,))
        timer.daemon = True
        timer.start()
        self._deliver({"event": "worker_started", "id": None, "pid": proc.pid, "command": self._command,
                       "log_path": str(self.log_path)})
        return proc

    def _send(self, proc: _Proc, msg: dict, internal: bool) -> None:
        """Write one command. One that cannot be written as JSON ends at once with `bad_message`, since the
        worker never sees it; a failed write means the process is dying, and the reader reports that."""
        try:
            line = P.encode(msg)
        except (ValueError, TypeError, RecursionError) as exc:  # NaN, an object JSON cannot hold, a cycle
            self._finish(P.error_event(
                "bad_message", f"The {msg['cmd']} request could not be sent: {exc}. Pass plain JSON values "
                "(text, finite numbers, lists, dicts).", msg["id"]))
            return
        self._pending[msg["id"]] = (msg["cmd"], proc, internal)
        if msg["cmd"] == "load_pair":
            self._watch_load(proc, msg["id"])
        try:
            proc.popen.stdin.write(line)
            proc.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the process is dying; the reader reports it, this request included

    def _watch_load(self, proc: _Proc, rid: str, delay: float | None = None) -> None:
        timer = threading.Timer(self._load_timeout if delay is None else delay, self._load_overdue, args=(proc, rid))
        timer.daemon = True
        proc.load_timers[rid] = timer
        timer.start()

    def _load_overdue(self, proc: _Proc, rid: str) -> None:
        """A load that never answers (an import that hangs) would keep the app waiting for ever: once the job
        thread has said nothing for load_timeout seconds, stop the worker; _exited reports the load (and anything
        queued behind it) as `timeout`. A load that reported progress since gets the rest of a new window."""
        with self._lock:
            if self._pending.get(rid, (None, None))[1] is not proc:
                return  # answered just now
            silent = time.monotonic() - proc.last_heard
            if silent < self._load_timeout:
                self._watch_load(proc, rid, self._load_timeout - silent)
                return
            self._kill(proc, "timeout", f"The model's loading stopped making progress: the engine said nothing for "
                       f"{self._load_timeout:g} s, so it was stopped. Try again, try another model, or look in the "
                       "worker log for where it hung.")

    def _check_started(self, proc: _Proc) -> None:
        if not proc.started and proc.popen.poll() is None:
            proc.failure = ("worker_start_failed",
                            f"The engine process did not answer within {self._start_timeout:.0f} s and was stopped.")
            proc.popen.kill()

    def _kill(self, proc: _Proc, code: str, message: str) -> None:
        proc.failure = (code, message)
        proc.popen.kill()

    # -- reading ------------------------------------------------------------------------------------
    def _read_stderr(self, proc: _Proc) -> None:
        for raw in proc.popen.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            proc.tail.append(line)
            self._log.write(line, proc.pid)
        self._log.flush()

    def _read_events(self, proc: _Proc) -> None:
        for raw in proc.popen.stdout:
            try:
                event = P.decode(raw)
            except P.ProtocolError:
                self._log.write(f"not a protocol line on stdout: {raw[:200]!r}", proc.pid)
                continue
            self._handle(proc, event)
        try:
            returncode = proc.popen.wait(10)
        except subprocess.TimeoutExpired:  # stdout closed but still alive: it cannot talk to us anymore
            proc.popen.kill()
            returncode = proc.popen.wait(5)
        if proc.stderr_thread:
            proc.stderr_thread.join(2.0)  # keep the last lines (a traceback) for the report
        self._exited(proc, returncode)

    def _handle(self, proc: _Proc, event: dict) -> None:
        rid, kind = event.get("id"), event.get("event")
        if self._pending.get(rid, ("",))[0] in LONG_JOBS:   # the job thread at work: a cancel's `ok` is not
            proc.last_heard = time.monotonic()
        if rid is not None and rid == proc.hello_id:
            if kind == "hello" and event.get("protocol") == P.PROTOCOL_VERSION:
                proc.started = True
                self.hello_info = event
            else:
                message = event.get("message") or (
                    f"The engine speaks protocol {event.get('protocol')}, the app {P.PROTOCOL_VERSION}.")
                self._kill(proc, "version_mismatch", message)
                return
        self._track_pair(event)
        self._deliver(event)
        if P.is_terminal(event) and rid is not None:
            with self._lock:
                self._pending.pop(rid, None)
                timer = proc.load_timers.pop(rid, None)
            if timer is not None:
                timer.cancel()
            self._finish(event, deliver=False)

    def _track_pair(self, event: dict) -> None:
        """Follow the worker's pair from its answers alone, never from what was sent: `loaded` sets it, the
        `ok` to an unload clears it, and an error to a load or unload that ran says in `pair` what is left
        (null: nothing). A refusal (busy) changes nothing and carries no `pair`."""
        rid, kind = event.get("id"), event.get("event")
        released = kind == "error" and "pair" in event and event["pair"] is None
        if kind == "loaded" and rid in self._load_args:
            self._last_pair, self.pair_info = self._load_args[rid], event
        elif released or (kind == "ok" and event.get("cmd") == "unload"):
            self._last_pair, self.pair_info = None, None

    def _exited(self, proc: _Proc, returncode: int | None) -> None:
        with self._lock:
            if self._proc is proc:
                self._proc = None
            mine = {rid: v for rid, v in self._pending.items() if v[1] is proc}
            for rid in mine:
                del self._pending[rid]
            timers, proc.load_timers = list(proc.load_timers.values()), {}
        for timer in timers:
            timer.cancel()
        self._log.write(f"worker exited with {signal_name(returncode) or returncode}", proc.pid)
        self._log.flush()
        if proc.expected_exit and proc.failure is None:
            self.pair_info = None
            for rid in mine:
                self._finish(P.error_event("worker_stopped", "The engine was stopped.", rid), deliver=False)
            self._deliver({"event": "worker_stopped", "id": None, "pid": proc.pid, "exit_code": returncode})
            return
        code, message = proc.failure or (
            "worker_crashed" if proc.started else "worker_start_failed", describe_exit(returncode, proc.started))
        if self._last_pair:
            message += " Your next request starts a fresh engine and reloads the model."
        self.pair_info = None
        details = {"exit_code": returncode, "signal": signal_name(returncode), "pid": proc.pid,
                   "stderr_tail": list(proc.tail), "log_path": str(self.log_path)}
        users = [rid for rid, (_, _, internal) in mine.items() if not internal]
        for rid in mine:
            if rid not in users:
                self._finish(P.error_event(code, message, rid, **details), deliver=False)
        for rid in users or [None]:
            self._finish(P.error_event(code, message, rid, **details))

    def _finish(self, event: dict, deliver: bool = True) -> None:
        if deliver:
            self._deliver(event)
        rid = event.get("id")
        if rid is None:
            return
        self._load_args.pop(rid, None)
        with self._cond:
            self._results[rid] = event
            while len(self._results) > _RESULTS_KEPT:
                self._results.popitem(last=False)
            self._cond.notify_all()

    def _deliver(self, event: dict) -> None:
        try:
            self._on_event(event)
        except Exception as exc:  # noqa: BLE001 (a broken callback must not kill the reader thread)
            self._log.write(f"event callback failed: {exc!r}")


def _own_copy(event: dict) -> dict:
    copy = dict(event)
    copy.update(spans=[list(s) for s in event["spans"]], tokens=list(event["tokens"]),
                drafted=list(event["drafted"]), steps=list(event["steps"]))
    return copy


def _extend_tokens(into: dict, later: dict) -> None:
    spans = into["spans"]
    for text, drafted in later["spans"]:
        if spans and spans[-1][1] == drafted:
            spans[-1][0] += text
        else:
            spans.append([text, drafted])
    for key in ("tokens", "drafted", "steps"):
        into[key].extend(later[key])
    into.update((k, v) for k, v in later.items() if k not in ("spans", "tokens", "drafted", "steps"))


def merge_tokens(first: dict, second: dict) -> dict:
    """Fold a later `tokens` event of the same request into an earlier one: lists concatenate, running
    totals (generated, elapsed_s) take the later value, and adjacent spans with the same drafted flag join."""
    merged = _own_copy(first)
    _extend_tokens(merged, second)
    return merged


def coalesce_into(buffer: list[dict], event: dict) -> None:
    """Append an event to a pending batch, merging it into the last one when both are token chunks of
    the same request. Order is kept and nothing is dropped: only neighbours merge. Token events in the
    buffer are private copies, so merging in place never touches an event someone else holds."""
    last = buffer[-1] if buffer else None
    if event.get("event") != "tokens":
        buffer.append(event)
    elif last is not None and last.get("event") == "tokens" and last.get("id") == event.get("id"):
        _extend_tokens(last, event)
    else:
        buffer.append(_own_copy(event))
