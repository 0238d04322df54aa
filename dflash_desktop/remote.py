"""A pair that runs on an OpenAI-compatible server: vLLM or SGLang started with a DFlash drafter (for models
one computer cannot hold), or another DFlash Desktop. `RemoteClient` answers the worker protocol's
`load_pair`, `generate`, `unload` and `cancel` with the worker's own events (loaded, tokens with text
spans, done with stats), so the job queue, the chat and the stats panel treat it like the local engine.

What each server reports about acceptance differs, and the stats say which counts were not reported
instead of showing zeros (`unknown`, as for engine/loop.py's streaming engines):
- DFlash Desktop: the `dflash` extension of its responses (every count, the histogram, drafted spans).
- vLLM: server-wide `vllm:spec_decode_*` counters on /metrics, read before and after the request.
- SGLang: `meta_info` (spec_verify_ct, completion_tokens, ...) on its native /generate stream, used for
  raw prompts; its streamed chat completions carry none.
Plain HTTP from the standard library: one connection per request, so cancel can shut its socket.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import re
import socket
import threading
import time
import urllib.parse
from typing import Callable, Iterator

from engine import protocol as P
from engine.errors import EngineError
from engine.limits import GenerationSettings
from engine.stats import Stats

from .offers import REMOTE

KINDS = {"vllm": "vLLM", "sglang": "SGLang", "dflash-desktop": "DFlash Desktop", "openai": "OpenAI-compatible"}
CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 600.0     # a long prompt on a busy server may take minutes before its first token
VLLM_COUNTERS = {"vllm:spec_decode_num_drafts": "steps", "vllm:spec_decode_num_draft_tokens": "drafted",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}
_METRIC = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


class RemoteError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def normalize_base_url(url: str) -> str:
    """'http://host:port' (a trailing /v1 or slash dropped), or ValueError saying what is wrong."""
    text = (url or "").strip()
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not a server address: write it as http://HOST:PORT, the base URL the "
                         "server prints when it starts (a trailing /v1 is fine).")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError("Give the server address without a user name, password, ?query or #fragment; "
                         "put the API key in its own field.")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_metrics(text: str) -> dict:
    """Prometheus text: each vLLM speculative counter summed over its label sets, per draft position too."""
    totals: dict = {"positions": {}}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        name = name[:-6] if name.endswith("_total") else name
        try:
            number = float(value)
        except ValueError:
            continue
        if name in VLLM_COUNTERS:
            key = VLLM_COUNTERS[name]
            totals[key] = totals.get(key, 0.0) + number
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                totals["positions"][int(pos.group(1))] = totals["positions"].get(int(pos.group(1)), 0.0) + number
    return totals


class _Http:
    """Requests to one server; `stream` keeps its connection where `abort` can reach it from another thread."""

    def __init__(self, base_url: str, api_key: str):
        parts = urllib.parse.urlsplit(base_url)
        self.https, self.host, self.port = parts.scheme == "https", parts.hostname, parts.port
        self.prefix = parts.path
        self.headers = {"Accept": "application/json, text/event-stream", "User-Agent": "dflash-desktop"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._conn: http.client.HTTPConnection | None = None
        self.aborted = False

    def _open(self, method: str, path: str, body: dict | None) -> http.client.HTTPResponse:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=CONNECT_TIMEOUT)
        self._conn = conn
        where = f"{'https' if self.https else 'http'}://{self.host}:{conn.port}"
        try:
            conn.connect()
            conn.sock.settimeout(READ_TIMEOUT)
            data = json.dumps(body).encode() if body is not None else None
            headers = {**self.headers, **({"Content-Type": "application/json"} if data else {})}
            conn.request(method, self.prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            if self.aborted:
                raise RemoteError("cancelled", "cancelled") from None
            raise RemoteError("remote_unreachable", f"Could not reach {where} ({exc}). Check the address, that "
                              "the server is running, and that this computer can reach it.") from None
        if resp.status >= 400:
            raise RemoteError("remote_error", _refusal(resp, method, path))
        return resp

    def get_json(self, path: str) -> dict:
        resp = self._open("GET", path, None)
        try:
            return json.loads(resp.read())
        except ValueError:
            raise RemoteError("remote_error", f"GET {path} did not answer JSON: is this an OpenAI-compatible "
                              "server?") from None
        finally:
            self.close()

    def get_text(self, path: str) -> str | None:
        """The body, or None when the server has no such page (or refuses it)."""
        try:
            resp = self._open("GET", path, None)
            return resp.read().decode("utf-8", "replace")
        except RemoteError:
            return None
        finally:
            self.close()

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """The JSON objects of a server-sent-events answer, until `data: [DONE]` or the end of the stream."""
        resp = self._open("POST", path, body)
        try:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise RemoteError("remote_error", f"The server streamed a line that is not JSON: {data[:200]!r}")
                if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
                    raise RemoteError("remote_error", f"The server stopped with an error: "
                                      f"{obj['error'].get('message', obj['error'])}")
                yield obj
        except (OSError, http.client.HTTPException) as exc:
            if self.aborted:
                return
            raise RemoteError("remote_unreachable", f"The connection to the server broke during the answer "
                              f"({exc}).") from None
        finally:
            self.close()

    def abort(self) -> None:
        self.aborted = True
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _refusal(resp: http.client.HTTPResponse, method: str, path: str) -> str:
    """An HTTP error as a sentence: the server's own message when it sent one in OpenAI's shape."""
    raw = resp.read(64 * 1024).decode("utf-8", "replace")
    try:
        detail = json.loads(raw)
        detail = detail.get("error", detail)
        detail = detail.get("message", detail) if isinstance(detail, dict) else detail
    except ValueError:
        detail = raw.strip()[:300]
    hint = {401: " The API key is missing or wrong.", 403: " The API key is not allowed to do this.",
            404: " Is this the server's base URL?"}.get(resp.status, "")
    return f"The server answered {method} {path} with HTTP {resp.status}: {detail}.{hint}"


class RemoteClient:
    """One remote pair; thread-safe; every method returns at once and events reach `on_event` from a thread
    of this client. The job queue sends one generation at a time."""

    running = False      # no local process

    def __init__(self, on_event: Callable[[dict], None]):
        self._on_event = on_event
        self.pair_info: dict | None = None
        self._base = self._key = ""
        self._kind = "openai"
        self._calls: dict[str, _Http] = {}     # request id -> its open connection
        self._cancelled: set[str] = set()

    # -- the worker client's interface ----------------------------------------------------------------
    def request(self, cmd: str, id: str, **fields) -> str:
        work = {"load_pair": self._load, "generate": self._generate, "unload": self._unload}.get(cmd)
        if work is None:
            self._on_event(P.error_event("unknown_command", f"A remote pair does not take {cmd}.", id))
            return id
        threading.Thread(target=self._answer, args=(id, work, fields), name=f"remote-{id}", daemon=True).start()
        return id

    def cancel(self, target_id: str | None = None) -> None:
        for rid, call in list(self._calls.items()):
            if target_id in (None, rid):
                self._cancelled.add(rid)
                call.abort()

    def shutdown(self, timeout: float = 0.0) -> None:
        self.cancel()

    # -- requests ------------------------------------------------------------------------------------
    def _answer(self, rid: str, work, fields: dict) -> None:
        try:
            final = work(rid, fields)
        except RemoteError as exc:
            final = P.error_event(exc.code, str(exc), rid)
        except P.ProtocolError as exc:
            final = P.error_event(exc.code, str(exc), rid)
        except EngineError as exc:
            final = P.error_event(exc.code, str(exc), rid)
        finally:
            self._calls.pop(rid, None)
        self._on_event(final)

    def _call(self, rid: str) -> _Http:
        call = _Http(self._base, self._key)
        self._calls[rid] = call
        if rid in self._cancelled:
            call.abort()
        return call

    def _load(self, rid: str, fields: dict) -> dict:
        t0 = time.perf_counter()
        try:
            base = normalize_base_url(fields["target"])
        except ValueError as exc:
            raise RemoteError("remote_error", str(exc)) from None
        self._base, self._key = base, fields.get("api_key") or ""
        host = urllib.parse.urlsplit(base).hostname
        self._on_event({"event": "progress", "id": rid, "stage": "import", "message": f"Asking {base} for its models"})
        listing = self._call(rid).get_json("/v1/models")
        models = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
            raise RemoteError("remote_error", f"{base}/v1/models lists no model: is the model still loading?")
        wanted = fields.get("model")
        card = next((m for m in models if m.get("id") == wanted), None) if wanted else models[0]
        if card is None:
            names = ", ".join(str(m.get("id")) for m in models)
            raise RemoteError("remote_error", f"{base} does not serve {wanted!r}; it serves {names}.")
        self._kind = self._detect(card)
        if self._key and base.startswith("http:") and not is_loopback(host or ""):
            self._on_event({"event": "warning", "id": rid, "code": "plain_http", "message": (
                f"{host} is reached over plain HTTP: the API key and the chats travel unencrypted. Use https or a "
                "tunnel (ssh -L) for a server outside this network.")})
        ours = card.get("dflash") if isinstance(card.get("dflash"), dict) else {}
        self.pair_info = {
            "engine": "remote", "server": self._kind, "base_url": base, "device": f"{KINDS[self._kind]} at "
            f"{urllib.parse.urlsplit(base).netloc}", "dtype": None, "architecture": ours.get("architecture"),
            "name": str(card.get("id")), "target": base, "draft": None, "block_size": ours.get("block_size"),
            "has_drafter": ours.get("has_drafter", True), "has_tokenizer": True, "chat_template": True,
            "supports_thinking": False, "vocab_size": None, "max_positions": card.get("max_model_len"),
            "layers": None, "offers": REMOTE.to_dict()}
        self._on_event({"event": "progress", "id": rid, "stage": "ready", "message": "Server ready"})
        return {"event": "loaded", "id": rid, **self.pair_info, "load_s": time.perf_counter() - t0}

    def _detect(self, card: dict) -> str:
        owner = str(card.get("owned_by") or "").lower()
        if owner in KINDS:
            return owner
        metrics = _Http(self._base, self._key).get_text("/metrics") or ""
        return "vllm" if "vllm:" in metrics else "sglang" if "sglang:" in metrics else "openai"

    def _unload(self, rid: str, fields: dict) -> dict:
        had, self.pair_info = self.pair_info is not None, None
        return {"event": "ok", "id": rid, "cmd": "unload", "unloaded": had}

    def _generate(self, rid: str, fields: dict) -> dict:
        P.validate_command({"cmd": "generate", "id": rid, **fields})
        if self.pair_info is None:
            raise P.ProtocolError("no_pair", "No server is connected: add one in Models… first.")
        settings = GenerationSettings.from_dict(fields.get("settings") or {})
        baseline = fields.get("mode") == "baseline"
        if baseline and self._kind != "dflash-desktop":
            raise P.ProtocolError("bad_settings", f"This {KINDS[self._kind]} server runs its own speculative "
                                  "decoding on every request; plain decoding cannot be asked for one answer. "
                                  "Measure the baseline on a server started without a drafter.")
        path, body = self._body(fields, settings, baseline)
        before = self._counters(rid) if self._kind == "vllm" else None
        run = _Answer(rid, self._on_event)
        for obj in self._call(rid).stream(path, body):
            run.take(obj)
        if rid in self._cancelled:
            self._cancelled.discard(rid)
            run.finish = "cancelled"
        elif run.finish is None:
            raise RemoteError("remote_unreachable", "The server closed the stream before the answer ended.")
        after = self._counters(rid) if before is not None else None
        return run.done(self._kind, before, after)

    def _counters(self, rid: str) -> dict | None:
        text = self._call(rid).get_text("/metrics")
        return parse_metrics(text) if text else None

    def _body(self, fields: dict, s: GenerationSettings, baseline: bool) -> tuple[str, dict]:
        sampling = {"max_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p}
        if s.seed is not None:
            sampling["seed"] = s.seed
        if s.stop_strings:
            sampling["stop"] = list(s.stop_strings)
        if self._kind != "openai":      # the plain OpenAI API has neither; LM Studio and llama.cpp read these names
            if s.top_k:
                sampling["top_k"] = s.top_k
            if s.min_p:
                sampling["min_p"] = s.min_p
            if s.penalized:
                sampling["repeat_penalty" if self._kind == "dflash-desktop" else "repetition_penalty"] = s.repeat_penalty
            usage = {"include_usage": True, "continuous_usage_stats": True}
        else:
            usage = {"include_usage": True}
        prompt, ids, raw = fields.get("prompt"), fields.get("prompt_ids"), fields.get("raw", False)
        if self._kind == "sglang" and (ids is not None or raw):   # /generate reports acceptance per request
            params = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                      **({"top_k": s.top_k} if s.top_k else {}), **({"min_p": s.min_p} if s.min_p else {}),
                      **({"repetition_penalty": s.repeat_penalty} if s.penalized else {}), **({"stop": list(s.stop_strings)} if s.stop_strings
                                                                     else {})}
            return "/generate", {("input_ids" if ids is not None else "text"): ids if ids is not None else prompt,
                                 "sampling_params": params, "stream": True}
        body = {"model": self.pair_info["name"], "stream": True, "stream_options": usage, **sampling}
        if self._kind == "dflash-desktop":
            body["dflash"] = {"mode": "baseline" if baseline else "dflash", "block_size": s.block_size,
                              "draft_cutoff": s.draft_cutoff, "plain_fallback": s.plain_fallback}
        if ids is not None or raw:
            return "/v1/completions", {**body, "prompt": ids if ids is not None else prompt}
        messages = fields.get("messages") or [{"role": "user", "content": prompt}]
        if fields.get("enable_thinking") is not None and self._kind in ("vllm", "sglang"):
            body["chat_template_kwargs"] = {"enable_thinking": fields["enable_thinking"]}
        return "/v1/chat/completions", {**body, "messages": messages}


class _Answer:
    """One streamed answer in any of the three shapes (chat chunks, completion chunks, SGLang's /generate),
    turned into the worker's `tokens` events and its final `done`."""

    FINISH = {"stop": "eos", "length": "length", "abort": "cancelled"}

    def __init__(self, rid: str, emit: Callable[[dict], None]):
        self.rid, self.emit = rid, emit
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.text = ""
        self.chunks = 0
        self.usage: dict = {}
        self.finish: str | None = None
        self.extension: dict | None = None
        self.meta: dict = {}

    def take(self, obj: dict) -> None:
        if "meta_info" in obj and "choices" not in obj:        # SGLang /generate: the text so far, each time
            text = str(obj.get("text") or "")
            delta = text[len(self.text):] if text.startswith(self.text) else text
            self.meta = obj.get("meta_info") or {}
            self.usage = {"prompt_tokens": self.meta.get("prompt_tokens"),
                          "completion_tokens": self.meta.get("completion_tokens")}
            reason = self.meta.get("finish_reason")
            self._span(delta, False, self.usage.get("completion_tokens"))
            if reason:
                self.finish = self.FINISH.get(reason.get("type") if isinstance(reason, dict) else reason, "eos")
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        ext = obj.get("dflash") if isinstance(obj.get("dflash"), dict) else {}
        if "tau" in ext:
            self.extension = ext
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content") if "delta" in choice else choice.get("text")
            drafted = bool(ext.get("drafted_span"))
            self._span(text or "", drafted, self.usage.get("completion_tokens"))
            reason = choice.get("finish_reason")
            if reason:
                stop = choice.get("stop_reason")
                self.finish = "stop_string" if isinstance(stop, str) else self.FINISH.get(reason, "eos")

    def _span(self, text: str, drafted: bool, generated) -> None:
        if not text:
            return
        if self.first is None:
            self.first = time.perf_counter()
        self.text += text
        self.chunks += 1
        self.emit({"event": "tokens", "id": self.rid, "spans": [[text, drafted]], "tokens": [], "drafted": [],
                   "steps": [], "generated": int(generated or self.chunks),
                   "elapsed_s": time.perf_counter() - self.t0})

    def done(self, kind: str, before: dict | None, after: dict | None) -> dict:
        end = time.perf_counter()
        stats = Stats(block_size=0, prompt_tokens=int(self.usage.get("prompt_tokens") or 0),
                      generated_tokens=int(self.usage.get("completion_tokens") or self.chunks))
        stats.ttft_s = stats.prefill_s = (self.first or end) - self.t0
        stats.decode_s = end - (self.first or end)
        note = self._counts(stats, kind, before, after)
        result = stats.to_dict()
        if self.extension:   # another DFlash Desktop: its engine's own numbers, histogram included
            result.update({k: v for k, v in self.extension.items() if k in result})
        result["remote"] = {"server": kind, "note": note}
        return {"event": "done", "id": self.rid, "stop_reason": self.finish, "text": self.text, "token_ids": [],
                "stats": result}

    def _counts(self, stats: Stats, kind: str, before: dict | None, after: dict | None) -> str | None:
        """Fill drafted/accepted/steps from what the server reported; the note says why some are missing."""
        ext, meta = self.extension, self.meta
        if ext:
            stats.block_size = int(ext.get("block_size") or 0)
            stats.record_totals(ext.get("drafted"), ext.get("accepted"), ext.get("steps"))
            return None
        if kind == "sglang" and meta.get("spec_verify_ct"):
            steps = int(meta["spec_verify_ct"])
            proposed = meta.get("spec_num_proposed_drafts", meta.get("spec_draft_token_num"))
            stats.record_totals(proposed, max(stats.generated_tokens - steps, 0), steps)
            return None if proposed is not None else "SGLang reported verify passes but not the drafted tokens."
        if kind == "vllm" and before is not None and after is not None and "steps" in after:
            # server-wide counters: other clients' requests meanwhile count too (docs/SERVER.md, "Remote servers")
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("steps", "drafted", "accepted")}
            stats.record_totals(int(delta["drafted"]), int(delta["accepted"]), int(delta["steps"]))
            stats.position_accepts = [int(after["positions"].get(i, 0) - before["positions"].get(i, 0))
                                      for i in sorted(after["positions"])]
            return None
        stats.record_totals(None, None, None)
        return {"vllm": "This vLLM server reports no speculative decoding counters on /metrics: was it started "
                        "with --speculative-config?",
                "sglang": "SGLang reports acceptance for raw prompts (its /generate endpoint) and not for streamed "
                          "chats.",
                "openai": "This server does not report speculative decoding counts."}.get(
            kind, "The server reported no acceptance counts.")
