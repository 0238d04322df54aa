"""The chat store: conversations and messages round-trip with their stats and spans, deletes cascade,
edits truncate, and a file from a newer schema is refused with a clear message.

``open_store`` never fails: a damaged file or a folder in its place is moved aside and kept, a newer or
unwritable file opens read-only (and refuses writes with a ChatStoreError), anything else gives a store
in memory; each case comes with a notice for the user."""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from dflash_desktop import chat_store
from dflash_desktop.chat_store import SCHEMA_VERSION, ChatStore, ChatStoreError, default_path, open_store


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
    with pytest.raises(ChatStoreError, match="newer version of DFlash Desktop"):
        ChatStore(path)


def test_default_path_follows_app_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    assert default_path() == tmp_path / "data" / "chats.sqlite3"


# ----------------------------------------------------------------------------- open_store: damaged, newer, read-only

def saved_chat(path):
    """A store file with one conversation of two messages; returns the conversation id."""
    store = ChatStore(path)
    conv = store.create_conversation("kept chat")
    store.add_message(conv.id, "user", "hello")
    store.add_message(conv.id, "assistant", "hi", stats={"tau": 2.0})
    store.close()
    return conv.id


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_attempts(store, conv_id):
    """Every writing method once, as the window would call them."""
    return {"create_conversation": lambda: store.create_conversation("new"),
            "update_conversation": lambda: store.update_conversation(conv_id, title="renamed"),
            "delete_conversation": lambda: store.delete_conversation(conv_id),
            "add_message": lambda: store.add_message(conv_id, "user", "more"),
            "update_message": lambda: store.update_message(1, content="changed"),
            "delete_from": lambda: store.delete_from(conv_id, 1)}


def assert_shows_the_chat_and_refuses_writes(store, conv_id, reason_words):
    assert [c.title for c in store.conversations()] == ["kept chat"]
    assert [m.content for m in store.messages(conv_id)] == ["hello", "hi"]
    for name, attempt in write_attempts(store, conv_id).items():
        with pytest.raises(ChatStoreError, match="Nothing was saved") as refused:
            attempt()
        for word in reason_words:
            assert word in str(refused.value), (name, str(refused.value))


def test_healthy_file_opens_writable_without_a_notice(tmp_path):
    conv_id = saved_chat(tmp_path / "chats.sqlite3")
    store, notice = open_store(tmp_path / "chats.sqlite3")
    assert notice is None and store.read_only is None
    store.add_message(conv_id, "user", "again")
    assert len(store.messages(conv_id)) == 3


def test_corrupt_file_is_moved_aside_with_its_bytes_and_a_new_store_starts(tmp_path):
    path = tmp_path / "chats.sqlite3"
    damaged = os.urandom(8192)
    path.write_bytes(damaged)
    (tmp_path / "chats.sqlite3-wal").write_bytes(b"stale wal of the damaged file")
    store, notice = open_store(path)
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("chats.damaged-")]
    main = [p for p in moved if p.suffix == ".sqlite3"]
    assert len(main) == 1 and main[0].read_bytes() == damaged
    assert (tmp_path / f"{main[0].name}-wal").read_bytes() == b"stale wal of the damaged file"  # moved along
    assert "damaged" in notice and str(main[0]) in notice and "nothing deleted" in notice
    assert store.read_only is None and store.conversations() == []
    conv = store.create_conversation("fresh")
    assert [c.title for c in store.conversations()] == ["fresh"] and store.conversation(conv.id)


def test_a_second_damage_never_overwrites_the_first_moved_copy(tmp_path, monkeypatch):
    """Both damages happen in the same second (the clock is frozen), so the second copy needs a new name."""
    monkeypatch.setattr(chat_store.time, "strftime", lambda fmt, *a: "20260102-030405")
    path = tmp_path / "chats.sqlite3"
    damages = (b"first damage " * 100, b"second damage " * 100)
    for damaged in damages:
        path.write_bytes(damaged)
        store, notice = open_store(path)
        store.close()
    first = tmp_path / "chats.damaged-20260102-030405.sqlite3"
    second = tmp_path / "chats.damaged-20260102-030405-2.sqlite3"
    assert (first.read_bytes(), second.read_bytes()) == damages
    assert str(second) in notice


def test_folder_in_place_of_the_file_is_moved_aside_untouched(tmp_path):
    path = tmp_path / "chats.sqlite3"
    path.mkdir()
    (path / "something.txt").write_text("the user's file")
    store, notice = open_store(path)
    moved = next(p for p in tmp_path.iterdir() if p.name.startswith("chats.damaged-"))
    assert moved.is_dir() and (moved / "something.txt").read_text() == "the user's file"
    assert "A folder was found" in notice and str(moved) in notice
    assert path.is_file() and store.read_only is None
    store.create_conversation("fresh")


