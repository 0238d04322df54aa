"""Export and import of one chat: Markdown to read, JSON that comes back whole (stats, spans, versions, the
chat's own settings), and an import that refuses every malformed file with a message naming the problem and
adds nothing."""
from __future__ import annotations

import json
import os
import threading

import pytest

from dflash_desktop import chat_export
from dflash_desktop.chat_export import ChatImportError, export_chat, import_chat
from dflash_desktop.chat_store import ChatStore


@pytest.fixture
def chat(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    conv = store.create_conversation("Sorting", "be brief")
    store.set_chat_settings(conv.id, {"temperature": 0.4, "max_new_tokens": 77, "repeat_penalty": 1.3, "seed": 5})
    store.add_message(conv.id, "user", "how do I sort?")
    answer = store.add_message(conv.id, "assistant", "use sorted()", spans=[["use ", True], ["sorted()", False]],
                               stats={"tau": 2.5, "decode_tok_s": 40.0}, stop_reason="eos")
    store.new_version(answer.id, "how do I sort a list?")
    store.update_message(answer.id, content="list.sort()", stats=LATER_STATS, stop_reason="length")
    return store, conv.id


# what the window keeps with an answer: how it decoded and the model that wrote it (PairSession.answer_model)
LATER_STATS = {"tau": 3.0, "method": "dflash", "model": {
    "id": "chat", "name": "SmolLM2-135M-Instruct", "engine": "llamacpp", "device": "cpu", "dtype": "q4_1",
    "has_drafter": True, "baseline_key": "chat|/m/SmolLM2.gguf|llamacpp"}}


def test_json_round_trip_keeps_stats_spans_versions_and_settings(chat, tmp_path):
    store, conv_id = chat
    path = export_chat(store, conv_id, tmp_path / "sorting.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["messages"][1]["stats"] == LATER_STATS
    assert [v["content"] for v in data["messages"][1]["versions"]] == ["use sorted()", "list.sort()"]

    other = ChatStore(tmp_path / "other.sqlite3")
    imported = import_chat(other, path)
    assert (imported.title, imported.system_prompt, imported.overrides) == \
        ("Sorting", "be brief", {"temperature": 0.4, "max_new_tokens": 77, "repeat_penalty": 1.3, "seed": 5})
    before, after = store.messages(conv_id), other.messages(imported.id)
    assert [(m.role, m.content, m.spans, m.stats, m.stop_reason, m.versions, m.version) for m in after] == \
        [(m.role, m.content, m.spans, m.stats, m.stop_reason, m.versions, m.version) for m in before]
    other.show_version(after[1].id, 0)     # the versions still browse after the import
    assert [m.content for m in other.messages(imported.id)] == ["how do I sort?", "use sorted()"]


def test_markdown_export_reads_as_a_conversation(chat, tmp_path):
    store, conv_id = chat
    text = export_chat(store, conv_id, tmp_path / "sorting.md").read_text(encoding="utf-8")
    assert text.startswith("# Sorting\n")
    assert "> System prompt: be brief" in text
    assert text.index("## You") < text.index("how do I sort a list?") < text.index(
        "## SmolLM2-135M-Instruct  ·  DFlash (llamacpp engine on cpu, q4_1) (version 2 of 2)")
    assert "list.sort()" in text and "use sorted()" not in text   # the version shown


def _exported(chat, tmp_path) -> dict:
    store, conv_id = chat
    return json.loads(export_chat(store, conv_id, tmp_path / "good.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("spoil, problem", [
    (lambda d: d.pop("format"), "not a DFlash Desktop chat export"),
    (lambda d: d.update(version=99), "newer DFlash Desktop (chat export version 99"),
    (lambda d: d.update(version="1"), "no whole-number \"version\""),
    (lambda d: d["messages"][0].update(role="root"), "message 1 with role 'root'"),
    (lambda d: d["messages"][1].update(content=5), "\"message 2 content\" that is not text"),
    (lambda d: d["messages"][1].update(spans=[["a", "yes"]]), "message 2 whose \"spans\""),
    (lambda d: d["messages"][1].update(stats=[1]), "\"message 2 stats\" that is not an object"),
    (lambda d: d["messages"][1].update(stats={"decode_tok_s": "fast"}),
     "\"message 2 stats.decode_tok_s\" that is not a number"),
    (lambda d: d["messages"][1].update(stats={"generated_tokens": 10**400}),
     "\"message 2 stats.generated_tokens\" that is not a whole number"),
    (lambda d: d["messages"][1].update(stats={"histogram": [1, None]}), "\"message 2 stats.histogram[1]\""),
    (lambda d: d["messages"][1].update(stats={"model": {"has_drafter": "yes"}}),
     "\"message 2 stats.model.has_drafter\" that is not true or false"),
    (lambda d: d["messages"][1].update(stats={"fallback": {"tau": 1.0}}), "\"stats.fallback\" gives no \"reason\""),
    (lambda d: d["messages"][1].update(stats={"remote": {"note": ["x"]}}), "\"message 2 stats.remote.note\" that is"),
    (lambda d: d["messages"][1].update(error={"message": 5}), "\"message 2 error.message\" that is not text"),
    (lambda d: d["messages"][1].update(error="crashed"), "\"message 2 error\" that is not an object"),
    (lambda d: d["messages"][1]["versions"][0].update(stats={"tau": "high"}),
     "\"message 2 version 1 stats.tau\" that is not a number"),
    (lambda d: d["messages"][1]["versions"][0].update(error={"stderr_tail": "x"}),
     "\"message 2 version 1 error.stderr_tail\" that is not a list"),
    (lambda d: d["messages"][1]["versions"][1].update(spans=[["a", True], [3, False]]),
     "\"message 2 version 2 spans[1] text\" that is not text"),
    (lambda d: d["messages"][0].update(content="half \ud800 a pair"), "\"message 1 content\" holding a lone surrogate"),
    (lambda d: d["messages"][1].update(stop_reason="\udfff"), "\"message 2 stop_reason\" holding a lone surrogate"),
    (lambda d: d["messages"][0].update(created=10**400), "\"message 1 created\" that is not a number"),
    (lambda d: d["messages"][1].update(version=5), "message 2 whose \"version\" does not name"),
    (lambda d: d["messages"][0].update(versions=[{"content": "x"}]), "message 1 whose \"versions\""),
    (lambda d: d.update(title=""), "empty \"title\""),
    (lambda d: d.update(temperature=9), "\"temperature\" that is not 0 (greedy) or from 0.01 to 2"),
    (lambda d: d.update(repeat_penalty=10**400), "\"repeat_penalty\" that is not from 1 to 2"),
    (lambda d: d.update(seed=True), "\"seed\" that is not a number"),
    (lambda d: d.update(messages={}), "no \"messages\" list"),
    (lambda d: d.update(title="x" * (chat_export.MAX_TEXT_CHARS + 1)), "more than 4,194,304"),
])
def test_a_bad_file_is_refused_naming_the_problem_and_adds_nothing(chat, tmp_path, spoil, problem):
    data = _exported(chat, tmp_path)
    spoil(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    target = ChatStore(tmp_path / "target.sqlite3")
    with pytest.raises(ChatImportError) as caught:
        import_chat(target, bad)
    assert problem in str(caught.value) and "bad.json" in str(caught.value) and "Nothing was added" in str(caught.value)
    assert target.conversations() == []


@pytest.mark.parametrize("content, problem", [
    (b"# Sorting\n\n## You\n", "is not JSON"),
    (b'{"format": "dflash-desktop-chat", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"format": "dflash-desktop-chat", "version": 1, "temperature": NaN}', "NaN"),
    (b"\xff\xfe not text", "could not be read"),
], ids=["markdown", "deep", "nan", "not-utf8"])
def test_a_file_that_is_not_json_is_refused(tmp_path, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    target = ChatStore(tmp_path / "target.sqlite3")
    with pytest.raises(ChatImportError, match=problem):
        import_chat(target, bad)
    assert target.conversations() == []


def test_a_file_too_big_to_be_a_chat_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(chat_export, "MAX_FILE_BYTES", 10)
    big = tmp_path / "big.json"
    big.write_text("{" + " " * 20 + "}", encoding="utf-8")
    with pytest.raises(ChatImportError, match="more than any chat export"):
        import_chat(ChatStore(tmp_path / "t.sqlite3"), big)


def _import_within(store, path, seconds: float = 10.0):
    """import_chat on a thread: a reader that blocks (a FIFO with no writer) fails the test instead of hanging it."""
    result: dict = {}

    def run():
        try:
            result["value"] = import_chat(store, path)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"importing {path} did not end within {seconds} s"
    return result


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/zero are POSIX")
@pytest.mark.parametrize("make", [
    lambda p: os.mkfifo(p),
    lambda p: p.symlink_to("/dev/zero"),
    lambda p: p.mkdir(),
], ids=["fifo", "dev-zero-link", "folder"])
def test_a_special_file_is_refused_at_once_without_reading_it(tmp_path, make):
    special = tmp_path / "chat.json"
    make(special)
    target = ChatStore(tmp_path / "target.sqlite3")
    result = _import_within(target, special)
    assert isinstance(result.get("error"), ChatImportError), result
    assert "not a regular file" in str(result["error"]) and "chat.json" in str(result["error"])
    assert target.conversations() == []


def test_fields_this_version_does_not_know_are_dropped_and_known_ones_kept(chat, tmp_path):
    data = _exported(chat, tmp_path)
    data["messages"][1]["stats"] = {"tau": 3.0, "decode_tok_s": 40, "fallback": {"reason": "slow", "tau": 1.1,
                                                                                 "later": [[]]}, "new_figure": {"x": 1}}
    data["messages"][1]["error"] = {"code": "worker_crashed", "message": "gone", "exit_code": -9, "pair": None,
                                    "stderr_tail": ["line"], "extra": {"deep": [1]}}
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    target = ChatStore(tmp_path / "target.sqlite3")
    answer = target.messages(import_chat(target, path).id)[1]
    assert answer.stats == {"tau": 3.0, "decode_tok_s": 40, "fallback": {"reason": "slow", "tau": 1.1}}
    assert answer.error == {"code": "worker_crashed", "message": "gone", "exit_code": -9, "stderr_tail": ["line"]}


def test_a_failure_inside_the_store_adds_no_half_chat(chat, tmp_path):
    data = _exported(chat, tmp_path)
    data["messages"][1]["created"] = None
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    target = ChatStore(tmp_path / "target.sqlite3")
    target._db.execute("CREATE TRIGGER no_answers BEFORE INSERT ON messages WHEN NEW.role = 'assistant' "
                       "BEGIN SELECT RAISE(ABORT, 'disk trouble'); END")
    with pytest.raises(Exception, match="disk trouble"):
        import_chat(target, path)
    assert target.conversations() == []      # the conversation row went with the failed messages
