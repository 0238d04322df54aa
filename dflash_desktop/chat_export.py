"""A chat as a file: Markdown to read or share, JSON to keep or move to another computer (every answer with its
stats and versions), and the JSON read back. Reading trusts nothing in the file: it reads regular files only,
within a size bound; the schema version and every role, type and size are checked, down to each figure in an
answer's stats and error, and a bad file is refused with a message naming the field before anything is added
to the chat store. Fields this version does not know are dropped: nothing reads them. JSON only: nothing in a
file is ever executed or unpickled."""
from __future__ import annotations

import json
import time
from pathlib import Path

from engine.errors import SettingsError
from engine.limits import LIMITS

from . import paths
from .chat_store import CHAT_SETTINGS, ChatStore, Conversation, Message
from .session import author_text

FORMAT = "dflash-desktop-chat"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 64 * 2**20        # far above any real chat; a bigger file is not one of ours
MAX_MESSAGES = 10_000
MAX_TEXT_CHARS = 4 * 2**20         # one message, one title or one system prompt
MAX_VERSIONS = 100
MAX_ITEMS = 100_000                # one list in an answer's stats, or its spans
TOP_COUNT = 2**53                  # tokens, steps, bytes, a process id
TOP_NUMBER = 1e15                  # rates, seconds, shares
ROLES = ("system", "user", "assistant")
# What the window reads of an answer's stats (engine/stats.py Stats.to_dict, plus what the window and a remote
# server add) and of its error (engine/protocol.py error_event, plus a crash's details): each value of its
# kind, or null. A nested dict is an object of such fields.
STATS_FIELDS = {
    **dict.fromkeys(("block_size", "prompt_tokens", "generated_tokens", "drafted", "accepted", "steps",
                     "peak_memory_bytes", "cuda_peak_bytes", "cuda_reserved_bytes"), "count"),
    **dict.fromkeys(("acceptance_rate", "tau", "ttft_s", "prefill_s", "prefill_tok_s", "decode_s", "decode_tok_s",
                     "end_to_end_tok_s", "cpu_other", "cpu_wall_s"), "number"),
    "acceptance_lengths": "counts", "histogram": "counts", "position_rates": "numbers", "unknown": "texts",
    "fallback": {"reason": "text", "after_tokens": "count",
                 **dict.fromkeys(("tau", "break_even", "dflash_step_ms", "plain_step_ms", "speed_share"), "number")},
    "remote": {"server": "text", "note": "text"},
    "method": "text", "speculation": "text",
    "model": {**dict.fromkeys(("id", "name", "engine", "device", "dtype", "baseline_key"), "text"),
              "has_drafter": "flag", "chat": "flag"},
}
ERROR_FIELDS = {"id": "text", "code": "text", "message": "text", "exit_code": "integer", "signal": "text",
                "pid": "count", "stderr_tail": "texts", "log_path": "text"}


class ChatImportError(ValueError):
    """The file is not a chat this version can import; the message names the problem and what to do."""


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    """The chat as people read it: title, system prompt, then each turn under its speaker."""
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += [f"> System prompt: {conversation.system_prompt}", ""]
    for m in messages:
        speaker = {"user": "You", "system": "System"}.get(m.role) or author_text(m.stats)
        model = (m.stats or {}).get("model") if m.role == "assistant" else None
        if model:
            speaker += f" ({model.get('engine')} engine on {model.get('device')}, {model.get('dtype')})"
        version = f" (version {m.version + 1} of {len(m.versions)})" if m.versions else ""
        lines += [f"## {speaker}{version}", "", m.content, ""]
    return "\n".join(lines)


