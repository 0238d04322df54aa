"""Conversations and their messages in one SQLite file in the data folder.

Every assistant message keeps its statistics (JSON), its stop reason and the drafted/target spans, so
the footer and the highlighting come back after a restart. An answer written again (regenerate, or an edit of
the question before it) keeps its earlier versions: the message's own columns hold the version shown, which is
what later turns are sent with, and ``versions`` (JSON) all of them. A chat may override the global
sampling settings of CHAT_SETTINGS (NULL: the global setting). The schema carries a version
(PRAGMA user_version) and upgrades step by step when the app is newer than the file.

Start-up never fails on this file: ``open_store`` moves a damaged file aside, opens a newer or an
unwritable one read-only, and says what it did in a notice the window shows.
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import paths

SCHEMA_VERSION = 3
DEFAULT_TITLE = "New chat"
# the settings a chat may set itself, each a column of conversations (NULL: the global setting)
CHAT_SETTINGS = ("temperature", "max_new_tokens", "repeat_penalty", "min_p", "seed", "context_length")

_SCHEMA_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    spans TEXT,          -- JSON [[text, drafted], ...] for assistant messages
    stats TEXT,          -- JSON stats of the done event
    stop_reason TEXT,    -- length, eos, stop, cancelled, error ...
    error TEXT,          -- JSON error event when the answer ended in an error
    created REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
"""

_SCHEMA_V2 = """
ALTER TABLE conversations ADD COLUMN temperature REAL;        -- NULL: the global setting
ALTER TABLE conversations ADD COLUMN max_new_tokens INTEGER;  -- NULL: the global setting
ALTER TABLE messages ADD COLUMN versions TEXT;   -- JSON [{content, spans, stats, stop_reason, error, prompt}, ...]
ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 0;   -- the one shown (and sent)
"""
_SCHEMA_V3 = """
ALTER TABLE conversations ADD COLUMN repeat_penalty REAL;     -- NULL: the global setting, as the ones below
ALTER TABLE conversations ADD COLUMN min_p REAL;
ALTER TABLE conversations ADD COLUMN seed INTEGER;
ALTER TABLE conversations ADD COLUMN context_length INTEGER;
"""
_VERSION_FIELDS = ("content", "spans", "stats", "stop_reason", "error")


# SQLite primary result codes (extended codes keep them in the low byte)
_CORRUPT, _NOTADB, _READONLY, _CANTOPEN = 11, 26, 8, 14
_COMPANIONS = ("-wal", "-shm", "-journal")  # SQLite's files beside the database, moved along with it


class ChatStoreError(RuntimeError):
    """The chat file cannot be used or written; the message says why and what to do, for the window to show."""


class NewerSchemaError(ChatStoreError):
    """Written by a newer version: this one may show the chats but must not change the file."""

    def __init__(self, path: Path, version: int):
        self.reason = (f"Your chats were saved by a newer version of DFlash Desktop (chat file version {version}; "
                       f"this version understands up to {SCHEMA_VERSION}). They are shown read-only: update "
                       "DFlash Desktop to add or change chats.")
        super().__init__(f"{path}: {self.reason}")


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float
    settings: dict = field(default_factory=dict)   # of CHAT_SETTINGS, those this chat sets itself

    @property
    def overrides(self) -> dict:
        """The generation settings this chat sets itself, for the worker request and the header."""
        return {k: self.settings[k] for k in CHAT_SETTINGS if self.settings.get(k) is not None}


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    spans: list | None = None
    stats: dict | None = None
    stop_reason: str | None = None
    error: dict | None = None
    created: float = field(default_factory=time.time)
    versions: list | None = None   # every version of this answer when it was written more than once
    version: int = 0               # the index of the one shown

    def snapshot(self, prompt: str | None = None) -> dict:
        """This message's shown version as stored in ``versions`` (``prompt``: the question it answered)."""
        return {"content": self.content, "spans": self.spans, "stats": self.stats, "stop_reason": self.stop_reason,
                "error": self.error, "prompt": prompt}


def default_path() -> Path:
    return paths.data_dir() / "chats.sqlite3"


def _writes(method):
    """A method that changes the file: refused on a read-only store, and a failed write (disk full, file made
    read-only meanwhile) becomes a ChatStoreError the window can show instead of a traceback."""
    @functools.wraps(method)
    def write(self, *args, **kwargs):
        if self.read_only:
            raise ChatStoreError(f"Nothing was saved. {self.read_only}")
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError as exc:
            raise ChatStoreError(f"Nothing was saved: the chat file {self.path} could not be written ({exc}). "
                                 "Check that its disk has free space and its folder is writable.") from exc
    return write


