"""One llama-server process on 127.0.0.1 and its streaming /completion requests.

The server is started with the settings fixed at its start (model files, drafter, n_max, context,
threads) and listens only on the loopback address, on a port that was free a moment before. It takes
requests only with a random key made for this start (read from a private file, so it is not on the
command line), answers no web page (no CORS origin is allowed) and has its /slots monitor off: other
programs and pages on this computer cannot use or watch it (docs/SECURITY.md). Its log goes to a file, so
a server that dies can say why (kept in the cache's logs folder when it crashed). Every wait has a
deadline and watches the process, so a crashed server becomes an EngineError, never a hang.
"""
from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...cache_dir import app_cache
from ...errors import EngineError
from ...limits import REPEAT_WINDOW
from . import UBATCH

HOST = "127.0.0.1"
START_SECONDS = 120.0       # loading a large model from a cold disk
READ_SECONDS = 600.0        # the longest silence inside one answer (a long prompt's prefill)
NO_ORIGIN = "null-origin.invalid"   # the only CORS origin the server allows: no web page has it
KEPT_CRASH_LOGS = 5
HEALTH_SECONDS = 0.5        # a server that does not answer /health in this long is hung (it answers in ms while busy)


class ServerError(EngineError):
    """llama-server stopped or broke an answer; the worker process itself is fine. The message says what
    happened in a sentence or two; the server's last log lines and its kept log travel beside it (the
    window puts them in the diagnostics, not in the chat)."""
    code = "engine_crashed"

    def __init__(self, message: str, log_lines: list[str] | None = None, log_path: Path | None = None):
        super().__init__(message)
        self.log_lines, self.log_path = log_lines or [], log_path


class StartCancelled(ServerError):
    """A cancel came while the server was starting (it has been stopped)."""


# Our speculation methods (engine.backends.METHODS) -> llama-server's --spec-type
# (llama-server tells a DFlash2 drafter from a DFlash one by its selector and drafts both as draft-dflash)
SPEC_TYPES = {"dflash": "draft-dflash", "dflash2": "draft-dflash", "ngram": "ngram-mod", "mtp": "draft-mtp",
              "eagle3": "draft-eagle3", "dspark": "draft-dspark"}
# n-gram lookup: llama.cpp's ngram-mod (a hash of the last NGRAM_MATCH tokens -> the token that followed them,
# over the prompt and the answer, kept across answers) drafts at least NGRAM_MIN tokens. Short keys and drafts
# win on a CPU, where a long rejected draft costs several plain steps: on SmolLM2 here 4/2 beat llama.cpp's
# 24/48 defaults and llama.cpp's other n-gram kinds (docs/BENCHMARKS.md, "n-gram lookup").
NGRAM_MATCH, NGRAM_MIN = 4, 2