def to_json(conversation: Conversation, messages: list[Message]) -> dict:
    return {"format": FORMAT, "version": FORMAT_VERSION, "exported": time.time(),
            "title": conversation.title, "system_prompt": conversation.system_prompt,
            "created": conversation.created, **{k: conversation.settings.get(k) for k in CHAT_SETTINGS},
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
        data = json.loads(paths.read_small_file(path, MAX_FILE_BYTES).decode("utf-8"),
                          parse_constant=_refuse_constant)
    except paths.FileTooLargeError:
        raise ChatImportError(f"{path.name} is larger than {MAX_FILE_BYTES // 2**20} MB, more than any chat export. "
                              "Choose a chat exported as JSON.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatImportError(f"{path.name} could not be read ({exc}).") from exc
    except ChatImportError as exc:   # NaN or Infinity, which JSON does not allow
        raise ChatImportError(f"{path.name} cannot be imported: {exc}. Nothing was added.") from exc
    except RecursionError:
        raise ChatImportError(f"{path.name} cannot be imported: its JSON is nested too deeply to be a chat export. "
                              "Nothing was added.") from None
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
    settings = {name: check.setting(data.get(name), name) for name in CHAT_SETTINGS}
    created = check.number(data.get("created"), "created", 0.0, 1e11) or time.time()
    raw = data.get("messages")
    check.that(isinstance(raw, list), "has no \"messages\" list")
    check.that(len(raw) <= MAX_MESSAGES, f"has {len(raw)} messages, more than {MAX_MESSAGES:,}")
    messages = [_message(check, m, i + 1) for i, m in enumerate(raw)]
    return Conversation(0, title, system_prompt, created, created,
                        {k: v for k, v in settings.items() if v is not None}), messages


def _message(check: "_Checker", m, number: int) -> Message:
    where = f"message {number}"
    check.that(isinstance(m, dict), f"has a {where} that is not an object")
    role = m.get("role")
    check.that(role in ROLES, f"has a {where} with role {role!r} (allowed: {', '.join(ROLES)})")
    answer = _answer(check, m, where)
    versions, version = m.get("versions"), m.get("version", 0)
    if versions is not None:
        check.that(role == "assistant" and isinstance(versions, list) and 1 <= len(versions) <= MAX_VERSIONS,
                   f"has a {where} whose \"versions\" are not a list of 1 to {MAX_VERSIONS} answers")
        for i, v in enumerate(versions):
            check.that(isinstance(v, dict), f"has a {where} whose version {i + 1} is not an object")
        versions = [{**_answer(check, v, f"{where} version {i + 1}"),
                     "prompt": check.optional(v.get("prompt"), "text", f"{where} version {i + 1} prompt")}
                    for i, v in enumerate(versions)]
    check.that(type(version) is int and 0 <= version < max(1, len(versions or ())),
               f"has a {where} whose \"version\" does not name one of its versions")
    created = check.number(m.get("created"), f"{where} created", 0.0, 1e11) or time.time()
    return Message(0, 0, role, answer["content"], answer["spans"], answer["stats"], answer["stop_reason"],
                   answer["error"], created, versions, version)


def _answer(check: "_Checker", m: dict, where: str) -> dict:
    """The fields a message and each version of an answer share, checked: what the window draws from."""
    spans = m.get("spans")
    check.that(spans is None or (isinstance(spans, list) and len(spans) <= MAX_ITEMS and all(
        isinstance(s, list) and len(s) == 2 and isinstance(s[1], bool) for s in spans)),
        f"has a {where} whose \"spans\" are not [text, drafted] pairs")
    spans = None if spans is None else [[check.text(s[0], f"{where} spans[{i}] text"), s[1]]
                                        for i, s in enumerate(spans)]
    stop_reason = check.optional(m.get("stop_reason"), "text", f"{where} stop_reason")
    check.that(len(stop_reason or "") <= 40, f"has a {where} whose \"stop_reason\" is not a short text")
    if stop_reason == "generating":   # the app was closed while it was written: what arrived is kept
        stop_reason = "cancelled"
    stats = check.optional(m.get("stats"), STATS_FIELDS, f"{where} stats")
    check.that(not (stats or {}).get("fallback") or isinstance(stats["fallback"].get("reason"), str),
               f"has a {where} whose \"stats.fallback\" gives no \"reason\" text")
    return {"content": check.text(m.get("content"), f"{where} content"), "spans": spans, "stats": stats,
            "stop_reason": stop_reason, "error": check.optional(m.get("error"), ERROR_FIELDS, f"{where} error")}


class _Checker:
    """Each check raises ChatImportError naming the file, the field and what is wrong with it."""

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
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            self.that(False, f"has a \"{field}\" holding a lone surrogate (half of a UTF-16 pair, such as "
                             "\\ud800), which is not valid Unicode text")
        return value

    def number(self, value, field: str, low: float, high: float) -> float | None:
        # compared before anything converts it: NaN fails every comparison, and 10**400 never becomes a float
        self.that(value is None or (type(value) in (int, float) and low <= value <= high),
                  f"has a \"{field}\" that is not a number from {low:g} to {high:g}")
        return None if value is None else float(value)

    def setting(self, value, name: str):
        """A chat's own sampling setting, held to the engine's limits, or None (the global one)."""
        if value is None:
            return None
        self.that(type(value) in (int, float), f"has a \"{name}\" that is not a number")
        try:
            return LIMITS[name].check(value, name)
        except SettingsError:
            self.that(False, f"has a \"{name}\" that is not {LIMITS[name].describe()}")

    def optional(self, value, kind, field: str):
        """``value`` checked as ``kind`` (see STATS_FIELDS), or None."""
        return None if value is None else self.value(value, kind, field)

    def value(self, value, kind, field: str):
        if isinstance(kind, dict):   # an object: known fields checked (each may be null), unknown ones dropped
            self.that(isinstance(value, dict), f"has a \"{field}\" that is not an object")
            return {key: self.optional(value[key], kind[key], f"{field}.{key}") for key in kind if key in value}
        if kind in ("counts", "numbers", "texts"):
            self.that(isinstance(value, list) and len(value) <= MAX_ITEMS,
                      f"has a \"{field}\" that is not a list of at most {MAX_ITEMS:,} items")
            return [self.value(item, kind[:-1], f"{field}[{i}]") for i, item in enumerate(value)]
        if kind == "text":
            return self.text(value, field)
        if kind == "flag":
            self.that(isinstance(value, bool), f"has a \"{field}\" that is not true or false")
            return value
        if kind == "number":
            self.that(value is not None, f"has a \"{field}\" that is not a number")
            return self.number(value, field, 0.0, TOP_NUMBER)
        low = 0 if kind == "count" else -TOP_COUNT   # "integer": an exit status may be negative (a signal)
        self.that(type(value) is int and low <= value <= TOP_COUNT,
                  f"has a \"{field}\" that is not a whole number from {low:,} to {TOP_COUNT:,}")
        return value