class ChatStore:
    """Small synchronous store: every call is one short transaction on the GUI thread (milliseconds)."""

    def __init__(self, path: Path | str | None = None, *, read_only: str | None = None):
        """``read_only``: why the file must not change (a sentence for the user); the file is then opened
        read-only, never migrated, and every writing method raises ChatStoreError with that sentence."""
        self.path = Path(path) if path else default_path()
        self.read_only = read_only
        self._db = _connect_read_only(self.path) if read_only else sqlite3.connect(str(self.path))
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            if not read_only:
                self._migrate()
        except BaseException:
            self._db.close()  # an open handle would keep a damaged file from being moved aside (Windows)
            raise

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        """Upgrade the schema; a newer file is refused before anything in it changes (even its journal mode)."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(self.path, version)
        self._db.execute("PRAGMA journal_mode = WAL")
        with self._db:  # written even when current: this is also the check that the file can be written
            if version < 1:
                self._db.executescript(_SCHEMA_V1)
            for step, script in ((2, _SCHEMA_V2), (3, _SCHEMA_V3)):
                if version < step:
                    if not self._db.in_transaction:   # one step: a failed upgrade leaves the file as it was
                        self._db.execute("BEGIN")
                    for statement in filter(str.strip, script.split(";")):
                        self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- conversations ------------------------------------------------------------------------------
    @_writes
    def create_conversation(self, title: str = DEFAULT_TITLE, system_prompt: str = "") -> Conversation:
        now = time.time()
        with self._db:
            cur = self._db.execute("INSERT INTO conversations (title, system_prompt, created, updated) "
                                   "VALUES (?, ?, ?, ?)", (title, system_prompt, now, now))
        return Conversation(cur.lastrowid, title, system_prompt, now, now)

    def conversations(self) -> list[Conversation]:
        """Most recently updated first."""
        rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [_conversation(r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        r = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return _conversation(r) if r else None

    @_writes
    def update_conversation(self, conversation_id: int, *, title: str | None = None,
                            system_prompt: str | None = None) -> None:
        """A new system prompt counts as activity (the chat moves to the top); a new title does not."""
        sets, args = [], []
        if title is not None:
            sets.append("title = ?")
            args.append(title)
        if system_prompt is not None:
            sets += ["system_prompt = ?", "updated = ?"]
            args += [system_prompt, time.time()]
        if not sets:
            return
        with self._db:
            self._db.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?", (*args, conversation_id))

    @_writes
    def set_chat_settings(self, conversation_id: int, overrides: dict) -> None:
        """This chat's own settings (of CHAT_SETTINGS); one left out goes back to the global setting."""
        with self._db:
            self._db.execute(f"UPDATE conversations SET {', '.join(f'{k} = ?' for k in CHAT_SETTINGS)} WHERE id = ?",
                             (*(overrides.get(k) for k in CHAT_SETTINGS), conversation_id))

    def search(self, text: str) -> list[Conversation]:
        """Chats whose title or any message (any version of an answer) contains ``text``, ignoring case;
        most recently updated first."""
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m "
            "WHERE m.conversation_id = c.id AND (m.content LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM "
            "json_each(m.versions) v WHERE json_extract(v.value, '$.content') LIKE ?1 ESCAPE '\\'))) "
            "ORDER BY updated DESC, id DESC", (pattern,)).fetchall()
        return [_conversation(r) for r in rows]

    @_writes
    def delete_conversation(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -----------------------------------------------------------------------------------
    @_writes
    def add_message(self, conversation_id: int, role: str, content: str, *, spans: list | None = None,
                    stats: dict | None = None, stop_reason: str | None = None, error: dict | None = None) -> Message:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, spans, stats, stop_reason, error, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, _dump(spans), _dump(stats), stop_reason, _dump(error), now))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return Message(cur.lastrowid, conversation_id, role, content, spans, stats, stop_reason, error, now)

    @_writes
    def update_message(self, message_id: int, *, content: str | None = None, spans: list | None = None,
                       stats: dict | None = None, stop_reason: str | None = None, error: dict | None = None) -> None:
        sets, args = [], []
        for name, value, raw in (("content", content, True), ("spans", spans, False), ("stats", stats, False),
                                 ("stop_reason", stop_reason, True), ("error", error, False)):
            if value is not None:
                sets.append(f"{name} = ?")
                args.append(value if raw else _dump(value))
        if not sets:
            return
        with self._db:
            self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, message_id))
            self._sync_version(message_id)

    def _sync_version(self, message_id: int) -> None:
        """Copy the message's columns into its shown version, so ``versions`` always holds every version."""
        message = self.message(message_id)
        if message is None or not message.versions:
            return
        versions = list(message.versions)
        versions[message.version] = message.snapshot(versions[message.version].get("prompt"))
        self._db.execute("UPDATE messages SET versions = ? WHERE id = ?", (_dump(versions), message_id))

    def message(self, message_id: int) -> Message | None:
        r = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return _message(r) if r else None

    @_writes
    def new_version(self, message_id: int, prompt: str | None = None) -> int:
        """Start another version of an answer, regenerated or (``prompt``: the edited question) answering an
        edit: the versions so far are kept, the message becomes empty and "generating". Returns its index."""
        message = self.message(message_id)
        before = self._user_before(message)
        if prompt is None:
            prompt = before.content if before else ""
        versions = list(message.versions or [message.snapshot(before.content if before else None)])
        versions.append({"content": "", "spans": None, "stats": None, "stop_reason": "generating", "error": None,
                         "prompt": prompt})
        with self._db:
            self._db.execute("UPDATE messages SET content = '', spans = NULL, stats = NULL, stop_reason = "
                             "'generating', error = NULL, versions = ?, version = ? WHERE id = ?",
                             (_dump(versions), len(versions) - 1, message_id))
            if before is not None:
                self._db.execute("UPDATE messages SET content = ? WHERE id = ?", (prompt, before.id))
        return len(versions) - 1

    @_writes
    def show_version(self, message_id: int, index: int) -> None:
        """Make version ``index`` of an answer the one shown and sent with later turns, with the question it
        answered."""
        message = self.message(message_id)
        if message is None or not message.versions or not 0 <= index < len(message.versions):
            raise ValueError(f"message {message_id} has no version {index}")
        chosen = message.versions[index]
        before = self._user_before(message)
        with self._db:
            self._db.execute("UPDATE messages SET content = ?, spans = ?, stats = ?, stop_reason = ?, error = ?, "
                             "version = ? WHERE id = ?",
                             (chosen["content"], _dump(chosen.get("spans")), _dump(chosen.get("stats")),
                              chosen.get("stop_reason"), _dump(chosen.get("error")), index, message_id))
            if before is not None and chosen.get("prompt") is not None:
                self._db.execute("UPDATE messages SET content = ? WHERE id = ?", (chosen["prompt"], before.id))

    @_writes
    def discard_shown_version(self, message_id: int) -> None:
        """Forget the version shown (an answer that failed) and show the latest of the others, with its
        question. For answers written more than once: one written once is deleted instead."""
        message = self.message(message_id)
        if message is None or not message.versions or len(message.versions) < 2:
            raise ValueError(f"message {message_id} has no other version to show")
        versions = [v for i, v in enumerate(message.versions) if i != message.version]
        with self._db:
            self._db.execute("UPDATE messages SET versions = ? WHERE id = ?", (_dump(versions), message_id))
        self.show_version(message_id, len(versions) - 1)

    def _user_before(self, message: Message) -> Message | None:
        r = self._db.execute("SELECT * FROM messages WHERE conversation_id = ? AND id < ? AND role = 'user' "
                             "ORDER BY id DESC LIMIT 1", (message.conversation_id, message.id)).fetchone()
        return _message(r) if r else None

    @_writes
    def import_conversation(self, conversation: Conversation, messages: list[Message]) -> Conversation:
        """Add a whole chat (an imported file) in one transaction: all of it or, on any failure, nothing."""
        now = time.time()
        with self._db:
            cur = self._db.execute(
                f"INSERT INTO conversations (title, system_prompt, created, updated, {', '.join(CHAT_SETTINGS)}) "
                f"VALUES (?, ?, ?, ?{', ?' * len(CHAT_SETTINGS)})",
                (conversation.title, conversation.system_prompt, conversation.created, now,
                 *(conversation.settings.get(k) for k in CHAT_SETTINGS)))
            self._db.executemany(
                "INSERT INTO messages (conversation_id, role, content, spans, stats, stop_reason, error, created, "
                "versions, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(cur.lastrowid, m.role, m.content, _dump(m.spans), _dump(m.stats), m.stop_reason, _dump(m.error),
                  m.created, _dump(m.versions), m.version) for m in messages])
        return self.conversation(cur.lastrowid)

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                                (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    @_writes
    def delete_messages(self, message_ids: list[int]) -> None:
        """Delete these messages only (the oldest turns of a chat that outgrew the model's context)."""
        with self._db:
            self._db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in message_ids])

    @_writes
    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Delete a message and everything after it (regenerate, edit-and-resend)."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id))