@dataclass(frozen=True)
class Launch:
    """What a server is started with; a new value means a restart."""
    binary: Path
    model: Path
    draft: Path | None = None   # the drafter's GGUF, for the methods that need one
    method: str = "none"        # a key of SPEC_TYPES, or none: plain decoding
    n_max: int = 0              # tokens drafted per step (at most the block size - 1)
    context: int = 4096
    threads: int = 0            # 0: llama.cpp's default
    gpu_layers: int = 0
    flash_attn: str = "auto"    # llama.cpp's -fa: on, off or auto (its own choice)
    repack: bool = True         # off on CPUs with AMX, whose repacked kernels crash (cpu.py)
    device: str | None = None   # llama.cpp's -dev: the GPU to use (Vulkan0), none for a GPU build on the CPU

    def args(self, port: int, key_file: Path) -> list[str]:
        a = [str(self.binary), "-m", str(self.model), "--host", HOST, "--port", str(port), "-c", str(self.context),
             "-np", "1", "-ngl", str(self.gpu_layers), "--no-webui", "-fa", self.flash_attn, "-ub", str(UBATCH),
             "--api-key-file", str(key_file), "--cors-origins", NO_ORIGIN, "--no-slots"]
        if not self.repack:
            a += ["--no-repack"]
        if self.device:
            a += ["-dev", self.device] + (["-devd", self.device] if self.draft else [])
        if self.threads:
            a += ["-t", str(self.threads)]
        if self.method != "none":
            # always named: llama-server guesses some types from the drafter and none from a bare target
            a += ["--spec-type", SPEC_TYPES[self.method], "--spec-draft-n-max", str(self.n_max)]
        if self.method == "ngram":
            a += ["--spec-ngram-mod-n-match", str(NGRAM_MATCH), "--spec-ngram-mod-n-min", str(NGRAM_MIN),
                  "--spec-ngram-mod-n-max", str(self.n_max)]
        if self.draft:
            # the draft KV cache stays f16: a quantized one collapses DFlash's acceptance (DESIGN.md 7)
            a += ["-md", str(self.draft), "-ngld", str(self.gpu_layers), "-ctkd", "f16", "-ctvd", "f16"]
            if self.threads:
                a += ["-td", str(self.threads)]
        return a


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    """The user's LLAMA_ARG_* variables would override our flags (the host among them): drop them."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "LLAMA_"))}


def _die_with_parent():
    """Linux: the server gets SIGKILL when the worker that started it dies, even by SIGKILL, so a killed
    worker leaves no server holding the model's memory. The signal follows the starting thread, which in
    the worker is its one long-lived executor thread. SIGKILL, not SIGTERM: a llama-server was seen to ignore
    SIGTERM and run on for minutes after its worker had gone. (Elsewhere the worker's normal exit stops it.)"""
    if not sys.platform.startswith("linux"):
        return None

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up here: the forked child must not dlopen
    except (OSError, AttributeError):
        return None

    def set_pdeathsig():
        prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    return set_pdeathsig


class Server:
    def __init__(self, launch: Launch, cancelled: Callable[[], bool] = lambda: False):
        """Start the server and wait until it answers; cancelled() true meanwhile stops it (StartCancelled)."""
        self.launch = launch
        self.port = free_port()
        self.key = secrets.token_urlsafe(32)
        self._sock: socket.socket | None = None    # the streaming request's socket, for interrupt()
        self.interrupted = False
        self.proc: subprocess.Popen | None = None
        # a private folder (0700) for the log and the key file; the key file goes once the server has read it
        self.folder = _run_folder()
        key_file = self.folder / "key"
        self.log = (self.folder / "llama-server.log").open("wb")
        try:
            key_file.write_text(self.key, encoding="utf-8")
            try:
                self.proc = subprocess.Popen(launch.args(self.port, key_file), stdin=subprocess.DEVNULL,
                                             stdout=self.log, stderr=subprocess.STDOUT, env=clean_env(),
                                             preexec_fn=_die_with_parent())
            except (OSError, subprocess.SubprocessError) as exc:
                raise ServerError(f"llama-server could not be started ({exc}). Build it again with "
                                  "`python -m engine.backends.llamacpp.build`.") from None
            self._wait_ready(cancelled)
        except BaseException:
            self.stop()
            raise
        finally:
            key_file.unlink(missing_ok=True)

    def _wait_ready(self, cancelled: Callable[[], bool]) -> None:
        end = time.monotonic() + START_SECONDS
        while time.monotonic() < end:
            if cancelled():
                raise StartCancelled("Cancelled while llama-server was starting.")
            self.check_alive("while loading the model")
            try:
                status, _ = self.request("GET", "/health", timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise self.failed(f"llama-server did not become ready in {START_SECONDS:.0f} s.")

    def check_alive(self, when: str) -> None:
        code = self.proc.poll()
        if code is not None:
            lines, kept = self.tail_lines(), self.keep_log()
            where = f" Its log is kept in {kept}." if kept else ""
            raise ServerError(f"The llama.cpp engine crashed {when} ({_exit_reason(code)}). "
                              f"{likely_cause(code, lines)}{_last_words(lines)}{where}", lines, kept)

    def failed(self, what: str) -> ServerError:
        """A ServerError for a server that still runs but broke its request."""
        lines = self.tail_lines()
        return ServerError(f"{what}{_last_words(lines)}", lines)

    def tail_lines(self, lines: int = 40) -> list[str]:
        """The end of the server's log, where llama.cpp says what went wrong."""
        try:
            text = Path(self.log.name).read_text(encoding="utf-8", errors="replace")[-64_000:]
        except OSError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]

    def keep_log(self) -> Path | None:
        """A copy of a crashed server's log in the cache's logs folder (the newest few are kept)."""
        try:
            folder = app_cache() / "logs"
            folder.mkdir(parents=True, exist_ok=True)
            dest = folder / time.strftime(f"llama-server-crash-%Y%m%d-%H%M%S-{self.proc.pid}.log")
            shutil.copyfile(self.log.name, dest)
            for old in sorted(folder.glob("llama-server-crash-*.log"))[:-KEPT_CRASH_LOGS]:
                old.unlink(missing_ok=True)
            return dest
        except OSError:
            return None

    @property
    def headers(self) -> dict:
        return {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0):
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=self.headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def interrupt(self) -> None:
        """Cancel from another thread: the streaming read is woken at once (its socket shut down), so a
        cancel never waits for a server that has stopped sending (hung, or in a long prefill)."""
        self.interrupted = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def healthy(self) -> bool:
        """Whether the server still answers (after an interrupted read: a hung one is replaced). Two tries, so
        a server only slowed by the cancelled prefill on a busy CPU is kept."""
        for _ in range(2):
            try:
                if self.proc.poll() is None and self.request("GET", "/health", timeout=HEALTH_SECONDS)[0] == 200:
                    return True
            except (OSError, http.client.HTTPException, ValueError):
                pass
        return False

    def stream(self, body: dict, cancelled: Callable[[], bool] = lambda: False):
        """The events of one streamed /completion (dicts), ending with the one marked stop, or early once
        cancelled() is true or interrupt() woke the read. Closing the generator closes the connection, which
        makes llama-server cancel the request."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=READ_SECONDS)
        self.interrupted = False
        try:
            conn.connect()
            self._sock = conn.sock
            if cancelled():                    # a cancel that came before there was a socket to shut down
                return
            conn.request("POST", "/completion", body=json.dumps({**body, "stream": True}), headers=self.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise EngineError(f"llama-server refused the request ({resp.status}): "
                                  f"{resp.read(2000).decode(errors='replace')}",
                                  code="bad_settings" if resp.status == 400 else "engine_crashed")
            for line in resp:
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise EngineError(f"llama-server: {event['error'].get('message', event['error'])}",
                                      code="engine_crashed")
                yield event
                if event.get("stop"):
                    return
            broke = "llama-server closed the answer without finishing it."
        except (OSError, http.client.HTTPException) as exc:
            broke = f"The connection to llama-server broke ({exc})."
        finally:
            self._sock = None
            conn.close()
        if self.interrupted:
            return          # cancelled (a shut-down socket reads as an early end): the caller checks the server
        self._settle()
        self.check_alive("in the middle of an answer")
        raise self.failed(broke)

    def _settle(self, seconds: float = 1.0) -> None:
        """A connection that broke is often a server that died: wait a moment for its exit to be seen, so it is
        reported as the crash it is (signal, cause, kept log) rather than as a cut answer."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass

    def memory(self) -> int:
        """The server process's resident bytes (its peak where the OS reports it)."""
        import psutil
        try:
            info = psutil.Process(self.proc.pid).memory_full_info()
            return int(getattr(info, "peak_wset", 0) or info.rss)
        except (psutil.Error, OSError):   # the process is gone
            return 0

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the server, killing it when it has not exited after `grace` seconds (0: a hung one)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _run_folder() -> Path:
    """A private folder for one server under the cache's `llama-server/`, named for this process, after
    removing those of processes that are gone (a worker killed with its server leaves its folder behind)."""
    import psutil

    root = app_cache() / "llama-server"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        pid = old.name.split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))


