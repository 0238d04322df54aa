"""The local server inside the window shares the engine with the chat through the job queue: requests from
two clients and a chat message all finish, in the order they came, with nothing lost; the status bar
says when a server request runs; a client that goes away cancels its job. Real window, real worker,
real server on 127.0.0.1, the official openai client."""
from __future__ import annotations

import http.client
import json
import threading
import urllib.parse

import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from dflash_desktop import settings as settings_mod
from tests.ui_chat_fixtures import ANSWER_TIMEOUT_MS, chat_worker, echo_pair, home, make_window  # noqa: F401

LONG = 1500
PLAIN = {"dflash": {"mode": "baseline"}}   # one token per step: the echo pair would write LONG tokens at once


@pytest.fixture
def window(qtbot, home, chat_worker, echo_pair):
    settings = settings_mod.Settings(max_new_tokens=24, draft_cutoff=0.0, server_port=free_port())
    w = make_window(qtbot, chat_worker, echo_pair, settings)
    yield w
    w.local_server.stop()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(qtbot, window) -> str:
    window.server_action.trigger()
    qtbot.waitUntil(lambda: window.local_server.url is not None, timeout=10_000)
    return window.local_server.url


def server_jobs(window) -> list:
    return [j for j in window.worker.queue.finished if j.owner == "server"]


def test_two_clients_and_a_chat_finish_in_order_with_nothing_lost(qtbot, window):
    url = start_server(qtbot, window)
    assert window.server_status.address.text() == url and url.startswith("http://127.0.0.1:")
    window.server_status.copy_button.click()
    assert QGuiApplication.clipboard().text() == url
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    started: list[str] = []
    window.worker.jobs.connect(lambda ev: ev["running"] and (not started or started[-1] != ev["running"]["id"])
                               and started.append(ev["running"]["id"]))
    results: dict = {}

    def stream_a():
        chunks = list(client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "a"}], max_tokens=400, stream=True,
            stream_options={"include_usage": True}))
        results["a"] = ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage)

    def complete_b():
        results["b"] = client.completions.create(model="echo", prompt="b", max_tokens=300)

    a = threading.Thread(target=stream_a)
    a.start()
    qtbot.waitUntil(lambda: getattr(window.worker.queue.running, "owner", None) == "server", timeout=30_000)
    qtbot.waitUntil(lambda: window.server_status.activity.text().startswith("serving a request"), timeout=5_000)
    b = threading.Thread(target=complete_b)
    b.start()
    qtbot.waitUntil(lambda: len(window.worker.queue.queued) == 1, timeout=10_000)
    qtbot.waitUntil(lambda: window.server_status.activity.text() == "serving a request, 1 waiting", timeout=5_000)
    with qtbot.waitSignal(window.controller.answerFinished, timeout=ANSWER_TIMEOUT_MS) as chat:
        qtbot.keyClicks(window.chat_view.input, "c")
        qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
    a.join(60)
    b.join(60)

    assert chat.args[0]["event"] == "done" and chat.args[0]["stop_reason"] == "length"   # never `busy`
    owners = [j.owner for j in window.worker.queue.finished if j.id in started]
    assert owners == ["server", "server", "app"], started
    a_text, a_usage = results["a"]
    assert a_usage.completion_tokens == 400 and a_text == "!" * 400   # the echo pair writes one '!' per token
    assert results["b"].usage.completion_tokens == 300 and results["b"].choices[0].text == "!" * 300
    finals = {j.owner: j.final for j in window.worker.queue.finished if j.id in started}
    assert finals["app"]["stats"]["generated_tokens"] == 24
    qtbot.waitUntil(lambda: window.server_status.activity.text() == "idle", timeout=5_000)


def test_a_client_that_disconnects_cancels_its_job(qtbot, window):
    url = start_server(qtbot, window)
    before = len(server_jobs(window))   # the worker (and its queue) serves the whole module
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=LONG, stream=True, extra_body=PLAIN)
    next(iter(stream))
    stream.close()
    qtbot.waitUntil(lambda: len(server_jobs(window)) == before + 1, timeout=30_000)
    done = server_jobs(window)[-1].final
    assert done["stop_reason"] == "cancelled" and done["stats"]["generated_tokens"] < LONG // 2

    parts = urllib.parse.urlsplit(url)   # the same without streaming: the client hangs up while it waits
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("POST", parts.path + "/completions", json.dumps({"prompt": "y", "max_tokens": LONG, **PLAIN}),
                 {"Content-Type": "application/json"})
    qtbot.waitUntil(lambda: getattr(window.worker.queue.running, "owner", None) == "server", timeout=30_000)
    conn.close()
    qtbot.waitUntil(lambda: len(server_jobs(window)) == before + 2, timeout=30_000)
    done = server_jobs(window)[-1].final
    assert done["stop_reason"] == "cancelled" and done["stats"]["generated_tokens"] < LONG // 2


def test_the_switch_uses_the_settings_reports_a_port_in_use_and_stops(qtbot, window):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", window.settings.server_port))
        taken.listen()
        window.server_action.trigger()
        assert window.local_server.url is None and not window.server_action.isChecked()
        assert "Another program may use that port" in window.status_label.text()
    window.settings.server_api_key = "gui-key"
    url = start_server(qtbot, window)
    assert url.endswith(f":{window.settings.server_port}/v1") and "API key required" in window.status_label.text()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
    assert openai.OpenAI(base_url=url, api_key="gui-key", max_retries=0).models.list().data[0].id == "echo"
    window.server_action.trigger()
    assert window.local_server.url is None and not window.server_status.address.isVisible()
    assert window.status_label.text() == "Local server stopped."
    qtbot.waitUntil(lambda: not _answers(url), timeout=10_000)


def _answers(url: str) -> bool:
    try:
        openai.OpenAI(base_url=url, api_key="gui-key", max_retries=0, timeout=2).models.list()
        return True
    except openai.APIConnectionError:
        return False


def test_a_web_pages_blind_post_or_rebound_name_starts_no_job(qtbot, window):
    """What a page in a browser can send without the server's consent (text/plain, a foreign Origin, a name of
    its own pointed at 127.0.0.1) is refused by the window's server before any job is queued."""
    url = start_server(qtbot, window)
    parts = urllib.parse.urlsplit(url)
    earlier = server_jobs(window)            # the worker, and its queue, serve the whole module
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    refusals = [({"Content-Type": "text/plain"}, 415),
                ({"Content-Type": "text/plain", "Origin": "https://evil.example"}, 403),
                ({"Content-Type": "application/json", "Host": f"rebound.evil.example:{parts.port}"}, 421)]
    for headers, expected in refusals:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.putrequest("POST", "/v1/completions", skip_host="Host" in headers)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        assert resp.status == expected and json.loads(resp.read())["error"]["message"], headers
        conn.close()
    assert server_jobs(window) == earlier and window.worker.queue.running is None


def test_the_window_loads_its_pair_again_when_the_engine_dies_while_the_server_is_on(qtbot, window):
    """Runs last in this module: it kills the shared worker. With the local server on, other programs must not
    wait for a chat message to bring the model back: the window loads it again by itself."""
    import os
    import signal
    url = start_server(qtbot, window)
    pid = window.worker.client.pid
    with qtbot.waitSignal(window.session.pairLoaded, timeout=120_000):
        os.kill(pid, signal.SIGKILL)
    assert window.worker.client.pid != pid
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    done = client.completions.create(model="echo", prompt="abc", max_tokens=4)
    assert done.usage.completion_tokens == 4