def open_store(path: Path | str | None = None) -> tuple[ChatStore, str | None]:
    """The window's chat store whatever state its file is in, and a plain-language notice for a dialog
    (None when all is well). Call it after taking the single-instance lock: it may rename files.

    A damaged file, or a folder in its place, is moved aside (kept) and a new store starts; a file from a
    newer version, or one that cannot be written, opens read-only; anything else gives a store in memory.
    """
    try:
        path = Path(path) if path else default_path()
        if path.is_dir():
            return _start_over(path, f"A folder was found where your chat history file belongs ({path}).")
        if path.is_file():
            _inspect(path)
        return ChatStore(path), None
    except NewerSchemaError as exc:
        return _open_read_only(path, exc.reason)
    except sqlite3.DatabaseError as exc:
        if _code(exc) in (_CORRUPT, _NOTADB):
            return _start_over(path, f"Your chat history could not be read: the file is damaged ({exc}).")
        if _code(exc) in (_READONLY, _CANTOPEN) and path.is_file():
            return _open_read_only(path, f"The chat history file {path} cannot be written: it or its folder is "
                                         "read-only. Your chats are shown read-only: make the folder writable "
                                         "and restart DFlash Desktop to add or change chats.")
        return _in_memory(f"{exc} ({path})")
    except OSError as exc:  # the data folder cannot be created or looked into
        return _in_memory(str(exc))