def likely_cause(code: int, lines: list[str]) -> str:
    """What most likely stopped the server, in a sentence a user can act on ("" when nothing is known)."""
    text = "\n".join(lines).lower()
    segv, killed = -signal.SIGSEGV, -getattr(signal, "SIGKILL", 9)   # Windows has no SIGKILL
    if "amx" in text and code == segv:
        return ("llama.cpp's AMX kernels crash on this CPU (an upstream bug); start the app again so that the "
                "server runs without weight repacking, or load the model with another engine. ")
    if code == killed:
        return ("Something stopped it from outside: the system when memory ran out, or another program. ")
    if "erroroutofdevicememory" in text or "device memory allocation" in text:
        return "The GPU ran out of memory: load the model on the CPU, or a smaller model, or a shorter context. "
    if "failed to load model" in text or "error loading model" in text:
        return "It could not load the model file: it may be damaged, or made for a newer llama.cpp. "
    if "devicelost" in text or "device lost" in text:
        return ("The GPU stopped answering (its driver reset it, or it overheated): load the model again, and on "
                "the CPU if it happens again. ")
    if "out of memory" in text or "failed to allocate" in text:
        return "It ran out of memory: try a smaller model or a shorter context. "
    if code == segv:
        return "It crashed inside llama.cpp (a bug there, or a file it reads wrongly). "
    return ""


def _last_words(lines: list[str]) -> str:
    """The server's last log line, which usually names the failure."""
    return f" Its log ends with: «{lines[-1].strip()[:300]}»." if lines else ""


def _exit_reason(code: int) -> str:
    """A process's exit status in words: a signal by name (SIGSEGV is a crash inside llama.cpp)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def request_body(prompt: list[int], s) -> dict:
    """The /completion request for a prompt under GenerationSettings s: our sampling rules in llama.cpp's
    terms and order (repeat penalty over the last REPEAT_WINDOW tokens, top-k, temperature, top-p, min-p, and
    nothing else: its defaults add others), greedy at 0."""
    return {"prompt": list(prompt), "n_predict": s.max_new_tokens, "cache_prompt": True, "return_tokens": True,
            "timings_per_token": True, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "min_p": s.min_p, "typical_p": 1.0, "repeat_penalty": s.repeat_penalty, "repeat_last_n": REPEAT_WINDOW,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
            "samplers": ["penalties", "top_k", "temperature", "top_p", "min_p"],
            "seed": -1 if s.seed is None else s.seed}
