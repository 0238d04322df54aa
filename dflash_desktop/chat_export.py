"""A chat as a file: Markdown to read or share, JSON to keep or move to another computer (every answer with its
stats and versions), and the JSON read back. Reading trusts nothing in the file: the schema version, every
role, type and size is checked, and a bad file is refused with a message naming the problem before anything
is added to the chat store. JSON only: nothing in a file is ever executed or unpickled."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from engine.limits import LIMITS

from .chat_store import ChatStore, Conversation, Message

FORMAT = "dflash-desktop-chat"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 64 * 2**20        # far above any real chat; a bigger file is not one of ours
MAX_MESSAGES = 10_000
MAX_TEXT_CHARS = 4 * 2**20         # one message, one title or one system prompt
MAX_VERSIONS = 100
ROLES = ("system", "user", "assistant")


class ChatImportError(ValueError):
    """The file is not a chat this version can import; the message names the problem and what to do."""


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    """The chat as people read it: title, system prompt, then each turn under its speaker."""
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += [f"> System prompt: {conversation.system_prompt}", ""]
    for m in messages:
        speaker = {"user": "You", "assistant": "DFlash", "system": "System"}[m.role]
        version = f" (version {m.version + 1} of {len(m.versions)})" if m.versions else ""
        lines += [f"## {speaker}{version}", "", m.content, ""]
    return "\n".join(lines)


def to_json(conversation: Conversation, messages: list[Message]) -> dict:
    return {"format": FORMAT, "version": FORMAT_VERSION, "exported": time.time(),
            "title": conversation.title, "system_prompt": conversation.system_prompt,
            "created": conversation.created, "temperature": conversation.temperature,
            "max_new_tokens": conversation.max_new_tokens,
            "messages": [{"role": m.role, "content": m.content, "spans": m.spans, "stats": m.stats,
                          "stop_reason": m.stop_reason, "error": m.error, "created": m.created,
                          "versions": m.versions, "version": m.version} for m in messages]}


def export_chat(store: ChatStore, conversation_id: int, path: Path | str) -> Path:
    """Write the chat to ``path`` (the one the user chose): JSON for a .json name, else Markdown."""
    path = Path(path)
    conversation, messages = store.conversation(conversation_id), store.messages(conversation_id)
    if conversation is None:
        raise ValueError(f"There is no chat {conversation_id} to export.")
    if path.suffix.lower() == ".json":
        text = json.dumps(to_json(conversation, messages), ensure_ascii=False, indent=1)
    else:
        text = to_markdown(conversation, messages)
    path.write_text(text, encoding="utf-8")
    return path


def import_chat(store: ChatStore, path: Path | str) -> Conversation:
    """Add the chat in a JSON file written by ``export_chat`` as a new chat; all of it or nothing."""
    conversation, messages = read_json(path)
    return store.import_conversation(conversation, messages)


def read_json(path: Path | str) -> tuple[Conversation, list[Message]]:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ChatImportError(f"{path.name} is {path.stat().st_size / 2**20:.0f} MB, more than any chat "
                                  f"export ({MAX_FILE_BYTES // 2**20} MB at most). Choose a chat exported as JSON.")
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatImportError(f"{path.name} could not be read ({exc}).") from exc
    except ChatImportError as exc:   # NaN or Infinity, which JSON does not allow
        raise ChatImportError(f"{path.name} cannot be imported: {exc}. Nothing was added.") from exc
    except json.JSONDecodeError as exc:
        raise ChatImportError(f"{path.name} is not JSON (line {exc.lineno}: {exc.msg}). Choose a chat exported "
                              "as JSON by DFlash Desktop (a Markdown export cannot be imported).") from exc
    return _parse(data, path.name)


def _refuse_constant(name: str):
    raise ChatImportError(f"it contains {name}, which is not a number JSON allows")


def _parse(data, name: str) -> tuple[Conversation, list[Message]]:
    check = _Checker(name)
    check.that(isinstance(data, dict) and data.get("format") == FORMAT,
               "is not a DFlash Desktop chat export (no \"format\": \"dflash-desktop-chat\")")
    version = data.get("version")
    check.that(type(version) is int, "has no whole-number \"version\"")
    check.that(version <= FORMAT_VERSION, f"was written by a newer DFlash Desktop (chat export version {version}; "
                                          f"this version reads up to {FORMAT_VERSION}): update DFlash Desktop")
    check.that(version >= 1, f"has an unknown chat export version {version}")
    title = check.text(data.get("title"), "title", allow_empty=False)
    system_prompt = check.text(data.get("system_prompt", ""), "system_prompt")
    temperature = check.number(data.get("temperature"), "temperature", 0.0, LIMITS["temperature"].high)
    max_new_tokens, top = data.get("max_new_tokens"), int(LIMITS["max_new_tokens"].high)
    check.that(max_new_tokens is None or (type(max_new_tokens) is int and 1 <= max_new_tokens <= top),
               f"has a \"max_new_tokens\" that is not a whole number from 1 to {top:,}")
    created = check.number(data.get("created"), "created", 0.0, 1e11) or time.time()
    raw = data.get("messages")
    check.that(isinstance(raw, list), "has no \"messages\" list")
    check.that(len(raw) <= MAX_MESSAGES, f"has {len(raw)} messages, more than {MAX_MESSAGES:,}")
    messages = [_message(check, m, i + 1) for i, m in enumerate(raw)]
    return Conversation(0, title, system_prompt, created, created, temperature, max_new_tokens), messages


def _message(check: "_Checker", m, number: int) -> Message:
    where = f"message {number}"
    check.that(isinstance(m, dict), f"has a {where} that is not an object")
    role = m.get("role")
    check.that(role in ROLES, f"has a {where} with role {role!r} (allowed: {', '.join(ROLES)})")
    content = check.text(m.get("content"), f"{where} content")
    spans = m.get("spans")
    check.that(spans is None or (isinstance(spans, list) and all(
        isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and isinstance(s[1], bool) for s in spans)),
        f"has a {where} whose \"spans\" are not [text, drafted] pairs")
    for key in ("stats", "error"):
        check.that(m.get(key) is None or isinstance(m.get(key), dict),
                   f"has a {where} whose \"{key}\" is not an object")
    stop_reason = m.get("stop_reason")
    check.that(stop_reason is None or (isinstance(stop_reason, str) and len(stop_reason) <= 40),
               f"has a {where} whose \"stop_reason\" is not a short text")
    if stop_reason == "generating":   # the app was closed while it was written: what arrived is kept
        stop_reason = "cancelled"
    versions, version = m.get("versions"), m.get("version", 0)
    if versions is not None:
        check.that(role == "assistant" and isinstance(versions, list) and 1 <= len(versions) <= MAX_VERSIONS,
                   f"has a {where} whose \"versions\" are not a list of 1 to {MAX_VERSIONS} answers")
        for i, v in enumerate(versions):
            check.that(isinstance(v, dict), f"has a {where} whose version {i + 1} is not an object")
            check.text(v.get("content"), f"{where} version {i + 1} content")
            check.that(v.get("prompt") is None or isinstance(v.get("prompt"), str),
                       f"has a {where} whose version {i + 1} prompt is not text")
    check.that(type(version) is int and 0 <= version < max(1, len(versions or ())),
               f"has a {where} whose \"version\" does not name one of its versions")
    created = check.number(m.get("created"), f"{where} created", 0.0, 1e11) or time.time()
    return Message(0, 0, role, content, spans, m.get("stats"), stop_reason, m.get("error"), created, versions, version)


class _Checker:
    """Each check raises ChatImportError naming the file and what is wrong in it."""

    def __init__(self, name: str):
        self.name = name

    def that(self, ok: bool, problem: str) -> None:
        if not ok:
            raise ChatImportError(f"{self.name} cannot be imported: it {problem}. Nothing was added.")

    def text(self, value, field: str, allow_empty: bool = True) -> str:
        self.that(isinstance(value, str), f"has a \"{field}\" that is not text")
        self.that(allow_empty or value.strip(), f"has an empty \"{field}\"")
        self.that(len(value) <= MAX_TEXT_CHARS, f"has a \"{field}\" of {len(value):,} characters, more than "
                                                f"{MAX_TEXT_CHARS:,}")
        return value

    def number(self, value, field: str, low: float, high: float) -> float | None:
        self.that(value is None or (type(value) in (int, float) and math.isfinite(value) and low <= value <= high),
                  f"has a \"{field}\" that is not a number from {low:g} to {high:g}")
        return None if value is None else float(value)