def _inspect(path: Path) -> None:
    """Read the version and the conversation list without writing anything. A damaged or newer file is never
    opened for writing: closing a writable connection may checkpoint its -wal into it, or delete the -wal."""
    db = _connect_read_only(path)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(path, version)
        if version:
            db.execute("SELECT * FROM conversations").fetchall()
    finally:
        db.close()


def _probed(store: ChatStore) -> ChatStore:
    """Read the conversation list once, so a file this version cannot show fails here and not in the window."""
    try:
        store.conversations()
    except BaseException:
        store.close()
        raise
    return store


def _start_over(path: Path, what: str) -> tuple[ChatStore, str]:
    try:
        moved = _move_aside(path)
        store = ChatStore(path)
    except (OSError, sqlite3.Error) as exc:
        return _in_memory(f"{path} could not be moved aside or replaced: {exc}")
    return store, (f"{what} It was moved to {moved} (kept as it was, nothing deleted) and a new, empty chat "
                   "history was started.")


def _open_read_only(path: Path, reason: str) -> tuple[ChatStore, str]:
    try:
        return _probed(ChatStore(path, read_only=reason)), reason
    except (ChatStoreError, sqlite3.Error) as exc:
        return _in_memory(f"{exc} ({path})")


def _in_memory(problem: str) -> tuple[ChatStore, str]:
    return ChatStore(":memory:"), (f"Your chat history cannot be opened: {problem}. Chats from this session are "
                                   "kept in memory only and are lost when you quit. Check that the data folder "
                                   "exists and is writable, then restart DFlash Desktop.")


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """Open without ever writing. In a read-only folder SQLite cannot create the shared-memory file a WAL
    database needs, so the file is then opened as immutable (nobody can write it there either)."""
    uri = path.resolve().as_uri()
    db = sqlite3.connect(f"{uri}?mode=ro", uri=True)
    try:
        db.execute("PRAGMA user_version").fetchone()
        return db
    except sqlite3.OperationalError as exc:
        db.close()
        if _code(exc) != _CANTOPEN:
            raise
    return sqlite3.connect(f"{uri}?immutable=1", uri=True)


def _code(exc: sqlite3.Error) -> int:
    """SQLite's primary result code (0 for errors raised by Python's sqlite3 module itself)."""
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def _move_aside(path: Path) -> Path:
    """Rename a damaged file (with SQLite's companion files) or folder to an unused
    ``<name>.damaged-<time>[-n]<suffix>``, so nothing is lost and no earlier copy is overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        target = path.with_name(f"{path.stem}.damaged-{stamp}{f'-{n}' if n > 1 else ''}{path.suffix}")
        if not any(os.path.lexists(f"{target}{companion}") for companion in ("", *_COMPANIONS)):
            break
    path.rename(target)
    for companion in _COMPANIONS:  # a stale -wal left beside a new file would be replayed into it
        if os.path.lexists(f"{path}{companion}"):
            os.rename(f"{path}{companion}", f"{target}{companion}")
    return target


def _conversation(r: sqlite3.Row) -> Conversation:
    return Conversation(r["id"], r["title"], r["system_prompt"], r["created"], r["updated"],
                        {k: r[k] for k in CHAT_SETTINGS if r[k] is not None})


def _message(r: sqlite3.Row) -> Message:
    return Message(r["id"], r["conversation_id"], r["role"], r["content"], _load(r["spans"]), _load(r["stats"]),
                   r["stop_reason"], _load(r["error"]), r["created"], _load(r["versions"]), r["version"])


def _dump(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _load(text: str | None):
    return None if text is None else json.loads(text)
