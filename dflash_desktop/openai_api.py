"""OpenAI's request and response shapes, mapped to the worker protocol and back; no HTTP here (server.py).

Requests are checked field by field, with every number held to the engine's one limits table
(engine/limits.py), so a bad request gets a 400 in OpenAI's error shape naming the field, before it
reaches the engine. Fields OpenAI clients send routinely and that change nothing here (user, a zero
penalty) pass; fields that would change the answer in a way this engine cannot honour (n > 1, tools,
logprobs) are refused by name rather than ignored.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from engine.errors import EngineError
from engine.limits import LIMITS, GenerationSettings

ROLES = ("system", "developer", "user", "assistant")
DFLASH_KEYS = ("mode", "block_size", "draft_cutoff", "draft_vocab", "plain_fallback")
FINISH = {"eos": "stop", "stop_string": "stop", "loop": "stop", "cancelled": "stop", "length": "length",
          "context_full": "length"}
# worker error code -> HTTP status, OpenAI error type, OpenAI error code
WORKER_ERRORS = {
    "bad_settings": (400, "invalid_request_error", None),
    "bad_message": (400, "invalid_request_error", None),
    "prompt_too_long": (400, "invalid_request_error", "context_length_exceeded"),
    "template_error": (400, "invalid_request_error", "template_error"),
    "no_pair": (503, "server_error", "model_not_loaded"),
    "cancelled": (503, "server_error", "cancelled"),
    "out_of_memory": (503, "server_error", "out_of_memory"),
    "worker_crashed": (503, "server_error", "worker_crashed"),
    "worker_start_failed": (503, "server_error", "worker_start_failed"),
}


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.type, self.code, self.param = status, type, code, param
        self.retry_after = retry_after   # seconds, sent as the Retry-After header (a 503 that will pass)

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def from_event(cls, event: dict) -> "ApiError":
        status, kind, code = WORKER_ERRORS.get(event.get("code"), (500, "server_error", event.get("code")))
        return cls(status, event.get("message") or "The engine failed.", kind, code or event.get("code"))


@dataclass
class Call:
    """One checked request: the worker's generate fields and how to answer."""
    chat: bool
    generate: dict
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.id}"


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def parse(body, chat: bool) -> Call:
    """A /v1/chat/completions (chat) or /v1/completions body, checked; ApiError names what is wrong."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    _refuse_unsupported(body, chat)
    fields = {"settings": _settings(body), "mode": "dflash"}
    ext = body.get("dflash")
    if ext is not None:
        fields["mode"] = _extension(ext, fields["settings"])
    if chat:
        fields["messages"] = _messages(body.get("messages"))
        kwargs = body.get("chat_template_kwargs")
        if isinstance(kwargs, dict) and "enable_thinking" in kwargs:
            if not isinstance(kwargs["enable_thinking"], bool):
                raise _bad("chat_template_kwargs.enable_thinking must be true or false.", "chat_template_kwargs")
            fields["enable_thinking"] = kwargs["enable_thinking"]
    else:
        fields.update(_prompt(body.get("prompt")))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be true or false.", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("stream_options must be an object.", "stream_options")
    return Call(chat, fields, stream, bool(options.get("include_usage")), bool(options.get("continuous_usage_stats")))


def _refuse_unsupported(body: dict, chat: bool) -> None:
    checks = [("n", lambda v: v in (None, 1), "Only n = 1 is supported: send one request per answer."),
              ("best_of", lambda v: v in (None, 1), "Only best_of = 1 is supported."),
              ("logprobs", lambda v: v in (None, False, 0), "logprobs are not supported by this server."),
              ("top_logprobs", lambda v: v in (None, 0), "top_logprobs are not supported by this server."),
              ("echo", lambda v: v in (None, False), "echo is not supported by this server."),
              ("suffix", lambda v: v in (None, ""), "suffix (fill-in-the-middle) is not supported by this server."),
              ("tools", lambda v: not v, "Tool calls are not supported by this server."),
              ("functions", lambda v: not v, "Function calls are not supported by this server."),
              ("logit_bias", lambda v: not v, "logit_bias is not supported by this server."),
              ("presence_penalty", lambda v: v in (None, 0), "presence_penalty is not supported: send 0 or omit it."),
              ("frequency_penalty", lambda v: v in (None, 0), "frequency_penalty is not supported: send 0 or omit it."),
              ("response_format", lambda v: v in (None, {"type": "text"}),
               "response_format other than text (JSON mode, schemas) is not supported.")]
    for name, ok, message in checks:
        if not ok(body.get(name)):
            raise _bad(message, name, "unsupported_parameter")


def _settings(body: dict) -> dict:
    """Sampling fields -> the engine's settings, each held to engine/limits.py under its OpenAI name."""
    out: dict = {}
    # OpenAI's newer name wins when it is given; a null in it (some clients send every field) means not given
    tokens = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    given = {tokens: body.get(tokens), "temperature": body.get("temperature"), "top_p": body.get("top_p"),
             "top_k": body.get("top_k"), "seed": body.get("seed"), "min_p": body.get("min_p"),
             "repeat_penalty": body.get("repeat_penalty")}
    if given["top_k"] == -1:   # vLLM's and SGLang's spelling of "off"
        given["top_k"] = 0
    names = {tokens: "max_new_tokens", **{name: name for name in given if name != tokens}}
    for public, value in given.items():
        if value is None:
            continue
        limit = LIMITS[names[public]]
        try:
            out[names[public]] = limit.check(value, public)
        except EngineError as exc:
            raise _bad(str(exc), public) from None
    out.setdefault("max_new_tokens", int(LIMITS["max_new_tokens"].high))   # OpenAI: until the context is full
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise _bad("stop must be a string or a list of non-empty strings.", "stop")
        out["stop_strings"] = stops
    return _checked(out, "stop" if stop is not None else None)


