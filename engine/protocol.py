"""The wire protocol between the GUI process and the engine worker: JSON objects, one per line.

Pure standard library on purpose: the GUI imports this module, and the GUI must never pull in torch.
The full description, with examples, is docs/PROTOCOL.md; this module is its executable form.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .backends import ENGINES, check_format
from .errors import EngineError
from .limits import GenerationSettings

PROTOCOL_VERSION = 2
MAX_LINE_BYTES = 64 * 1024 * 1024   # a line longer than this is refused, not buffered forever

# Commands (GUI -> worker). Each maps field -> (accepted types, required).
_STR, _INT, _NUM, _BOOL, _LIST, _DICT, _NONE = str, int, (int, float), bool, list, dict, type(None)
COMMANDS: dict[str, dict[str, tuple[tuple[type, ...] | type, bool]]] = {
    "hello": {"protocol": (_INT, True), "app_version": ((_STR, _NONE), False)},
    "load_pair": {"target": (_STR, True), "draft": ((_STR, _NONE), False), "engine": ((_STR, _NONE), False),
                  "device": ((_STR, _NONE), False), "dtype": ((_STR, _NONE), False), "compare": ((_BOOL, _LIST), False)},
    "generate": {"messages": ((_LIST, _NONE), False), "prompt": ((_STR, _NONE), False),
                 "prompt_ids": ((_LIST, _NONE), False), "raw": (_BOOL, False),
                 "enable_thinking": ((_BOOL, _NONE), False), "settings": ((_DICT, _NONE), False),
                 "mode": (_STR, False)},
    "count_tokens": {"messages": ((_LIST, _NONE), False), "prompt": ((_STR, _NONE), False), "raw": (_BOOL, False),
                     "enable_thinking": ((_BOOL, _NONE), False)},
    "cancel": {"target_id": ((_STR, _NONE), False)},
    "unload": {},
    "hardware": {},
    "shutdown": {},
}

# Events (worker -> GUI). Terminal events end the request whose id they carry.
TERMINAL_EVENTS = frozenset({"hello", "loaded", "done", "ok", "hardware", "count", "error"})
PROGRESS_EVENTS = frozenset({"progress", "tokens", "warning"})
EVENTS = TERMINAL_EVENTS | PROGRESS_EVENTS

MODES = ("dflash", "baseline")
ROLES = ("system", "user", "assistant")   # what the window and the local server send (developer becomes system)

# Error codes: a stable, machine-readable reason next to a plain-language message.
ERROR_CODES = {
    # protocol
    "bad_message": "The line is not a valid JSON command.",
    "unknown_command": "The worker does not know this command.",
    "version_mismatch": "GUI and worker speak different protocol versions.",
    "busy": "A generation is already running; cancel it or wait.",
    "no_pair": "No model is loaded.",
    # engine (engine.errors codes pass through unchanged)
    "bad_checkpoint": "A model folder is missing files or cannot be read.",
    "pair_mismatch": "The drafter does not belong to this target.",
    "prompt_too_long": "The prompt does not fit the model's context.",
    "bad_settings": "A generation setting is out of range.",
    "device_unavailable": "The requested device (cuda, mps) is not available to the engine.",
    "unsupported_architecture": "The engine does not run this kind of model on this device.",
    "template_error": "The model's chat template failed or took too long.",
    "out_of_memory": "The model or the generation did not fit in memory.",
    "engine_unavailable": "The engine's libraries (torch, transformers) could not be imported.",
    "cancelled": "The request was cancelled before it finished (a load stops between its stages).",
    "internal": "An unexpected error inside the worker.",
    # raised by the client, never by the worker
    "worker_crashed": "The engine process stopped unexpectedly.",
    "engine_crashed": "The engine's own server (llama-server) stopped; the worker lives and can load again.",
    "worker_start_failed": "The engine process could not be started.",
    "worker_stopped": "The engine was stopped on request before it answered.",
    "timeout": "The engine did not answer in time.",
    # raised by the remote client (dflash_desktop/remote.py), for a pair on an OpenAI-compatible server
    "remote_unreachable": "The server could not be reached, or stopped answering.",
    "remote_error": "The server refused the request or answered something that is not OpenAI's format.",
}


class ProtocolError(Exception):
    """A message that breaks the protocol; `code` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def encode(message: dict[str, Any]) -> bytes:
    """One message as one UTF-8 line. Non-ASCII text stays readable; NaN is refused (not JSON). Text that
    UTF-8 cannot hold (an unpaired surrogate, say in an id echoed back) is written as JSON escapes
    instead, so every message can be sent and the other side always reads valid JSON."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return (text + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    """Parse one line into a JSON object, or raise ProtocolError('bad_message'), whatever the line holds."""
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError("bad_message", f"Line of {len(line)} bytes exceeds the {MAX_LINE_BYTES}-byte limit.")
    try:
        obj = json.loads(line)
    except RecursionError:
        raise ProtocolError("bad_message", "Not a command: the JSON is nested too deeply.") from None
    except Exception as exc:  # noqa: BLE001 (ValueError, UnicodeDecodeError, MemoryError: anything the parser raises)
        raise ProtocolError("bad_message", f"Not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_message", f"Expected a JSON object, got {type(obj).__name__}.")
    return obj


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unpaired_surrogate(msg: dict[str, Any]) -> str | None:
    """Where a command holds text that is not valid Unicode (a lone UTF-16 surrogate, which JSON can
    escape but UTF-8 cannot hold), or None. Iterative, so no nesting the parser accepts can overflow it."""
    todo: list[tuple[str, Any]] = [("", msg)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return f"field {where!r}"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return f"field name {ascii(key)}"
                todo.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):
            todo.extend((f"{where}[{i}]", item) for i, item in enumerate(value) if isinstance(item, (str, dict, list)))
    return None


def _type_ok(value: Any, types) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true is not an integer here
    return isinstance(value, types)


def validate_command(msg: dict[str, Any]) -> dict[str, Any]:
    """Check a command's name, id and field types; return it unchanged or raise ProtocolError."""
    cmd = msg.get("cmd")
    if not isinstance(cmd, str):
        raise ProtocolError("bad_message", 'A command needs a string field "cmd".')
    if "id" in msg and not isinstance(msg["id"], str):
        raise ProtocolError("bad_message", 'The "id" field must be a string.')
    bad_text = _unpaired_surrogate(msg)
    if bad_text:
        raise ProtocolError("bad_message", f"The {bad_text} holds an unpaired surrogate (half of a UTF-16 pair, "
                            "such as \\ud800), which is not valid Unicode text: send valid UTF-8 text.")
    schema = COMMANDS.get(cmd)
    if schema is None:
        raise ProtocolError("unknown_command", f"Unknown command {cmd!r}; known: {', '.join(COMMANDS)}.")
    for name, (types, required) in schema.items():
        if name not in msg:
            if required:
                raise ProtocolError("bad_message", f"{cmd}: missing field {name!r}.")
            continue
        if not _type_ok(msg[name], types):
            raise ProtocolError("bad_message", f"{cmd}: field {name!r} has the wrong type ({type(msg[name]).__name__}).")
    extra = set(msg) - set(schema) - {"cmd", "id"}
    if extra:
        raise ProtocolError("bad_message", f"{cmd}: unknown field(s) {', '.join(sorted(extra))}.")
    if cmd == "generate":
        _validate_generate(msg)
    if cmd == "count_tokens":
        _validate_prompt(msg, ("messages", "prompt"))
    if cmd == "load_pair":
        compare = msg.get("compare")
        if isinstance(compare, list) and not all(isinstance(e, str) and e in ENGINES for e in compare):
            raise ProtocolError("bad_message", f"load_pair: compare lists engines of this build ({', '.join(ENGINES)}).")
        try:    # the engines' own declarations (engine/backends), the same check the planner makes
            check_format(msg.get("engine"), msg.get("dtype"))
        except EngineError as exc:
            raise ProtocolError("bad_message", f"load_pair: {exc}") from None
    return msg


