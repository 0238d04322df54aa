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


def start_server(home, *args: str, pair: tuple[str, ...] = ("--pair", "demo", "--engine", "torch")
                 ) -> tuple[subprocess.Popen, str]:
    """`serve` with args; without --target, on `pair` (default: the code pair in the torch engine, whose
    answers the reference fixture computes; () leaves the choice to serve)."""
    args = args if "--target" in args else (*pair, *args)
    env = dict(os.environ, DFLASH_DESKTOP_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "dflash_desktop", "serve", "--port", "0", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300    # a first load may calibrate and compare engines
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


def test_the_repeat_penalty_and_min_p_of_llama_cpps_api_reach_the_engine(client, reference):
    """llama-server's and LM Studio's names; the answer is the engine's own under the same penalty."""
    from engine.backends import load_pair
    from engine.limits import GenerationSettings
    from engine.loop import Generation
    demo = ROOT / "assets" / "demo"
    pair = load_pair("torch", demo / "target", demo / "draft", device="cpu")
    ids = pair.tokenizer.encode_prompt(PROMPT, raw=True)
    want = Generation(pair, ids, GenerationSettings(max_new_tokens=N, repeat_penalty=1.6)).run().text
    done = client.completions.create(model="demo", prompt=PROMPT, max_tokens=N,
                                     extra_body={"repeat_penalty": 1.6, "min_p": 0.1})
    assert done.choices[0].text == want != reference["text"]
    for name, value in (("repeat_penalty", 3), ("min_p", 1.0)):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="demo", prompt="x", max_tokens=4, extra_body={name: value})
        assert info.value.body["param"] == name and name in info.value.body["message"]


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
    (["--allow-origin", "*"], "is not a web origin"),
])
def test_unsafe_or_impossible_starts_are_refused_before_loading(tmp_path, args, message):
    env = dict(os.environ, DFLASH_DESKTOP_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "dflash_desktop", "serve", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def raw_request(url: str, method: str = "GET", path: str = "/v1/models", body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, dict, dict]:
    """One request with exactly these headers (Host included, when given): status, JSON body, response headers."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host="Host" in (headers or {}))
        for name, value in {"Authorization": f"Bearer {KEY}", **(headers or {})}.items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        text = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return resp.status, json.loads(text) if "json" in headers.get("content-type", "") else {}, headers
    finally:
        conn.close()


GENERATE = json.dumps({"prompt": PROMPT, "max_tokens": 3}).encode()


def test_web_pages_cannot_start_a_generation_or_rebind_a_name(server):
    """A page's blind text/plain POST (no CORS preflight), a foreign Origin and a foreign Host (DNS rebinding)
    are refused before anything runs; this computer's own names and origins still work."""
    port = urllib.parse.urlsplit(server).port
    status, body, _ = raw_request(server, "POST", "/v1/completions", GENERATE, {"Content-Type": "text/plain"})
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    assert "application/json" in body["error"]["message"]
    status, body, _ = raw_request(server, "POST", "/v1/completions", GENERATE,
                                  {"Content-Type": "text/plain", "Origin": "https://evil.example"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    assert "--allow-origin" in body["error"]["message"]
    status, body, _ = raw_request(server, "POST", "/v1/completions", GENERATE,
                                  {"Content-Type": "application/json", "Origin": "null"})
    assert status == 403
    for host in (f"evil.example:{port}", f"localhost.evil.example:{port}", f"127.0.0.1:{port + 1}", "localhost"):
        status, body, _ = raw_request(server, "POST", "/v1/completions", GENERATE,
                                      {"Content-Type": "application/json", "Host": host})
        assert status == 421 and body["error"]["code"] == "misdirected_request", host
        assert "host name" in body["error"]["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        status, body, _ = raw_request(server, headers={"Host": host, "Origin": "http://localhost:3000"})
        assert status == 200 and body["data"][0]["id"] == "demo", host
    status, body, _ = raw_request(server, "POST", "/v1/completions", GENERATE, {
        "Content-Type": "application/json; charset=utf-8", "Origin": "http://127.0.0.1:8080"})
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_request_fields_the_api_got_wrong_are_answered_as_openai_would(server, client):
    status, body = post(server + "/chat/completions", json.dumps({"messages": []}).encode())
    assert status == 400 and body["error"]["param"] == "messages" and "non-empty" in body["error"]["message"]
    done = client.completions.create(model="demo", prompt=PROMPT, max_tokens=3,
                                     extra_body={"max_completion_tokens": None})
    assert done.usage.completion_tokens == 3          # a null max_completion_tokens does not hide max_tokens
    status, body = post(server + "/completions", json.dumps({"prompt": [1, 2, 10**6], "max_tokens": 2}).encode())
    assert status == 400 and body["error"]["param"] == "prompt" and "token id 1000000" in body["error"]["message"]
    assert client_answers(server)


def test_idle_and_trickling_connections_are_closed(server):
    """A connection that never sends a whole request, or sends it a header at a time, is closed after
    IDLE_TIMEOUT_S instead of holding a file descriptor for ever."""
    import socket
    from dflash_desktop.server import IDLE_TIMEOUT_S
    parts = urllib.parse.urlsplit(server)
    idle = socket.create_connection((parts.hostname, parts.port), timeout=IDLE_TIMEOUT_S + 10)
    slow = socket.create_connection((parts.hostname, parts.port), timeout=1)
    slow.sendall(b"GET /v1/models HTTP/1.1\r\n")
    start, closed = time.monotonic(), False
    while time.monotonic() - start < IDLE_TIMEOUT_S + 10 and not closed:
        try:
            slow.sendall(b"X-Slow: 1\r\n")
            closed = slow.recv(1) == b""
        except socket.timeout:
            pass
        except OSError:
            closed = True
    assert closed and time.monotonic() - start >= IDLE_TIMEOUT_S - 1
    assert idle.recv(1) == b""
    idle.close()
    slow.close()
    assert client_answers(server)


def client_answers(url: str) -> bool:
    status, body, _ = raw_request(url)
    return status == 200 and bool(body["data"])


def test_serve_loads_its_pair_again_after_the_engine_is_killed(tmp_path):
    """kill -9 of the worker: requests get 503 with Retry-After while the pair loads again, the log says so,
    then the server answers as before. The same server lets pages of an origin given with --allow-origin in,
    with CORS headers."""
    import psutil
    proc, url = start_server(tmp_path, "--api-key", KEY, "--allow-origin", "https://app.example")
    try:
        status, _, headers = raw_request(url, headers={"Origin": "https://app.example"})
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        status, _, headers = raw_request(url, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert status == 200 and "POST" in headers["access-control-allow-methods"]
        assert raw_request(url, headers={"Origin": "https://other.example"})[0] == 403

        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 1
        workers[0].kill()
        workers[0].wait(10)
        deadline = time.monotonic() + 10
        while (status := raw_request(url)[0]) == 200 and time.monotonic() < deadline:
            time.sleep(0.05)    # until the server has seen its engine go
        status, body, headers = raw_request(url, "POST", "/v1/completions", GENERATE,
                                            {"Content-Type": "application/json"})
        assert status == 503 and int(headers["retry-after"]) > 0 and "try again" in body["error"]["message"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status, body, headers = raw_request(url, "POST", "/v1/completions", GENERATE,
                                                {"Content-Type": "application/json"})
            if status != 503:
                break
            assert int(headers["retry-after"]) > 0
            time.sleep(1)
        assert status == 200 and body["usage"]["completion_tokens"] == 3
        assert client_answers(url) and len(psutil.Process(proc.pid).children()) == 1
        time.sleep(1.5)     # serve notices the finished reload at its next check, twice a second, then says so
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "Serving demo again" in out and "loading demo again" in err
