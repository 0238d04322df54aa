"""The OpenAI-compatible local server: editors, agents and scripts use the loaded pair through
/v1/models, /v1/chat/completions and /v1/completions (streamed or not), with `usage` and a `dflash`
extension per response.

It never runs a model itself: each request is a job on the engine's queue (jobs.py), the same queue the
window's chat and speedup demo use, so requests wait their turn instead of failing as busy, and a
client that disconnects cancels its job. Starlette and uvicorn do the HTTP; this process imports no
torch, so the window can host the server (`ServerThread`) as well as `dflash-desktop serve` (`main`).

Safe by default: 127.0.0.1 only; any other address needs --host and an API key, which is compared in
constant time; request bodies and every setting are bounded by engine/limits.py. Web pages cannot use it
behind the user's back (`Guard`): a POST must be application/json, which a page can send elsewhere only after
the browser asks this server first; an Origin header must be this computer's or one the user allowed with
--allow-origin; and the Host header must name this server, so a page whose name was pointed at 127.0.0.1
(DNS rebinding) is refused. A connection that does not send a whole request within IDLE_TIMEOUT_S is closed.
`serve` keeps its pair loaded: after the engine dies it loads it again (`Reloader`).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import signal
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable

from engine.limits import MAX_REQUEST_BYTES

from . import openai_api as api
from .jobs import Job, JobQueue
from .offers import Offers
from .pairs import LoadedPair
from .remote import is_loopback

log = logging.getLogger("dflash_desktop.server")
DEFAULT_PORT = 8765
MIN_NETWORK_KEY = 16
DISCONNECT_CHECK_S = 0.25
IDLE_TIMEOUT_S = 10.0  # a connection that sends no whole request's headers for this long is closed
RETRY_AFTER_S = 5      # what a 503 says to wait while `serve` loads its pair again
RELOAD_WAIT_S = (5.0, 300.0)   # after a failed reload, the wait before the next: first, longest (doubling)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


class ServerConfigError(ValueError):
    """A host, port or key the server will not start with; the message says what to do."""


def check_config(host: str, port: int, api_key: str | None, allow_origins: list[str] = ()) -> None:
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServerConfigError(f"Port {port!r} is not a port number: use 1 to 65535 (0 picks a free one).")
    for origin in allow_origins:
        if origin_of(origin) is None:
            raise ServerConfigError(f"--allow-origin {origin!r} is not a web origin: give the scheme, the host and "
                                    "the port if any, as the browser sends it (for example https://app.example.com "
                                    "or http://192.168.1.20:3000).")
    if api_key is not None and (not api_key.isascii() or not api_key.isprintable() or " " in api_key):
        raise ServerConfigError("The API key must be printable ASCII without spaces (it travels in an HTTP header).")
    if not is_loopback(host) and len(api_key or "") < MIN_NETWORK_KEY:
        raise ServerConfigError(
            f"Listening on {host} lets other computers reach the model, so it needs an API key of at least "
            f"{MIN_NETWORK_KEY} characters: add --api-key KEY (for example the output of python -c \"import "
            "secrets; print(secrets.token_urlsafe(24))\"), or leave out --host to serve this computer only.")


def error_response(err: api.ApiError):
    from starlette.responses import JSONResponse
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def origin_of(text: str) -> str | None:
    """An Origin header or --allow-origin value as `scheme://host[:port]`, lower case; None when it is not one."""
    try:
        parts = urllib.parse.urlsplit(text.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or \
            parts.query or parts.fragment or parts.username or parts.password:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


class Guard:
    """What a web page in the user's browser could make this server do, refused before any route runs (a pure
    ASGI wrapper, so every path and method is covered):

    - a Host header that does not name this server: 421. A page whose domain was pointed at 127.0.0.1 (DNS
      rebinding) reaches the port but still sends its own name. Allowed: localhost, 127.0.0.1 and [::1], the
      --host given, and any IP address when listening on all of them (0.0.0.0 or ::, behind an API key), each
      with this server's port.
    - an Origin header (a browser's fetch) other than this computer's or one given with --allow-origin: 403.
    - a POST whose Content-Type is not application/json: 415. A page may send text/plain to any site without
      the browser asking the site first (no CORS preflight), so a generation could be started blind.
    Pages that are allowed get CORS headers (Starlette's CORSMiddleware, inside this wrapper)."""

    def __init__(self, app, host: str, port: int | None, allow_origins=()):
        from starlette.middleware.cors import CORSMiddleware
        self.origins = {origin_of(o) for o in allow_origins}
        self.app = CORSMiddleware(app, allow_origins=sorted(self.origins), allow_methods=["GET", "POST"],
                                  allow_origin_regex=r"https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?",
                                  allow_headers=["Authorization", "Content-Type"], max_age=600)
        self.host, self.port = host.strip("[]").lower(), port

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            from starlette.datastructures import Headers
            problem = self.problem(Headers(scope=scope), scope["method"])
            if problem is not None:
                await error_response(problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def problem(self, headers, method: str) -> api.ApiError | None:
        host = headers.get("host")
        if host is not None and not self.host_allowed(host):
            return api.ApiError(421, f"This server does not answer to the host name in this request ({host!r}): "
                                "call it as 127.0.0.1, localhost or [::1] with its port, or as the address it was "
                                "started with (--host).", code="misdirected_request", param="Host")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return api.ApiError(403, f"Requests from web pages of {origin!r} are refused: only pages served from "
                                "this computer may call this server. To let a web app use it, start the server "
                                "with --allow-origin and that app's origin.", code="origin_not_allowed",
                                param="Origin")
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if method == "POST" and media != "application/json":
            return api.ApiError(415, f"A POST must have Content-Type: application/json (this one has "
                                f"{media or 'none'}); with curl, add -H \"Content-Type: application/json\".",
                                code="unsupported_media_type", param="Content-Type")
        return None

    def host_allowed(self, host: str) -> bool:
        try:
            parts = urllib.parse.urlsplit(f"//{host}")
            name, port = parts.hostname, parts.port
        except ValueError:
            return False
        if not name or parts.path or parts.username is not None or (self.port is not None and port != self.port):
            return False
        if name in LOOPBACK_NAMES or name == self.host:
            return True
        if self.host in WILDCARDS:   # any address of this computer; a rebound page sends a name, never an address
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False

    def origin_allowed(self, origin: str) -> bool:
        normal = origin_of(origin)
        return normal is not None and (normal in self.origins or is_loopback(
            urllib.parse.urlsplit(normal).hostname or ""))


class _Bridge:
    """A job's events, from the worker client's thread into this request's event loop."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.checked = self.loop.time()   # when the client's connection was last looked at

    def put(self, event: dict) -> None:
        with contextlib.suppress(RuntimeError):   # the loop is closing: nobody is waiting any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def model_id_for(target: str) -> str:
    """A model's public name from its folder: the hub repo for a Hugging Face cache snapshot, else the folder."""
    parts = Path(target).parts
    if "snapshots" in parts[1:] and parts[parts.index("snapshots") - 1].startswith("models--"):
        return parts[parts.index("snapshots") - 1][len("models--"):].replace("--", "/")
    return Path(target).name


def create_app(jobs: JobQueue, api_key: str | None = None, model_name: Callable[[], str | None] = lambda: None,
               owner: str = "server", reloads: bool = False):
    """The ASGI app serving whatever pair `jobs` has loaded, as `model_name()` (default: its folder's name).
    reloads: a `Reloader` loads the pair again whenever it is lost, so a 503 meanwhile says when to retry."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    key = api_key.encode() if api_key else None

    def model_id() -> str:
        info = jobs.pair_info
        if info is None and reloads:   # route() adds Retry-After
            raise api.ApiError(503, "The engine stopped and the model is being loaded again: try again in a few "
                               "seconds.", "server_error", "model_reloading")
        if info is None:
            raise api.ApiError(503, "No model is loaded yet: load one in DFlash Desktop, or wait for "
                               "`dflash-desktop serve` to finish loading.", "server_error", "model_not_loaded")
        return model_name() or (model_id_for(info["target"]) if Offers.of(info).local else info["name"])

    def authorize(request: Request) -> None:
        if key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode("utf-8", "replace"), key):
            raise api.ApiError(401, "Missing or wrong API key: send the header Authorization: Bearer KEY with the "
                               "key this server was started with.", code="invalid_api_key")

    async def read_json(request: Request):
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_REQUEST_BYTES):
            raise _too_large()
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > MAX_REQUEST_BYTES:
                raise _too_large()
        try:
            return json.loads(bytes(body))
        except (ValueError, RecursionError) as exc:
            raise api.ApiError(400, f"The body is not valid JSON ({exc}). Send a JSON object with "
                               "Content-Type: application/json.") from None

    async def next_event(bridge: _Bridge, request: Request, job) -> dict:
        """The job's next event; a client that went away (looked for every DISCONNECT_CHECK_S, however many
        events come meanwhile) cancels the job, and this raises."""
        while True:
            if bridge.loop.time() - bridge.checked >= DISCONNECT_CHECK_S:
                bridge.checked = bridge.loop.time()
                if await request.is_disconnected():
                    jobs.cancel(job.id)
                    raise ConnectionAbortedError(job.id)
            try:
                return await asyncio.wait_for(bridge.queue.get(), DISCONNECT_CHECK_S)
            except asyncio.TimeoutError:
                pass

    async def models(request: Request):
        authorize(request)
        if reloads and jobs.pair_info is None:
            model_id()   # 503 with Retry-After: an empty list would say the server has no model for good
        info = jobs.pair_info or {}
        data = [] if not info else [{
            "id": model_id(), "object": "model", "created": 0, "owned_by": "dflash-desktop",
            "max_model_len": info.get("max_positions"),
            "dflash": {k: info.get(k) for k in ("engine", "device", "dtype", "architecture", "block_size",
                                                "has_drafter", "chat_template")}}]
        return JSONResponse({"object": "list", "data": data})

    async def complete(request: Request, chat: bool):
        authorize(request)
        call = api.parse(await read_json(request), chat)
        model = model_id()
        api.check_token_ids(call, (jobs.pair_info or {}).get("vocab_size"))
        bridge = _Bridge()
        job = jobs.submit("generate", owner=owner, on_event=bridge.put, **call.generate)
        try:
            first = await next_event(bridge, request, job)
        except ConnectionAbortedError:
            return JSONResponse({}, status_code=499)
        if first.get("event") == "error":
            raise api.ApiError.from_event(first)
        if not call.stream:
            event = first
            while event.get("event") not in ("done", "error"):
                try:
                    event = await next_event(bridge, request, job)
                except ConnectionAbortedError:
                    return JSONResponse({}, status_code=499)
            if event["event"] == "error":
                raise api.ApiError.from_event(event)
            return JSONResponse(api.response(call, model, event))
        return StreamingResponse(_sse(call, model, first, bridge, request, job), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _sse(call: api.Call, model: str, event: dict, bridge: _Bridge, request: Request, job):
        first, generated = True, 0
        try:
            while True:
                kind = event.get("event")
                if kind == "tokens":
                    generated = int(event.get("generated") or generated)
                    for text, drafted in event.get("spans") or []:
                        extra = {"dflash": {"drafted_span": bool(drafted)}}
                        if call.continuous_usage:
                            extra["usage"] = api.usage(None, generated)
                        yield _data(api.chunk(call, model, text, first=first, extra=extra))
                        first = False
                elif kind == "done":
                    finish = api.FINISH.get(event.get("stop_reason"), "stop")
                    yield _data(api.chunk(call, model, "" if call.chat else None, finish, first=first,
                                          extra={"dflash": api.extension(event)}))
                    if call.include_usage:
                        yield _data(api.usage_chunk(call, model, event))
                    yield "data: [DONE]\n\n"
                    return
                elif kind == "error":
                    yield _data(api.ApiError.from_event(event).body())
                    yield "data: [DONE]\n\n"
                    return
                event = await next_event(bridge, request, job)
        except ConnectionAbortedError:
            return
        finally:
            if job.state != "finished":
                jobs.cancel(job.id)

    def route(handler: Callable):
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except api.ApiError as err:
                if err.status == 503 and reloads and jobs.pair_info is None:   # back once the Reloader is done
                    err.retry_after = RETRY_AFTER_S
                return error_response(err)
        return endpoint

    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    async def completions(request: Request):
        return await complete(request, chat=False)

    async def not_found(request: Request, exc):
        return error_response(api.ApiError(404, f"No such endpoint: {request.method} {request.url.path}. This "
                                           "server offers GET /v1/models, POST /v1/chat/completions and POST "
                                           "/v1/completions.", code="not_found"))

    async def wrong_method(request: Request, exc):
        return error_response(api.ApiError(405, f"{request.url.path} does not take {request.method}.",
                                           code="method_not_allowed"))

    async def internal(request: Request, exc):
        log.exception("request failed: %s", exc)
        return error_response(api.ApiError(500, f"Unexpected {type(exc).__name__}: {exc}.", "server_error"))

    return Starlette(routes=[Route("/v1/models", route(models), methods=["GET"]),
                             Route("/v1/chat/completions", route(chat_completions), methods=["POST"]),
                             Route("/v1/completions", route(completions), methods=["POST"])],
                     exception_handlers={404: not_found, 405: wrong_method, 500: internal})


def _too_large() -> api.ApiError:
    return api.ApiError(413, f"The request is larger than {MAX_REQUEST_BYTES // 2**20} MiB, the most this server "
                        "reads. Send a shorter prompt.", code="request_too_large")


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a port in use is reported before anything starts."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host.strip("[]"), port), family=family)
    except OSError as exc:
        raise ServerConfigError(f"Could not listen on {host}:{port} ({exc.strerror or exc}). Another program may "
                                "use that port: choose another one.") from None


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def idle_closing_protocol():
    """uvicorn's h11 protocol, closing a connection that sends no whole request's headers within IDLE_TIMEOUT_S
    of opening or of its last answer. uvicorn alone times out a kept-alive connection only after an answer, and
    any byte received stops that timer, so a connection that sends nothing, or a header a minute, would hold a
    file descriptor for ever: enough of them and the server can accept no one."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class IdleClosingH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._close_unless_asked()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._close_unless_asked()

        def _close_unless_asked(self) -> None:
            cycle = self.cycle   # a new request's headers, once complete, start a new cycle

            def check() -> None:
                if self.cycle is cycle and not self.transport.is_closing():
                    self.transport.close()
            self.loop.call_later(IDLE_TIMEOUT_S, check)

    return IdleClosingH11


class ServerThread:
    """uvicorn on a thread of its own, serving `jobs` on an already bound socket: inside the window, and for
    `dflash-desktop serve`, whose main thread then only waits for Ctrl+C. host: the address it was asked to
    listen on (default: the socket's), which clients may name in Host besides this computer's loopback names."""

    def __init__(self, jobs: JobQueue, sock: socket.socket, api_key: str | None = None,
                 model_name: Callable[[], str | None] = lambda: None, console: bool = False,
                 host: str | None = None, allow_origins: list[str] = (), reloads: bool = False):
        import uvicorn
        self.jobs, self.sock, self.url = jobs, sock, address(sock)
        quiet = {} if console else {"log_config": None, "access_log": False}
        app = Guard(create_app(jobs, api_key, model_name, reloads=reloads), host or sock.getsockname()[0],
                    sock.getsockname()[1], allow_origins)
        config = uvicorn.Config(app, http=idle_closing_protocol(), lifespan="off", timeout_graceful_shutdown=2,
                                **quiet)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="openai-server", daemon=True)
        self._thread.start()

    @classmethod
    def listen(cls, jobs: JobQueue, host: str = "127.0.0.1", port: int = DEFAULT_PORT, api_key: str | None = None,
               model_name: Callable[[], str | None] = lambda: None) -> "ServerThread":
        """Check the configuration, bind, serve; ServerConfigError says what is wrong."""
        check_config(host, port, api_key)
        return cls(jobs, bind(host, port), api_key, model_name, host=host)

    def stop(self, on_stopped: Callable[[], None] | None = None) -> None:
        """Stop taking requests and cancel the server's jobs; returns at once, `on_stopped` runs (on a
        background thread) once the port is free."""
        self._server.should_exit = True
        for job in [self.jobs.running, *self.jobs.queued]:
            if job is not None and job.owner == "server":
                self.jobs.cancel(job.id)

        def wait():
            self.join(10)
            if on_stopped:
                on_stopped()
        threading.Thread(target=wait, name="openai-server-stop", daemon=True).start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        self.sock.close()


# -- dflash-desktop serve ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-desktop serve", description="OpenAI-compatible server for a DFlash pair")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this computer only; any other needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--api-key", help="require Authorization: Bearer KEY on every request")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages of ORIGIN (scheme://host[:port], as browsers send it) call the server; "
                        "repeat for more. Pages served from this computer are always allowed, others never")
    p.add_argument("--target", help="target model folder or GGUF file (default: the built-in chat pair where "
                                    "its model is installed, else the code pair)")
    p.add_argument("--draft", help="DFlash drafter folder")
    p.add_argument("--pair", choices=["chat", "demo"], help="a built-in pair: chat (SmolLM2-135M-Instruct) or "
                                                            "demo (the code pair)")
    p.add_argument("--engine", default="auto", help="the engine that runs the pair: auto (the default: the engine "
                                                    "the app measured fastest for this pair here, timing those that "
                                                    "run it at its first load; else llama.cpp on a CPU where it is "
                                                    "built), torch, llamacpp, mlx")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--model-name", help="the model's name in /v1/models (default: the built-in pair's id, the "
                                         "hub repo of a Hugging Face cache folder, else the target folder's name)")
    return p


