"""The engine worker: a separate process that owns the models, so a crash or a long step in torch can
never freeze or kill the window. Commands arrive on stdin and events leave on stdout, one JSON object
per line (engine/protocol.py, docs/PROTOCOL.md); everything else, logs included, goes to stderr.

Threads: the main thread reads commands, so `cancel` is seen while a generation runs; one executor
thread runs load/generate/unload in arrival order. Engine libraries are imported lazily (on the
executor, by the first request that needs them), so `hello` answers at once, a pair llama.cpp runs from its
GGUF alone (the chat pair) never loads PyTorch, and a broken install becomes an error event.

Run it as `python -m engine.worker`, or, in a frozen app, as `<app> --worker`.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from engine import packs
from engine import protocol as P
from engine.errors import Cancelled, EngineError
from engine.stats import cuda_memory

log = logging.getLogger("engine.worker")


class EngineUnavailable(Exception):
    code = "engine_unavailable"


DEFAULT_ENGINE = "torch"


def app_version() -> str:
    try:
        from importlib.metadata import version
        return version("dflash-desktop")
    except Exception:  # noqa: BLE001 (running from a source tree that was never installed)
        return "0+source"


def claim_stdout():
    """Keep fd 1 for the protocol only: dup it for our writer, then point fd 1 (and sys.stdout) at
    stderr, so stray prints from Python or C libraries land in the log instead of corrupting the pipe."""
    if sys.stderr is None:  # a windowed (no console) frozen app starts without Python-level std streams
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "wb", buffering=0)


def load_engine(name: str = DEFAULT_ENGINE) -> SimpleNamespace:
    """Import the loop and an engine's package on demand; any failure becomes one clear error instead of
    a dead worker."""
    try:
        from engine import backends, limits, loop
        importlib.import_module(backends.engine_info(name).package + ".engine")
    except BaseException as exc:  # ImportError, OSError for a broken native library, even a SystemExit at
        # import; this never runs on the main thread, so no KeyboardInterrupt is swallowed here
        in_use = packs.current().active
        remedy = (f"Delete the engine pack folder {Path(in_use[0]['path']).parent} (the built-in engine then runs), "
                  "or install the pack again" if in_use else "Reinstall the app")
        raise EngineUnavailable(
            f"The {name} engine's libraries could not be loaded ({type(exc).__name__}: {exc}). "
            f"{remedy}, or check the worker log for details.") from exc
    return SimpleNamespace(backends=backends, limits=limits, loop=loop)


def hardware_info() -> dict:
    """What this process can run on, as each engine sees it (not a guess from the GUI side)."""
    import platform
    eng = load_engine()
    return {"engines": {name: eng.backends.describe(name) for name in eng.backends.ENGINES},
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "engine_packs": packs.current().describe()}


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


class Worker:
    def __init__(self, out):
        self._out, self._out_lock = out, threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()          # guards the generation and load slots below
        self._gen_id: str | None = None        # generate request queued or running
        self._generation = None
        self._loads: list[str] = []            # load_pair requests queued or running, in arrival order
        self._cancelled: set[str] = set()
        self.pair, self.costs = None, None     # the loaded pair and its plain step costs (engine.loop.StepCosts)
        self.pair_info: dict | None = None
        self._executor = threading.Thread(target=self._run_jobs, name="executor", daemon=True)

    # -- output -------------------------------------------------------------------------------------
    def emit(self, event: dict) -> None:
        data = P.encode(event)
        with self._out_lock:
            try:
                self._out.write(data)
            except (BrokenPipeError, OSError):
                pass  # the GUI is gone; stdin EOF will end us

    def error(self, request_id, code: str, message: str, **extra) -> None:
        log.info("error %s for %s: %s", code, request_id, message)
        self.emit(P.error_event(code, message, request_id, **extra))

    # -- main loop ----------------------------------------------------------------------------------
    def serve(self, stdin) -> int:
        self._executor.start()
        for raw in lines(stdin):
            if not raw.strip():
                continue
            if self.handle(raw) == "shutdown":
                return 0
        log.info("stdin closed: the GUI went away, stopping")
        self._stop(wait_s=2.0)
        return 0

    def handle(self, raw: bytes) -> str | None:
        try:
            msg = P.decode(raw)
        except P.ProtocolError as exc:
            self.error(None, exc.code, str(exc))
            return None
        rid = msg.get("id") if isinstance(msg.get("id"), str) else None
        try:
            P.validate_command(msg)
        except P.ProtocolError as exc:
            self.error(rid, exc.code, str(exc))
            return None
        cmd, rid = msg["cmd"], msg.get("id")
        if cmd == "hello":
            return self._hello(msg)
        if cmd == "cancel":
            return self._cancel(msg)
        if cmd == "hardware":
            threading.Thread(target=self._hardware, args=(rid,), daemon=True).start()
            return None
        if cmd == "count_tokens":
            threading.Thread(target=self._count_tokens, args=(msg,), daemon=True).start()
            return None
        if cmd == "shutdown":
            self._stop(wait_s=10.0)
            self.emit({"event": "ok", "id": rid, "cmd": "shutdown"})
            return "shutdown"
        with self._lock:  # load_pair, generate, unload: one at a time, never during a generation
            if self._gen_id is not None:
                self.error(rid, "busy", f"A generation ({self._gen_id}) is running; cancel it or wait for it to finish.",
                           active_id=self._gen_id)
                return None
            if cmd == "generate":
                self._gen_id = rid or ""
            elif cmd == "load_pair":
                self._loads.append(rid or "")
        self._jobs.put(msg)
        return None

    def _hello(self, msg):
        if msg["protocol"] != P.PROTOCOL_VERSION:
            self.error(msg.get("id"), "version_mismatch",
                       f"The app speaks protocol {msg['protocol']} but this engine speaks {P.PROTOCOL_VERSION}. "
                       "Reinstall the app so both parts come from the same version.",
                       worker_protocol=P.PROTOCOL_VERSION)
            return None
        self.emit({"event": "hello", "id": msg.get("id"), "protocol": P.PROTOCOL_VERSION,
                   "app_version": app_version(), "pid": os.getpid(), "frozen": bool(getattr(sys, "frozen", False)),
                   "pair": self.pair_info, "engine_packs": packs.current().describe()})
        return None

    def _cancel(self, msg):
        with self._lock:
            hit = self._cancel_target(msg.get("target_id"))
            if hit is not None:
                self._cancelled.add(hit)  # a load reads this between its stages, a queued one before it starts
                if hit == self._gen_id and self._generation is not None:
                    self._generation.cancel()
        self.emit({"event": "ok", "id": msg.get("id"), "cmd": "cancel", "cancelled": hit})
        return None

    def _cancel_target(self, target: str | None) -> str | None:
        """What a cancel stops (caller holds the lock): the named generate or load_pair while it is queued
        or running; with no name, the generation, else the load that runs (or runs next)."""
        if target is None:
            return self._gen_id if self._gen_id is not None else next(iter(self._loads), None)
        return target if target == self._gen_id or target in self._loads else None

    def _hardware(self, rid):
        self.emit(self._answer(rid, lambda: {"event": "hardware", "id": rid, **hardware_info()}))

    def _count_tokens(self, msg) -> None:
        """Answered beside the executor, also while an answer streams: a count only reads the tokenizer
        (thread-safe for encoding), never the model, so a user typing during an answer sees it at once."""
        rid, pair = msg.get("id"), self.pair

        def count() -> dict:
            if pair is None:
                raise P.ProtocolError("no_pair", "No model is loaded: load a pair before counting tokens.")
            return {"event": "count", "id": rid, "tokens": len(self._prompt_ids(pair, msg)),
                    "context": pair.max_positions}
        self.emit(self._answer(rid, count))

    def _stop(self, wait_s: float) -> None:
        """Cancel a running generation and wait for its `done`; a load is not waited for: its answer would
        go nowhere."""
        with self._lock:
            generating = self._gen_id is not None
            if generating:
                self._cancelled.add(self._gen_id)
                if self._generation is not None:
                    self._generation.cancel()
        self._jobs.put(None)
        # an idle executor ends at once on the None; a generation was cancelled above; a load is not waited for
        self._executor.join(wait_s if generating else 1.0)
        # the worker ends with os._exit, which runs no finalizer: child servers (llama.cpp) are stopped here,
        # so quitting the app leaves none behind (the death signal alone left one running after a self-test)
        if self.pair is not None and "close" in self.pair.capabilities and not self._executor.is_alive():
            self.pair.close()

    # -- executor -----------------------------------------------------------------------------------
    def _run_jobs(self) -> None:
        # no engine is imported before a request names one (a llama.cpp pair need never load PyTorch)
        while (msg := self._jobs.get()) is not None:
            rid, cmd = msg.get("id"), msg["cmd"]
            final = self._answer(rid, lambda: getattr(self, "_do_" + cmd)(msg))
            if cmd == "generate":  # free the slot before the answer, so an immediate retry is not busy
                with self._lock:
                    self._cancelled.discard(self._gen_id)
                    self._gen_id, self._generation = None, None
            elif cmd == "load_pair":
                final = self._settle_load(rid, final)
            if cmd in ("load_pair", "unload"):
                _trim_heap()    # the pairs it dropped are freed now (their last references were the request's)
                if final["event"] == "error":
                    final["pair"] = self.pair_info  # what is loaded now: the client learns it from answers only
            self.emit(final)

    def _answer(self, rid, work) -> dict:
        """Run one request to its final event, whatever it raises. BaseException too: a SystemExit from a
        library would otherwise end this thread silently, and every later request would wait for ever.
        Nothing here must propagate: this is never the main thread (KeyboardInterrupt goes there), and the
        process ends through the main thread's os._exit."""
        try:
            return work()
        except (P.ProtocolError, EngineUnavailable) as exc:
            return self._error_event(rid, exc.code, str(exc))
        except BaseException as exc:  # noqa: BLE001 (any engine failure is an error event, never a dead worker)
            return self._engine_failure(rid, exc)

    def _settle_load(self, rid, final: dict) -> dict:
        """Free a load's slot. A cancel acknowledged before this point wins even over a finished load, so
        an `ok` that names a load always means it ends with `cancelled` and nothing loaded."""
        key = rid or ""
        with self._lock:
            self._loads.remove(key)
            cancelled = key in self._cancelled
            self._cancelled.discard(key)
        if cancelled and final["event"] == "loaded":
            self._release()
            return self._error_event(rid, "cancelled", "Loading was cancelled; nothing is loaded.")
        return final

    def _error_event(self, rid, code: str, message: str) -> dict:
        log.info("error %s for %s: %s", code, rid, message)
        return P.error_event(code, message, rid)

    def _engine_failure(self, rid, exc: BaseException) -> dict:
        code = getattr(exc, "code", None) if isinstance(exc, Exception) else None  # not SystemExit's exit code
        if _is_oom(exc):
            gc.collect()
            return self._error_event(rid, "out_of_memory", f"Out of memory: {exc}. Try a smaller model, a shorter "
                                     "prompt, or fewer new tokens.")
        if isinstance(code, str) and code in P.ERROR_CODES:  # engine.errors.EngineError and friends
            event = {**self._error_event(rid, code, str(exc)), **_server_log(exc)}
            if code == "engine_crashed" and self.pair_info:   # the engine's own server died, the worker lives
                from engine.backends.choice import other_engines
                event["alternatives"] = other_engines(self.pair_info)
            elif getattr(exc, "alternatives", None):             # a load refused where another engine runs it
                event["alternatives"] = exc.alternatives
            return event
        log.error("unexpected failure in %s:\n%s", rid, traceback.format_exc())
        return self._error_event(rid, "internal", f"Unexpected {type(exc).__name__}: {exc}. "
                                 "Details are in the worker log.")

    def _progress(self, rid, stage: str, message: str) -> None:
        self.emit({"event": "progress", "id": rid, "stage": stage, "message": message})

    def _do_load_pair(self, msg) -> dict:
        rid, t0 = msg.get("id"), time.perf_counter()

        def cancelled() -> bool:  # the engine asks between stages
            return (rid or "") in self._cancelled
        if cancelled():
            raise Cancelled("Loading was cancelled before it started; the loaded model, if any, is unchanged.")
        from engine import fastest
        from engine.backends import choice
        engine = msg.get("engine") or DEFAULT_ENGINE
        target, draft, device = msg["target"], msg.get("draft"), msg.get("device") or "auto"
        picked = engine == "auto"
        if picked:
            engine = choice.auto_engine(target, device, draft)
        dtype, compare, cands, measured = msg.get("dtype"), msg.get("compare") or False, None, None
        if compare and device != "auto":          # the fastest engine here, when a first load measured it
            cands = self._candidates(engine, device, dtype, target, draft, compare)
            measured = fastest.remembered(cands, target, draft) if len(cands) > 1 else None
            if measured is not None:
                engine = measured["engine"]
        self._progress(rid, "import", "Loading the engine libraries")
        eng = load_engine(engine)                # a broken install is a clear error here, before anything unloads
        choice.check_files(engine, target, draft)              # a path no engine takes: refused, nothing unloads
        if not choice.keeps_loaded_pair(self.pair_info, engine, target, draft):
            self._release()                      # no room for both: on failure nothing is loaded

        def load(engine: str, device: str, dtype):
            return choice.load_chosen(engine, target, draft, device=device, dtype=dtype, cancelled=cancelled,
                                      may_fall_back=picked,
                                      progress=lambda stage, message: self._progress(rid, stage, message))
        try:
            if measured is not None:
                pair, engine, note, measured = self._measured_or_plan(load, measured, cands, target, draft)
            else:
                pair, engine, note = load(engine, device, dtype)
        except EngineError as exc:
            if exc.code == "unsupported_architecture":      # the way out: the engine here that runs it, if one is
                exc.alternatives = choice.runs_what_was_refused(msg, engine)
            raise
        if note:
            log.warning("%s", note)
        self._release()                          # the pair kept while this one loaded, if any
        if compare and measured is None and note is None and pair.tokenizer is not None:
            if cands is None:     # device "auto": the candidates are known once the planned engine found its device
                cands = self._candidates(engine, str(pair.info.get("device") or device), dtype, target, draft,
                                         compare)
                measured = fastest.remembered(cands, target, draft) if len(cands) > 1 else None
                if measured is not None and measured["engine"] != engine:
                    _close(pair)
                    pair, engine, note, measured = self._measured_or_plan(load, measured, cands, target, draft)
            if measured is None and note is None and len(cands) > 1:
                # a first load here: the engines that run it, timed (on prompts its tokenizer writes)
                pair, engine, measured = self._compare(rid, pair, cands, target, draft, cancelled)
        self._progress(rid, "ready", "Model ready")
        self.pair, self.costs = pair, eng.loop.StepCosts()    # plain step costs belong to this pair
        # what the window may ask of this pair (dflash_desktop/offers.py): a local engine offers it all
        self.pair_info = {**pair.info, "target": target, "draft": draft,
                          "offers": {"local": True, "baseline": True, "unload": True, "count_tokens": True}}
        if note:
            self.pair_info["engine_note"] = note
        if measured is not None:
            self.pair_info["engine_choice"] = measured
        return {"event": "loaded", "id": rid, **self.pair_info, "load_s": time.perf_counter() - t0,
                **cuda_memory(pair.memory())}

    @staticmethod
    def _candidates(engine: str, device: str, dtype, target, draft, allowed) -> list:
        """The planned engine and every other one built here that runs the pair on the same device class (of
        those allowed: `compare`'s list, the engines a catalog pair lists, or true: any)."""
        from engine import fastest
        from engine.backends import device_class_of
        cands = fastest.candidates(fastest.Candidate(engine, device, dtype), device_class_of(engine, device),
                                   target, draft)
        return [c for i, c in enumerate(cands) if i == 0 or allowed is True or c.engine in allowed]

    @staticmethod
    def _measured_or_plan(load, measured: dict, cands: list, target, draft):
        """The engine a first load here measured fastest; where it no longer loads (a changed install), the
        planned one (cands[0]) with a note, and the record is dropped so that the next load measures again.
        Returns (pair, engine, note, measured)."""
        from engine import fastest
        from engine.backends import ENGINES
        try:
            return (*load(measured["engine"], measured["device"], measured["dtype"]), measured)
        except Cancelled:
            raise
        except EngineError as exc:
            fastest.remember(cands, target, draft, None)
            plan = cands[0]
            pair, engine, _ = load(plan.engine, plan.device, plan.dtype)
            return pair, engine, (f"{ENGINES[measured['engine']].label}, measured fastest here before, could not "
                                  f"load this model now ({exc}), so the planned {ENGINES[engine].label} engine "
                                  "runs it."), None

    def _compare(self, rid, pair, cands: list, target, draft, cancelled):
        """Time every candidate against the loaded one and keep the fastest, remembered (engine/fastest.py)."""
        from engine import fastest
        from engine.backends import choice, load_pair

        def load(c):
            return load_pair(c.engine, target, draft, device=c.device, dtype=c.dtype, cancelled=cancelled,
                             progress=lambda stage, message: self._progress(rid, stage, message))
        together = all(c.device == "cpu" for c in cands) and choice.fits_in_memory([c.engine for c in cands], target,
                                                                                    draft)
        pair, chosen, measured = fastest.compare(pair, cands, load, _close, together,
                                                 lambda message: self._progress(rid, "compare", message), cancelled)
        fastest.remember(cands, target, draft, measured)
        return pair, chosen.engine, measured

    def _release(self) -> None:
        """Drop the loaded pair and give its memory back (device caches included)."""
        pair, self.pair, self.pair_info = self.pair, None, None
        _close(pair)

    def _do_unload(self, msg) -> dict:
        had = self.pair is not None
        self._release()
        return {"event": "ok", "id": msg.get("id"), "cmd": "unload", "unloaded": had}

    def _do_generate(self, msg) -> dict:
        rid = msg.get("id")
        if self.pair is None:
            raise P.ProtocolError("no_pair", "No model is loaded: load a pair before generating.")
        pair = self.pair
        eng = load_engine(pair.info["engine"])
        settings = eng.limits.GenerationSettings.from_dict(msg.get("settings") or {})
        ids = self._prompt_ids(pair, msg)
        baseline = msg.get("mode", "dflash") == "baseline"
        if not baseline and pair.block_size == 1:
            self.emit({"event": "warning", "id": rid, "code": "no_drafter",
                       "message": "No drafter is loaded: this runs plain decoding, without DFlash."})
        gen = eng.loop.Generation(pair, ids, settings, baseline=baseline, costs=self.costs)
        with self._lock:
            self._generation = gen
            if self._gen_id in self._cancelled:
                gen.cancel()
        return self._stream(rid, gen)

    def _prompt_ids(self, pair, msg) -> list[int]:
        """The token ids a generate (or count_tokens) command stands for: its prompt_ids, or its messages or
        prompt through the pair's tokenizer and chat template."""
        if msg.get("prompt_ids") is not None:
            vocab = int(pair.info.get("vocab_size") or 0)
            if vocab and any(i >= vocab for i in msg["prompt_ids"]):
                raise P.ProtocolError("bad_message", f"prompt_ids holds ids outside the model's vocabulary of {vocab} "
                                      f"tokens (the largest is {max(msg['prompt_ids'])}).")
            return msg["prompt_ids"]
        if pair.tokenizer is None:
            raise P.ProtocolError("bad_checkpoint", "The target folder has no tokenizer files, so text prompts "
                                  "cannot be encoded: send prompt_ids, or use a model folder with tokenizer.json.")
        rid = msg.get("id")
        messages = msg.get("messages") or [{"role": "user", "content": msg["prompt"]}]
        return pair.tokenizer.encode_chat(messages, raw=msg.get("raw", False), enable_thinking=msg.get("enable_thinking"),
                                          max_tokens=pair.max_positions, cancelled=lambda: rid in self._cancelled)

    def _stream(self, rid, gen) -> dict:
        t0, generated = time.perf_counter(), 0
        for step in gen:
            generated += len(step.tokens)
            if step.fallback:
                self.emit({"event": "warning", "id": rid, "code": "plain_fallback", "message": step.fallback["reason"]})
            if not (step.tokens or step.spans):
                continue
            self.emit({"event": "tokens", "id": rid, "spans": [[t, d] for t, d in step.spans],
                       "tokens": step.tokens, "drafted": step.drafted,
                       "steps": [[step.proposed, step.accepted]] if (step.tokens or step.proposed) else [],
                       "generated": generated, "elapsed_s": time.perf_counter() - (gen.started or t0)})
        return {"event": "done", "id": rid, "stop_reason": gen.stop_reason, "text": gen.text,
                "token_ids": gen.tokens, "stats": gen.stats.to_dict()}