def _checked(settings: dict, param: str | None) -> dict:
    try:
        GenerationSettings.from_dict(settings)
    except EngineError as exc:
        raise _bad(str(exc), param) from None
    return settings


def _extension(ext, settings: dict) -> str:
    """The `dflash` request field: mode (dflash or baseline = plain decoding) and the engine's own settings."""
    if not isinstance(ext, dict) or set(ext) - set(DFLASH_KEYS):
        raise _bad(f"dflash must be an object with some of {', '.join(DFLASH_KEYS)}.", "dflash")
    mode = ext.get("mode") or "dflash"
    if mode not in ("dflash", "baseline"):
        raise _bad("dflash.mode must be 'dflash' or 'baseline' (plain decoding of the same target).", "dflash")
    settings.update({k: ext[k] for k in DFLASH_KEYS[1:] if ext.get(k) is not None})
    _checked(settings, "dflash")
    return mode


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _bad(f"{where} must be text, or a list of text parts: this server reads no images or audio.", where)


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content}.", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}.", f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _text(m.get("content"), f"messages[{i}].content")})
    return out


def _prompt(prompt) -> dict:
    """A text prompt (sent raw: no chat template) or token ids; one prompt per request."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return {"prompt": prompt, "raw": True}
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in prompt):
        return {"prompt_ids": prompt}
    raise _bad("prompt must be a non-empty string or a list of token ids (one prompt per request).", "prompt")


def check_token_ids(call: Call, vocab_size: int | None) -> None:
    """Token ids the loaded model has (known only once a pair is loaded, so not in ``parse``)."""
    ids = call.generate.get("prompt_ids") or ()
    if vocab_size and any(t >= vocab_size for t in ids):
        bad = next(t for t in ids if t >= vocab_size)
        raise _bad(f"prompt holds token id {bad}, but the loaded model's vocabulary has ids 0 to {vocab_size - 1}.",
                   "prompt", "invalid_token_id")


# -- answers ------------------------------------------------------------------------------------------
def usage(stats: dict | None, generated: int = 0) -> dict:
    prompt, done = int((stats or {}).get("prompt_tokens") or 0), int((stats or {}).get("generated_tokens") or generated)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def extension(done: dict) -> dict:
    """The DFlash numbers of one answer, as the `dflash` field of a response."""
    s = done.get("stats") or {}
    return {"mode": "baseline" if s.get("block_size") == 1 else "dflash", "block_size": s.get("block_size"),
            "drafted": s.get("drafted"), "accepted": s.get("accepted"), "steps": s.get("steps"),
            "acceptance_rate": s.get("acceptance_rate"), "tau": s.get("tau"), "tok_s": s.get("end_to_end_tok_s"),
            "decode_tok_s": s.get("decode_tok_s"), "ttft_s": s.get("ttft_s"), "histogram": s.get("histogram"),
            "position_rates": s.get("position_rates"),
            "fallback": (s.get("fallback") or {}).get("reason"), "stop_reason": done.get("stop_reason")}


def response(call: Call, model: str, done: dict) -> dict:
    """The whole answer (stream: false)."""
    finish = FINISH.get(done.get("stop_reason"), "stop")
    text = done.get("text") or ""
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
              if call.chat else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
    return {"id": call.response_id, "object": call.object, "created": call.created, "model": model,
            "choices": [choice], "usage": usage(done.get("stats")), "dflash": extension(done)}


def chunk(call: Call, model: str, text: str | None = None, finish: str | None = None, first: bool = False,
          extra: dict | None = None) -> dict:
    """One streamed piece; `extra` adds top-level fields (usage, dflash)."""
    if call.chat:
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    return {"id": call.response_id, "object": f"{call.object}.chunk" if call.chat else call.object,
            "created": call.created, "model": model, "choices": [choice], **(extra or {})}


def usage_chunk(call: Call, model: str, done: dict) -> dict:
    return {"id": call.response_id, "object": f"{call.object}.chunk" if call.chat else call.object,
            "created": call.created, "model": model, "choices": [], "usage": usage(done.get("stats"))}