def builtin_pair(pair_id: str | None) -> tuple[str, str, str, list[str]]:
    """(target, drafter, id, engines the catalog lists) of a built-in pair: the one named, else what a first
    start opens."""
    from .catalog import load_catalog
    catalog = load_catalog()
    pair = catalog.get(pair_id) if pair_id else catalog.starter()
    if not pair.installed():
        raise SystemExit(f"error: the built-in pair {pair.id!r} is not installed here. {pair.install_hint}")
    return str(pair.local_path("target")), str(pair.local_path("drafter")), pair.id, list(pair.engines)


class Reloader:
    """Keeps `serve`'s pair loaded. Once the engine has lost it (the worker crashed, was killed or ran out of
    memory), the same pair is loaded again in a fresh worker and the console says so; requests meanwhile get
    503 with Retry-After (create_app's `reloads`). A reload that fails is tried again later, waiting twice as
    long each time, up to RELOAD_WAIT_S[1]."""

    def __init__(self, jobs: JobQueue, name: str, pair: dict):
        self.jobs, self.name, self.pair = jobs, name, pair
        self.job: Job | None = None
        self.failures, self.not_before = 0, 0.0

    def check(self) -> None:
        """Called by `serve`'s main thread twice a second."""
        if self.job is not None and self.job.state == "finished":
            job, self.job = self.job, None
            if job.final.get("event") == "loaded":
                self.failures = 0
                print(f"Serving {self.name} again ({job.final.get('engine')} on {job.final.get('device')})",
                      flush=True)
            else:
                wait = min(RELOAD_WAIT_S[0] * 2 ** self.failures, RELOAD_WAIT_S[1])
                self.failures += 1
                self.not_before = time.monotonic() + wait
                print(f"engine: loading {self.name} again failed ({job.final.get('message')}); trying again in "
                      f"{wait:.0f} s.", file=sys.stderr, flush=True)
        if self.job is None and self.jobs.pair_info is None and time.monotonic() >= self.not_before:
            print(f"engine: the engine stopped; loading {self.name} again (requests get 503 with Retry-After "
                  "until it is back) ...", file=sys.stderr, flush=True)
            self.job = self.jobs.submit("load_pair", owner="server", **self.pair)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_config(args.host, args.port, args.api_key, args.allow_origin)
        if args.draft and not args.target:
            raise ServerConfigError("--draft needs --target: name the model the drafter belongs to.")
        sock = bind(args.host, args.port)
    except ServerConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .worker_client import WorkerClient
    jobs = JobQueue(on_event=_report)
    client = WorkerClient(on_event=jobs.intake)
    jobs.backend = client
    if args.target and args.pair:
        print("error: --pair names a built-in pair; leave out --target (or --pair).", file=sys.stderr)
        return 2
    target, draft, builtin, engines = ((args.target, args.draft, None, None) if args.target else
                                       builtin_pair(args.pair))
    name = args.model_name or builtin or model_id_for(target)
    print(f"Loading {target} ...", file=sys.stderr, flush=True)
    # auto: as the window does, the engines here that run the pair (of a built-in one, those its catalog lists)
    # are timed at its first load, and the fastest is remembered for both (engine/fastest.py)
    pair = {"target": target, "draft": draft, "engine": args.engine, "device": args.device,
            "compare": args.engine == "auto" and (engines or True)}
    try:
        # no deadline here: the worker client ends a load that stops making progress (WorkerClient's load_timeout)
        loaded = jobs.submit("load_pair", on_event=_load_progress, **pair).wait(None)
    except KeyboardInterrupt:
        client.shutdown()
        return 130
    if loaded.get("event") != "loaded":
        print(f"error: {loaded.get('message')}", file=sys.stderr)
        client.shutdown()
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    served = ServerThread(jobs, sock, args.api_key, lambda: name, console=True, host=args.host,
                          allow_origins=args.allow_origin, reloads=True)
    for why in LoadedPair.of(loaded).engine_reasons:
        print(why, file=sys.stderr, flush=True)
    print(f"Serving {name} ({loaded['engine']} on {loaded['device']}) at {served.url}"
          + ("  (API key required)" if args.api_key else ""), flush=True)
    reloader = Reloader(jobs, name, pair)
    while not stop.wait(0.5):
        reloader.check()
    served.stop()
    served.join(10)
    client.shutdown()
    return 0


def _load_progress(event: dict) -> None:
    """The first load's engine comparison takes a while: its steps go to the console."""
    if event.get("event") == "progress" and event.get("stage") == "compare":
        print(event.get("message"), file=sys.stderr, flush=True)


def _report(event: dict) -> None:
    """Engine events that belong to no request (a crash between requests) go to the console."""
    if event.get("event") == "error":
        print(f"engine: {event.get('message')}", file=sys.stderr, flush=True)
