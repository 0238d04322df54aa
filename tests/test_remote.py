"""The remote client against our own server (a real one, on the demo pair) and against vLLM's and SGLang's
responses served on 127.0.0.1 (tests/remote_fakes.py): what it sends, the text it streams, and the
acceptance each server reports, or that it reported none. A real vLLM or SGLang never runs here."""
from __future__ import annotations

import json
import queue
import threading
import time

import pytest

from dflash_desktop.jobs import JobQueue
from dflash_desktop.offers import Offers
from dflash_desktop.remote import RemoteClient, normalize_base_url, parse_metrics
from tests.remote_fakes import FIXTURES, FakeServer

WORDS_TEXT = "".join(json.loads(line[6:])["choices"][0]["delta"]["content"]
                     for line in (FIXTURES / "vllm_chat_stream.txt").read_text().splitlines()
                     if line.startswith("data: {") and '"delta": {"content"' in line)


class Events:
    """A RemoteClient's events, and a wait for the final one of a request."""

    def __init__(self):
        self.all: list[dict] = []
        self._final: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        self.all.append(event)
        if event["event"] in ("loaded", "done", "error", "ok"):
            self._box(event["id"]).put(event)

    def _box(self, rid):
        with self._lock:
            return self._final.setdefault(rid, queue.Queue())

    def wait(self, rid: str, timeout: float = 60) -> dict:
        return self._box(rid).get(timeout=timeout)

    def of(self, rid: str, kind: str) -> list[dict]:
        return [e for e in self.all if e.get("id") == rid and e["event"] == kind]


@pytest.fixture
def remote():
    events = Events()
    client = RemoteClient(events)
    client.events = events
    return client


def wait_for(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def load(client, url: str, key: str = "") -> dict:
    client.request("load_pair", id="load", target=url, api_key=key)
    return client.events.wait("load")


def generate(client, rid: str = "gen", **fields) -> dict:
    client.request("generate", id=rid, **fields)
    return client.events.wait(rid)


def test_base_urls_and_metrics_text():
    assert normalize_base_url(" http://gpu-box:8000/v1/ ") == "http://gpu-box:8000"
    assert normalize_base_url("https://h.example/proxy/v1") == "https://h.example/proxy"
    for bad in ("gpu-box:8000", "ftp://h", "http://user:pw@h:1", "http://h:1/v1?x=1", ""):
        with pytest.raises(ValueError):
            normalize_base_url(bad)
    before = parse_metrics((FIXTURES / "vllm_metrics_before.txt").read_text())
    assert (before["steps"], before["drafted"], before["accepted"]) == (120, 1800, 355)   # *_created are not counts
    assert before["positions"][0] == 90 and len(before["positions"]) == 15
    assert "steps" not in parse_metrics((FIXTURES / "vllm_metrics_plain.txt").read_text())


def test_vllm_chat_streams_and_reads_acceptance_from_its_counters(remote):
    fake = FakeServer("vllm", api_key="k-123")
    try:
        loaded = load(remote, fake.url + "/v1/", "k-123")
        assert loaded["event"] == "loaded" and loaded["server"] == "vllm" and loaded["name"] == "Qwen/Qwen3-8B"
        assert loaded["engine"] == "remote" and loaded["max_positions"] == 40960
        offers = Offers.of(loaded)     # no baseline, unload or count here; its CPU time is the server's
        assert not (offers.local or offers.baseline or offers.unload or offers.count_tokens)
        done = generate(remote, messages=[{"role": "user", "content": "Write a parser."}], enable_thinking=False,
                        settings={"max_new_tokens": 32, "top_k": 20, "temperature": 0.0})
        assert done["event"] == "done" and done["stop_reason"] == "length" and done["text"] == WORDS_TEXT
        chunks = remote.events.of("gen", "tokens")
        assert "".join(t for c in chunks for t, _ in c["spans"]) == WORDS_TEXT and chunks[-1]["generated"] == 32
        s = done["stats"]
        assert (s["drafted"], s["accepted"], s["steps"], s["unknown"]) == (105, 24, 7, [])
        assert s["tau"] == pytest.approx(31 / 7) and s["acceptance_rate"] == pytest.approx(24 / 105)
        assert s["position_rates"][:2] == [1.0, pytest.approx(5 / 7)] and s["generated_tokens"] == 32
        assert s["prompt_tokens"] == 14 and s["remote"]["server"] == "vllm"
        order = [(r["method"], r["path"]) for r in fake.requests]
        assert order[-3:] == [("GET", "/metrics"), ("POST", "/v1/chat/completions"), ("GET", "/metrics")]
        body = fake.posts()[-1]["body"]
        assert body["model"] == "Qwen/Qwen3-8B" and body["max_tokens"] == 32 and body["top_k"] == 20
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True,
                                                                     "continuous_usage_stats": True}
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and "dflash" not in body
        assert all(r["authorization"] == "Bearer k-123" for r in fake.requests)
    finally:
        fake.close()


def test_vllm_without_speculative_counters_says_so_instead_of_zeros(remote):
    fake = FakeServer("vllm", spec_metrics=False)
    try:
        load(remote, fake.url)
        s = generate(remote, prompt="x", settings={"max_new_tokens": 32})["stats"]
        assert s["unknown"] == ["drafted", "accepted", "steps"] and "--speculative-config" in s["remote"]["note"]
    finally:
        fake.close()