def _validate_prompt(msg: dict[str, Any], kinds: tuple[str, ...]) -> None:
    """generate and count_tokens take their prompt the same way, so a count is of what generate would run."""
    cmd = msg["cmd"]
    if len([k for k in kinds if msg.get(k) is not None]) != 1:
        raise ProtocolError("bad_message", f"{cmd}: give exactly one of {', '.join(kinds[:-1])} or {kinds[-1]}.")
    if msg.get("messages") == []:
        raise ProtocolError("bad_message", f"{cmd}: messages is empty; send at least one message.")
    for i, m in enumerate(msg.get("messages") or []):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ProtocolError("bad_message", f'{cmd}: each message needs string "role" and "content" '
                                f"(messages[{i}] is {type(m).__name__ if not isinstance(m, dict) else 'incomplete'}).")
        if m["role"] not in ROLES:
            raise ProtocolError("bad_message", f"{cmd}: messages[{i}] has role {m['role']!r}; a role is one of "
                                f"{', '.join(ROLES)}.")


def _validate_generate(msg: dict[str, Any]) -> None:
    _validate_prompt(msg, ("messages", "prompt", "prompt_ids"))
    if msg.get("mode", "dflash") not in MODES:
        raise ProtocolError("bad_message", f"generate: mode must be one of {', '.join(MODES)}.")
    ids = msg.get("prompt_ids")
    if ids is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ProtocolError("bad_message", "generate: prompt_ids must be non-negative integers.")
    try:
        GenerationSettings.from_dict(msg.get("settings") or {})
    except EngineError as exc:
        raise ProtocolError("bad_settings", f"generate: {exc}") from None


def error_event(code: str, message: str, request_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """The one shape every error takes, on both sides of the pipe."""
    return {"event": "error", "id": request_id, "code": code, "message": message, **extra}


def is_terminal(event: dict[str, Any]) -> bool:
    return event.get("event") in TERMINAL_EVENTS
