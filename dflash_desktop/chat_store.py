"""Conversations and their messages in one SQLite file in the data folder.

Every assistant message keeps its statistics (JSON), its stop reason and the drafted/target spans, so
the footer and the highlighting come back after a restart. The schema carries a version
(PRAGMA user_version) and upgrades step by step when the app is newer than the file.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import paths

SCHEMA_VERSION = 1
DEFAULT_TITLE = "New chat"

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


class ChatStoreError(RuntimeError):
    """The chat file cannot be used (for example, it was written by a newer version)."""


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float


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


def default_path() -> Path:
    return paths.data_dir() / "chats.sqlite3"


class ChatStore:
    """Small synchronous store: every call is one short transaction on the GUI thread (milliseconds)."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else default_path()
        self._db = sqlite3.connect(str(self.path))
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._migrate()

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ChatStoreError(f"{self.path} was written by a newer DFlash Desktop (schema {version}, this "
                                 f"version reads up to {SCHEMA_VERSION}). Update the app to open it.")
        with self._db:
            if version < 1:
                self._db.executescript(_SCHEMA_V1)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- conversations ------------------------------------------------------------------------------
    def create_conversation(self, title: str = DEFAULT_TITLE, system_prompt: str = "") -> Conversation:
        now = time.time()
        with self._db:
            cur = self._db.execute("INSERT INTO conversations (title, system_prompt, created, updated) "
                                   "VALUES (?, ?, ?, ?)", (title, system_prompt, now, now))
        return Conversation(cur.lastrowid, title, system_prompt, now, now)

    def conversations(self) -> list[Conversation]:
        """Most recently updated first."""
        rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(r["id"], r["title"], r["system_prompt"], r["created"], r["updated"]) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        r = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(r["id"], r["title"], r["system_prompt"], r["created"], r["updated"]) if r else None

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

    def delete_conversation(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -----------------------------------------------------------------------------------
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

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                                (conversation_id,)).fetchall()
        return [Message(r["id"], r["conversation_id"], r["role"], r["content"], _load(r["spans"]),
                        _load(r["stats"]), r["stop_reason"], _load(r["error"]), r["created"]) for r in rows]

    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Delete a message and everything after it (regenerate, edit-and-resend)."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id))


def _dump(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _load(text: str | None):
    return None if text is None else json.loads(text)