def test_newer_schema_opens_read_only_shows_chats_and_writes_nothing(tmp_path):
    path = tmp_path / "chats.sqlite3"
    conv_id = saved_chat(path)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = digest(path)
    store, notice = open_store(path)
    assert "newer version" in notice and "read-only" in notice and "update" in notice
    assert store.read_only == notice
    assert_shows_the_chat_and_refuses_writes(store, conv_id, ["newer version"])
    store.close()
    assert digest(path) == before  # not even the journal mode or the version changed


@pytest.fixture
def make_read_only():
    """Make files and folders really unwritable for this process, and undo it afterwards.

    As a normal user chmod does it. Root ignores file modes, so there the immutable attribute is set
    (chattr +i), which stops root too; where chattr cannot do it (another file system, no capability)
    the test is skipped with the reason. Windows folders cannot be made read-only this way: skipped.
    """
    if sys.platform == "win32":
        pytest.skip("a read-only folder cannot be made with file modes on Windows")
    undo = []

    def apply(*paths):
        for p in paths:
            if os.geteuid() != 0:
                mode = p.stat().st_mode
                p.chmod(mode & ~0o222)
                undo.append(lambda p=p, mode=mode: p.chmod(mode))
                continue
            result = subprocess.run(["chattr", "+i", str(p)], capture_output=True, text=True) \
                if shutil.which("chattr") else None
            if result is None or result.returncode:
                pytest.skip("running as root, where file modes do not stop writes, and chattr +i is not possible "
                            f"here ({result.stderr.strip() if result else 'no chattr'})")
            undo.append(lambda p=p: subprocess.run(["chattr", "-i", str(p)], check=True))

    yield apply
    for step in reversed(undo):
        step()


def test_read_only_folder_opens_read_only_and_says_so(tmp_path, make_read_only):
    """Real read-only folder and file (chmod, or chattr +i when running as root): SQLite cannot even create
    its shared-memory file there, so the store is opened as immutable."""
    path = tmp_path / "data" / "chats.sqlite3"
    path.parent.mkdir()
    conv_id = saved_chat(path)
    before = digest(path)
    make_read_only(path, path.parent)
    store, notice = open_store(path)
    assert "cannot be written" in notice and "read-only" in notice and str(path) in notice
    assert_shows_the_chat_and_refuses_writes(store, conv_id, ["read-only", str(path)])
    store.close()
    assert digest(path) == before and sorted(p.name for p in path.parent.iterdir()) == ["chats.sqlite3"]


def test_read_only_file_in_a_writable_folder_opens_read_only(tmp_path, make_read_only):
    path = tmp_path / "chats.sqlite3"
    conv_id = saved_chat(path)
    before = digest(path)
    make_read_only(path)
    store, notice = open_store(path)
    assert "cannot be written" in notice
    assert_shows_the_chat_and_refuses_writes(store, conv_id, ["read-only"])
    store.close()
    assert digest(path) == before


def test_a_write_that_fails_later_gives_a_clear_error(tmp_path):
    """Another connection holds the write lock (a real SQLite condition, like a full disk later on)."""
    path = tmp_path / "chats.sqlite3"
    conv_id = saved_chat(path)
    store, notice = open_store(path)
    store._db.execute("PRAGMA busy_timeout = 50")  # give up after 50 ms instead of 5 s
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(ChatStoreError, match=r"Nothing was saved: the chat file .* could not be written "
                                                 r"\(database is locked\)\. Check"):
            store.add_message(conv_id, "user", "lost?")
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.add_message(conv_id, "user", "saved once the lock is gone")


def test_read_only_folder_without_a_chat_file_keeps_chats_in_memory(tmp_path, make_read_only):
    folder = tmp_path / "data"
    folder.mkdir()
    make_read_only(folder)
    store, notice = open_store(folder / "chats.sqlite3")
    assert "kept in memory only" in notice and "lost when you quit" in notice
    conv = store.create_conversation("this session")
    assert store.conversation(conv.id).title == "this session"
    assert list(folder.iterdir()) == []


def test_data_folder_that_cannot_be_created_keeps_chats_in_memory(tmp_path, monkeypatch):
    (tmp_path / "home").write_text("a file where the app's folder should be")
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    store, notice = open_store()
    assert "kept in memory only" in notice
    store.create_conversation("this session")