def test_sglang_raw_prompts_use_generate_and_report_meta_info(remote):
    fake = FakeServer("sglang")
    try:
        assert load(remote, fake.url)["server"] == "sglang"
        done = generate(remote, prompt="def parse", raw=True,
                        settings={"max_new_tokens": 32, "stop_strings": ["\n\n\n"]})
        assert done["text"] == WORDS_TEXT and done["stop_reason"] == "length"
        assert [len(t) for c in remote.events.of("gen", "tokens") for t, _ in c["spans"]][:3] == [3, 6, 1]  # deltas
        s = done["stats"]
        assert (s["steps"], s["accepted"], s["unknown"]) == (7, 25, ["drafted"])
        assert s["tau"] == pytest.approx(32 / 7)    # SGLang's spec_accept_length
        body = fake.posts()[-1]
        assert body["path"] == "/generate" and body["body"]["text"] == "def parse" and body["body"]["stream"] is True
        assert body["body"]["sampling_params"] == {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0,
                                                   "stop": ["\n\n\n"]}
    finally:
        fake.close()


def test_sglang_streamed_chats_carry_no_acceptance_and_the_stats_say_so(remote):
    fake = FakeServer("sglang")
    try:
        load(remote, fake.url)
        done = generate(remote, messages=[{"role": "user", "content": "hi"}], settings={"max_new_tokens": 32})
        assert done["text"] == WORDS_TEXT and fake.posts()[-1]["path"] == "/v1/chat/completions"
        assert done["stats"]["unknown"] == ["drafted", "accepted", "steps"]
        assert "SGLang reports acceptance for raw prompts" in done["stats"]["remote"]["note"]
    finally:
        fake.close()


def test_refusals_and_unreachable_servers_are_explained(remote):
    fake = FakeServer("vllm", api_key="right")
    try:
        err = load(remote, fake.url, "wrong")
        assert err["code"] == "remote_error" and "HTTP 401" in err["message"] and "API key" in err["message"]
        load(remote, fake.url, "right")
        err = generate(remote, prompt="x", mode="baseline")
        assert err["code"] == "bad_settings" and "plain decoding cannot be asked" in err["message"]
        err = generate(remote, "g2", prompt="x", settings={"temperature": 9})
        assert err["code"] == "bad_settings" and "temperature" in err["message"]
    finally:
        fake.close()
    err = load(remote, fake.url)   # the port is closed now
    assert err["code"] == "remote_unreachable" and "Could not reach" in err["message"]
    remote.request("load_pair", id="bad", target="gpu-box:8000")
    assert "http://HOST:PORT" in remote.events.wait("bad")["message"]


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    """A real DFlash Desktop server on the demo pair, in this process (its worker is a subprocess)."""
    import os
    from dflash_desktop.server import ServerThread, builtin_pair
    from dflash_desktop.worker_client import WorkerClient
    os.environ.setdefault("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("home")))
    jobs = JobQueue()
    client = WorkerClient(on_event=jobs.intake)
    jobs.backend = client
    target, draft, *_ = builtin_pair("demo")
    assert jobs.submit("load_pair", target=target, draft=draft, device="cpu").wait(120)["event"] == "loaded"
    server = ServerThread.listen(jobs, port=0, model_name=lambda: "demo")
    yield jobs, server.url
    server.stop()
    client.shutdown()


def test_against_our_own_server_every_count_and_the_drafted_spans_arrive(remote, own_server):
    jobs, url = own_server
    loaded = load(remote, url)
    assert (loaded["server"], loaded["name"], loaded["block_size"], loaded["max_positions"]) == (
        "dflash-desktop", "demo", 16, 2048)
    settings = {"max_new_tokens": 40}
    local = jobs.submit("generate", prompt="def read_config(path):\n", raw=True, settings=settings).wait(60)
    done = generate(remote, prompt="def read_config(path):\n", raw=True, settings=settings)
    assert done["text"] == local["text"] and done["stop_reason"] == "length"
    s, served = done["stats"], jobs.finished[-1].final["stats"]
    assert s["unknown"] == [] and (s["drafted"], s["accepted"], s["steps"]) == (
        served["drafted"], served["accepted"], served["steps"])
    assert s["histogram"] == served["histogram"] and s["block_size"] == 16 and s["generated_tokens"] == 40
    spans = [span for c in remote.events.of("gen", "tokens") for span in c["spans"]]
    assert any(d for _, d in spans) and any(not d for _, d in spans)
    plain = generate(remote, "plain", prompt="def read_config(path):\n", raw=True, settings=settings, mode="baseline")
    assert plain["text"] == local["text"] and plain["stats"]["block_size"] == 1 and plain["stats"]["drafted"] == 0


def test_cancel_stops_the_servers_job(remote, own_server):
    jobs, url = own_server
    load(remote, url)
    remote.request("generate", id="long", prompt="class Stack:\n", raw=True, settings={"max_new_tokens": 1500})
    wait_for(lambda: remote.events.of("long", "tokens"))
    remote.cancel("long")
    done = remote.events.wait("long")
    assert done["event"] == "done" and done["stop_reason"] == "cancelled"
    wait_for(lambda: jobs.running is None)
    final = jobs.finished[-1].final
    assert final["stop_reason"] == "cancelled" and final["stats"]["generated_tokens"] < 1500
