"""`dflash-desktop serve` as users run it: a real server subprocess on 127.0.0.1 with the demo pair, driven by
the official `openai` client (and by raw HTTP for what that client cannot send). The text must be what
the engine itself writes for the same prompt and settings, greedy."""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parent.parent
KEY = "test-key-0123456789abcdef"
PROMPT = "def read_config(path):\n"
N = 24


def start_server(home, *args: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, DFLASH_DESKTOP_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "dflash_desktop", "serve", "--port", "0", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("Serving"):
            return proc, line.split(" at ")[1].split()[0]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.stderr.read()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("home"), "--api-key", KEY)
    yield url
    proc.terminate()
    assert proc.wait(20) == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference():
    """The engine's own greedy answer to PROMPT, run in this process."""
    from engine.backends import load_pair
    from engine.limits import GenerationSettings
    from engine.loop import Generation
    demo = ROOT / "assets" / "demo"
    pair = load_pair("torch", demo / "target", demo / "draft", device="cpu")
    ids = pair.tokenizer.encode_prompt(PROMPT, raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=N)).run()
    return {"text": run.text, "prompt_tokens": len(ids), "completion_tokens": len(run.tokens)}


def post(url: str, body: bytes, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def announce_body(url: str, size: int) -> tuple[int, dict]:
    """Send only the headers of a request whose body would be `size` bytes: the server refuses it unread."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.putrequest("POST", parts.path)
    for name, value in (("Content-Type", "application/json"), ("Content-Length", str(size)),
                        ("Authorization", f"Bearer {KEY}")):
        conn.putheader(name, value)
    conn.endheaders()
    resp = conn.getresponse()
    try:
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def assert_extension(ext: dict, completion_tokens: int) -> None:
    assert ext["mode"] == "dflash" and ext["block_size"] == 16
    assert ext["steps"] > 0 and 0 <= ext["accepted"] <= ext["drafted"]
    assert ext["tau"] == pytest.approx((ext["accepted"] + ext["steps"]) / ext["steps"])
    assert ext["tok_s"] > 0 and sum(ext["histogram"]) == ext["steps"]
    assert completion_tokens <= ext["accepted"] + ext["steps"] + 1


def test_models_lists_the_demo_pair(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["demo"] and models[0].owned_by == "dflash-desktop"
    assert models[0].model_extra["dflash"]["has_drafter"] is True


def test_streamed_chat_completion_is_the_engines_text(client, reference):
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=N, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference["text"]
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (reference["prompt_tokens"],
                                                              reference["completion_tokens"])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert_extension(finals[0].model_extra["dflash"], usage.completion_tokens)
    assert any(c.model_extra["dflash"]["drafted_span"] for c in chunks if c.choices and c.choices[0].delta.content)


def test_plain_completion_is_the_engines_text(client, reference):
    done = client.completions.create(model="demo", prompt=PROMPT, max_tokens=N)
    assert done.choices[0].text == reference["text"] and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (reference["prompt_tokens"],
                                                                        reference["completion_tokens"])
    assert_extension(done.model_extra["dflash"], done.usage.completion_tokens)


def test_plain_decoding_on_request_writes_the_same_text(client, reference):
    done = client.completions.create(model="demo", prompt=PROMPT, max_tokens=N,
                                     extra_body={"dflash": {"mode": "baseline"}})
    ext = done.model_extra["dflash"]
    assert done.choices[0].text == reference["text"]
    assert ext["mode"] == "baseline" and ext["block_size"] == 1 and ext["drafted"] == 0 and ext["tau"] == 1.0


def test_refusals_are_openai_shaped_and_the_server_keeps_serving(server, client):
    wrong = openai.OpenAI(base_url=server, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.body["code"] == "invalid_api_key" and "Bearer" in info.value.body["message"]
    status, body = post(server + "/completions", b'{"prompt": "x"}', key=None)
    assert status == 401 and body["error"]["type"] == "invalid_request_error"

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt="x", max_tokens=40_000)
    assert info.value.body["param"] == "max_tokens" and "32768" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt=" x" * 5000, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded" and "2048" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}], n=2)
    assert info.value.body["param"] == "n"

    status, body = post(server + "/chat/completions", b'{"messages": [{"role": "user", "content": "x"}')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = announce_body(server + "/completions", 9 * 2**20)
    assert status == 413 and body["error"]["code"] == "request_too_large" and "8 MiB" in body["error"]["message"]

    done = client.completions.create(model="demo", prompt=PROMPT, max_tokens=3)
    assert done.usage.completion_tokens == 3


@pytest.mark.parametrize("args,message", [
    (["--host", "0.0.0.0"], "needs an API key"),
    (["--host", "0.0.0.0", "--api-key", "short"], "at least 16 characters"),
    (["--port", "70000"], "not a port number"),
])
def test_unsafe_or_impossible_starts_are_refused_before_loading(tmp_path, args, message):
    env = dict(os.environ, DFLASH_DESKTOP_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "dflash_desktop", "serve", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