def _v1_file(path):
    """A chat file as version 1 wrote it: its schema, user_version 1, one chat with an answer."""
    db = sqlite3.connect(str(path))
    db.executescript(chat_store._SCHEMA_V1)
    db.execute("INSERT INTO conversations (title, system_prompt, created, updated) VALUES ('old', 'be brief', 1, 2)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'hi', 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, spans, stats, stop_reason, created) "
               "VALUES (1, 'assistant', 'hello', '[[\"hello\", true]]', '{\"tau\": 2.5}', 'eos', 2)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


def test_a_version_1_file_upgrades_keeping_everything(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _v1_file(path)
    store, notice = open_store(path)
    assert notice is None and not store.read_only
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    conv = store.conversations()[0]
    assert (conv.title, conv.system_prompt, conv.created, conv.updated) == ("old", "be brief", 1, 2)
    assert (conv.settings, conv.overrides) == ({}, {})
    user, answer = store.messages(conv.id)
    assert (user.content, answer.content, answer.spans, answer.stats, answer.stop_reason) == \
        ("hi", "hello", [["hello", True]], {"tau": 2.5}, "eos")
    assert (answer.versions, answer.version) == (None, 0)
    own = {"temperature": 0.3, "max_new_tokens": 99, "repeat_penalty": 1.2, "min_p": 0.1, "seed": 7,
           "context_length": 512}
    store.set_chat_settings(conv.id, own)   # the new columns (versions 2 and 3) are writable
    store.close()
    assert ChatStore(path).conversation(conv.id).overrides == own


def test_versions_of_an_answer_are_kept_browsed_and_survive_a_restart(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = ChatStore(path)
    conv = store.create_conversation()
    question = store.add_message(conv.id, "user", "q1")
    answer = store.add_message(conv.id, "assistant", "a1", stats={"tau": 1.0}, stop_reason="eos")
    assert store.new_version(answer.id) == 1     # regenerated: the same question
    assert (store.message(answer.id).content, store.message(answer.id).stop_reason) == ("", "generating")
    store.update_message(answer.id, content="a2", stats={"tau": 2.0}, stop_reason="length")
    assert store.new_version(answer.id, "q1 edited") == 2     # an edit: the question changes with the version
    store.update_message(answer.id, content="a3", stop_reason="eos")
    store.close()

    store = ChatStore(path)
    shown = store.message(answer.id)
    assert [v["content"] for v in shown.versions] == ["a1", "a2", "a3"] and shown.version == 2
    assert [v["prompt"] for v in shown.versions] == ["q1", "q1", "q1 edited"]
    assert store.message(question.id).content == "q1 edited"
    store.show_version(answer.id, 1)
    back = store.message(answer.id)
    assert (back.content, back.stats, back.stop_reason, back.version) == ("a2", {"tau": 2.0}, "length", 1)
    assert store.message(question.id).content == "q1"       # what later turns are sent with
    with pytest.raises(ValueError, match="no version 3"):
        store.show_version(answer.id, 3)
    assert store.message(answer.id).version == 1


def test_search_matches_titles_and_any_version_of_any_message(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    a = store.create_conversation("Sorting in Python")
    b = store.create_conversation("other")
    answer = store.add_message(b.id, "assistant", "first TAKE")
    store.new_version(answer.id)
    store.update_message(answer.id, content="second")
    c = store.create_conversation("100% sure")
    assert [x.id for x in store.search("sorting")] == [a.id]
    assert [x.id for x in store.search("take")] == [b.id]          # an earlier version still matches
    assert [x.id for x in store.search("0%")] == [c.id]            # % is text, not a wildcard
    assert store.search("nowhere") == []
    assert store.search("stop_reason") == []                       # the versions' field names are not text


def test_an_upgrade_that_fails_half_way_leaves_the_version_1_file_as_it_was(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _v1_file(path)
    db = sqlite3.connect(str(path))
    db.execute("ALTER TABLE messages ADD COLUMN versions TEXT")   # the third step of the upgrade will fail
    db.commit()
    db.close()
    with pytest.raises(sqlite3.OperationalError, match="duplicate column"):
        ChatStore(path)
    db = sqlite3.connect(str(path))
    columns = [row[1] for row in db.execute("PRAGMA table_info(conversations)")]
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1 and "temperature" not in columns
    assert db.execute("SELECT title FROM conversations").fetchall() == [("old",)]
    db.close()


def test_discarding_a_failed_version_shows_the_latest_other_with_its_question(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    conv = store.create_conversation()
    question = store.add_message(conv.id, "user", "first question")
    answer = store.add_message(conv.id, "assistant", "first answer", stop_reason="eos")
    with pytest.raises(ValueError, match="no other version"):
        store.discard_shown_version(answer.id)           # written once: nothing else to show
    store.new_version(answer.id, "edited question")
    store.update_message(answer.id, stop_reason="error", error={"code": "prompt_too_long"})
    store.discard_shown_version(answer.id)
    kept = store.message(answer.id)
    assert (kept.content, kept.version, len(kept.versions), kept.error) == ("first answer", 0, 1, None)
    assert store.message(question.id).content == "first question"
