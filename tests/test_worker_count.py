"""count_tokens: the worker counts a prompt with the loaded pair's tokenizer and chat template exactly as
generate feeds it to the model, also while an answer streams; bad input is a clear protocol error. Real
worker subprocess, tiny random pair with a chat template, no mocks."""
from __future__ import annotations

import pytest

from dflash_desktop.worker_client import WorkerClient

from .test_worker import LONG, T, home, of, wait_for  # noqa: F401

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about drafts."},
        {"role": "assistant", "content": "Drafts are guesses."}, {"role": "user", "content": "And blocks?"}]


@pytest.fixture(scope="module")
def client(home, tmp_path_factory):
    from tests.tiny_torch import save_random_pair
    target, draft = save_random_pair(tmp_path_factory.mktemp("chat-pair"), block_size=8, chat_template=TEMPLATE)
    events: list[dict] = []
    c = WorkerClient(on_event=events.append)
    c.events = events
    c.dirs = (str(target), str(draft))
    loaded = c.wait(c.load_pair(*c.dirs), T)
    assert loaded["event"] == "loaded" and loaded["chat_template"], loaded
    yield c
    assert c.shutdown(10) == 0


@pytest.mark.parametrize("request_fields", [{"messages": CHAT}, {"messages": CHAT, "raw": True},
                                            {"prompt": "def f(x):\n    return"}], ids=["template", "raw", "prompt"])
def test_the_count_is_the_prompt_generate_runs(client, request_fields):
    count = client.wait(client.count_tokens(**request_fields), T)
    assert count["event"] == "count", count
    done = client.wait(client.generate(**request_fields, settings={"max_new_tokens": 2}), T)
    assert done["event"] == "done", done
    assert count["tokens"] == done["stats"]["prompt_tokens"] > 0
    assert count["context"] == client.pair_info["max_positions"]


def test_the_template_counts_what_raw_text_does_not(client):
    templated = client.wait(client.count_tokens(messages=CHAT), T)["tokens"]
    raw = client.wait(client.count_tokens(messages=CHAT, raw=True), T)["tokens"]
    # the byte tokenizer: one token per byte of the rendered text
    assert raw == len("".join(m["content"] for m in CHAT).encode())
    assert templated == raw + len("".join(f"<{m['role']}>" for m in CHAT).encode()) + len(b"<assistant>")


def test_a_count_is_answered_while_an_answer_streams(client):
    rid = client.generate(prompt="Count forever:", settings={"max_new_tokens": LONG})
    wait_for(lambda: of(client, rid, "tokens"), T, "first tokens")
    count = client.wait(client.count_tokens(prompt="abc", raw=True), T)
    assert count["event"] == "count" and count["tokens"] == 3
    assert not of(client, rid, "done"), "the count waited for the answer to end"
    client.wait(client.cancel(rid), 10)
    assert client.wait(rid, T)["stop_reason"] == "cancelled"


@pytest.mark.parametrize("fields, words", [
    ({"messages": "hello"}, ["messages", "wrong type", "str"]),
    ({"messages": [{"role": "robot", "content": "hi"}]}, ["messages[0]", "'robot'", "system, user, assistant"]),
    ({"messages": [{"role": "user"}]}, ["messages[0]", "content"]),
    ({"messages": ["hi"]}, ["messages[0]", "str"]),
    ({"messages": CHAT, "prompt": "x"}, ["exactly one of messages or prompt"]),
    ({}, ["exactly one of messages or prompt"]),
    ({"prompt_ids": [1, 2]}, ["unknown field", "prompt_ids"]),
], ids=["not-a-list", "wrong-role", "no-content", "not-an-object", "both", "neither", "ids"])
def test_bad_input_is_a_clear_protocol_error_and_the_worker_goes_on(client, fields, words):
    bad = client.wait(client.request("count_tokens", **fields), T)
    assert bad["event"] == "error" and bad["code"] == "bad_message", bad
    assert bad["message"].startswith("count_tokens: ") and all(w in bad["message"] for w in words), bad["message"]
    assert client.wait(client.count_tokens(prompt="ok", raw=True), T)["tokens"] == 2


def test_generate_refuses_a_wrong_role_the_same_way(client):
    bad = client.wait(client.generate(messages=[{"role": "robot", "content": "hi"}]), T)
    assert bad["code"] == "bad_message" and "'robot'" in bad["message"] and bad["message"].startswith("generate: ")


def test_nothing_loaded_is_no_pair(client):
    assert client.wait(client.unload(), T)["unloaded"] is True
    try:
        nopair = client.wait(client.count_tokens(prompt="x"), T)
        assert nopair["code"] == "no_pair" and "load a pair" in nopair["message"]
    finally:
        assert client.wait(client.load_pair(*client.dirs), T)["event"] == "loaded"