def _close(pair) -> None:
    """Give a pair's memory back (device caches, and what it holds outside the process: llama.cpp's servers)."""
    release = pair.close if pair is not None and "close" in pair.capabilities else None
    del pair
    gc.collect()
    if release is not None:
        release()


def _trim_heap() -> None:
    """Hand the memory of dropped pairs back to the system: what waits in reference cycles, MLX's buffer cache, and
    the pages glibc keeps for reuse. After a first load's engine comparison the worker otherwise held 1.7 to 2.3 GB
    beside llama.cpp's server (docs/BENCHMARKS.md, "Worker memory")."""
    gc.collect()
    mlx = sys.modules.get("mlx.core")           # imported by the MLX engine only: never imported here
    if mlx is not None:
        mlx.clear_cache()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):      # a C library without it (musl)
            pass


def lines(stdin):
    """Command lines from stdin, each read with a bound: a line past protocol.MAX_LINE_BYTES is never held
    whole in memory; what was read of it is handed on (decode refuses it) and the rest is skipped."""
    while raw := stdin.readline(P.MAX_LINE_BYTES + 1):
        if len(raw) > P.MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := stdin.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
        yield raw


def _server_log(exc: BaseException) -> dict:
    """An engine server's last log lines and kept log (llama.cpp's ServerError), for the diagnostics."""
    lines, path = getattr(exc, "log_lines", None), getattr(exc, "log_path", None)
    return {**({"stderr_tail": list(lines)} if lines else {}), **({"log_path": str(path)} if path else {})}


def main(argv: list[str] | None = None) -> int:
    out = claim_stdout()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")  # the client's log adds the time
    logging.captureWarnings(True)
    log.info("worker %s starting (pid %d, protocol %d, python %s)", app_version(), os.getpid(),
             P.PROTOCOL_VERSION, sys.version.split()[0])
    chosen = packs.activate(packs.root_from_env())  # before the executor imports any engine library
    for pack in chosen.active:
        log.info("engine pack %s in use: %s", pack["name"], pack["path"])
    for note in chosen.notes:
        log.warning("%s", note)
    stdin = sys.stdin.buffer if sys.stdin is not None else os.fdopen(0, "rb", closefd=False)
    code = Worker(out).serve(stdin)
    log.info("worker stopping")
    sys.stderr.flush()
    os._exit(code)  # skip slow library teardown; every event is already written (unbuffered)


if __name__ == "__main__":
    main(sys.argv[1:])

