"""The chat store: conversations and messages round-trip with their stats and spans, deletes cascade,
edits truncate, and a file from a newer schema is refused with a clear message."""
from __future__ import annotations

import sqlite3

import pytest

from dflash_desktop.chat_store import SCHEMA_VERSION, ChatStore, ChatStoreError, default_path


def test_round_trip_with_stats_spans_and_order(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    a = store.create_conversation("first", "be brief")
    b = store.create_conversation("second")
    store.add_message(a.id, "user", "def f():")
    stats = {"tau": 3.5, "decode_tok_s": 41.0, "histogram": [1, 2, 3]}
    store.add_message(a.id, "assistant", "  return 1", spans=[["  ret", True], ["urn 1", False]], stats=stats,
                      stop_reason="length")
    store.close()

    store = ChatStore(path)
    assert [c.title for c in store.conversations()] == ["first", "second"]  # a was updated last
    assert store.conversation(a.id).system_prompt == "be brief"
    msgs = store.messages(a.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "def f():"), ("assistant", "  return 1")]
    assert msgs[1].stats == stats and msgs[1].spans == [["  ret", True], ["urn 1", False]]
    assert msgs[1].stop_reason == "length" and msgs[0].stats is None
    assert store.messages(b.id) == []


def test_update_truncate_delete_cascade(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    conv = store.create_conversation()
    ids = [store.add_message(conv.id, role, text).id for role, text in
           (("user", "1"), ("assistant", "2"), ("user", "3"), ("assistant", "4"))]
    store.update_message(ids[3], content="4!", stop_reason="error", error={"code": "worker_crashed"})
    assert store.messages(conv.id)[-1].error == {"code": "worker_crashed"}
    store.delete_from(conv.id, ids[2])
    assert [m.content for m in store.messages(conv.id)] == ["1", "2"]
    store.update_conversation(conv.id, title="renamed", system_prompt="sys")
    assert (store.conversation(conv.id).title, store.conversation(conv.id).system_prompt) == ("renamed", "sys")
    # a rename alone is not activity: the list keeps its order
    newer = store.create_conversation("newer")
    store.update_conversation(conv.id, title="renamed again")
    assert [c.title for c in store.conversations()] == ["newer", "renamed again"]
    store.update_conversation(conv.id, system_prompt="sys 2")
    assert [c.title for c in store.conversations()] == ["renamed again", "newer"]
    store.delete_conversation(newer.id)
    store.delete_conversation(conv.id)
    assert store.conversations() == [] and store.messages(conv.id) == []
    with pytest.raises(sqlite3.IntegrityError):   # roles are checked by the schema
        store.add_message(store.create_conversation().id, "robot", "x")


def test_schema_version_and_newer_file_refused(tmp_path):
    path = tmp_path / "c.sqlite3"
    ChatStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(ChatStoreError, match="newer DFlash Desktop"):
        ChatStore(path)


def test_default_path_follows_app_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    assert default_path() == tmp_path / "data" / "chats.sqlite3"
