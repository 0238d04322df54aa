"""The engine worker and its client, end to end: real subprocesses, a tiny random pair, no mocks of the
worker. Every wait has a timeout, so a hang fails the test instead of stalling the suite."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from dflash_desktop.logs import WorkerLog
from dflash_desktop.offers import Offers
from dflash_desktop.worker_client import WorkerClient, describe_exit, worker_command, worker_env
from engine import protocol as P

T = 60  # generous ceiling for anything that loads torch on a busy 2-core machine
LONG = 1500  # new tokens that would take seconds: long enough to cancel or kill mid-way


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    old = os.environ.get("DFLASH_DESKTOP_HOME")
    os.environ["DFLASH_DESKTOP_HOME"] = str(tmp_path_factory.mktemp("home"))
    yield os.environ["DFLASH_DESKTOP_HOME"]
    if old is None:
        os.environ.pop("DFLASH_DESKTOP_HOME", None)
    else:
        os.environ["DFLASH_DESKTOP_HOME"] = old


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    from tests.tiny_torch import save_random_pair
    target, draft = save_random_pair(tmp_path_factory.mktemp("pair"), block_size=8)
    return str(target), str(draft)


@pytest.fixture(scope="module")
def client(home, pair_dirs):
    events: list[dict] = []
    c = WorkerClient(on_event=events.append)
    c.events = events
    loaded = c.wait(c.load_pair(*pair_dirs), T)
    assert loaded["event"] == "loaded", loaded
    assert Offers.of(loaded) == Offers()        # a local pair offers the window everything
    yield c
    assert c.shutdown(10) == 0


def of(client, rid, kind=None):
    return [e for e in list(client.events) if e.get("id") == rid and (kind is None or e["event"] == kind)]


def wait_for(predicate, timeout=T, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def ensure_loaded(client, pair_dirs):
    if client.pair_info is None or not client.running:
        assert client.wait(client.load_pair(*pair_dirs), T)["event"] == "loaded"


# -- protocol module --------------------------------------------------------------------------------

def test_protocol_encode_decode_and_validation():
    msg = {"cmd": "generate", "id": "a", "prompt": "héllo ✓", "settings": {"max_new_tokens": 3}}
    line = P.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert P.validate_command(P.decode(line)) == msg
    cases = [
        (b"not json", "bad_message"), (b"[1, 2]", "bad_message"),
        (b'{"cmd": "fly", "id": "x"}', "unknown_command"), (b'{"id": "x"}', "bad_message"),
        (b'{"cmd": "hello", "id": "x"}', "bad_message"),                       # protocol missing
        (b'{"cmd": "hello", "id": "x", "protocol": true}', "bad_message"),     # bool is not an int
        (b'{"cmd": "generate", "id": "x", "prompt": "a", "messages": []}', "bad_message"),
        (b'{"cmd": "generate", "id": "x", "prompt": "a", "mode": "fast"}', "bad_message"),
        (b'{"cmd": "generate", "id": "x", "prompt_ids": [1, -2]}', "bad_message"),
        (b'{"cmd": "generate", "id": "x", "prompt": "a", "settings": {"temp": 1}}', "bad_settings"),
        (b'{"cmd": "load_pair", "id": "x", "target": "t", "dtype": "int3"}', "bad_message"),
        (b'{"cmd": "unload", "id": "x", "extra": 1}', "bad_message"),
    ]
    for raw, code in cases:
        with pytest.raises(P.ProtocolError) as info:
            P.validate_command(P.decode(raw))
        assert info.value.code == code, raw
    with pytest.raises(ValueError):
        P.encode({"x": float("nan")})


def test_any_line_decodes_or_is_bad_message_and_any_reply_encodes():
    hostile = [b"[" * 100_000, b'{"a":' * 100_000, b"\xff\xfe", b'{"n": 1' + b"0" * 5000 + b"}",
               b'{"cmd":"hello","id":"\\ud800","protocol":2}',
               b'{"cmd":"hello","id":"h","protocol":2,"\\udfffx":1}',
               b'{"cmd":"generate","id":"g","messages":[{"role":"user","content":"a\\ud83d"}]}']
    for raw in hostile:
        with pytest.raises(P.ProtocolError) as info:
            P.validate_command(P.decode(raw))
        assert info.value.code == "bad_message", raw[:40]
    assert "nested too deeply" in str(pytest.raises(P.ProtocolError, P.decode, b"[" * 100_000).value)
    with pytest.raises(P.ProtocolError, match=r"field name '\\udfffx' holds an unpaired surrogate"):
        P.validate_command(P.decode(hostile[5]))
    with pytest.raises(P.ProtocolError, match=r"field 'messages\[0\]\.content' holds an unpaired surrogate"):
        P.validate_command(P.decode(hostile[6]))
    assert P.validate_command(P.decode('{"cmd":"generate","id":"g","prompt":"\\ud83d\\ude00"}'.encode()))  # a pair
    reply = P.error_event("bad_message", "x", "\ud800", **{"odd\udc80": "\udfff"})
    line = P.encode(reply)
    assert line.decode("utf-8").count("\n") == 1 and P.decode(line) == reply


def test_worker_command_for_source_and_frozen(monkeypatch):
    assert worker_command(frozen=False, executable="/opt/py/bin/python3") == ["/opt/py/bin/python3", "-m", "engine.worker"]
    assert worker_command(frozen=True, executable="/Applications/DFlash.app/MacOS/DFlash") == [
        "/Applications/DFlash.app/MacOS/DFlash", "--worker"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert worker_command() == [sys.executable, "--worker"]
    assert "PYTHONPATH" not in worker_env({}, frozen=None)
    monkeypatch.delattr(sys, "frozen")
    assert worker_command() == [sys.executable, "-m", "engine.worker"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(P.__file__)))
    assert worker_env({"PYTHONPATH": "/x"}).get("PYTHONPATH") == os.pathsep.join([root, "/x"])


def test_frozen_entry_starts_a_working_worker(home):
    """What a PyInstaller build runs: the main entry hands `--worker` to run_worker_if_requested."""
    from dflash_desktop.worker_entry import run_worker_if_requested
    assert run_worker_if_requested(["app"]) is None and run_worker_if_requested(["app", "--other"]) is None
    entry = "import sys; from dflash_desktop.worker_entry import run_worker_if_requested as r; r(['app', '--worker'])"
    c = WorkerClient(command=[sys.executable, "-c", entry])
    try:
        c.start()
        wait_for(lambda: c.hello_info is not None, 20, "hello")
        assert c.hello_info["protocol"] == P.PROTOCOL_VERSION
    finally:
        assert c.shutdown(10) == 0


# -- generation through the worker --------------------------------------------------------------------

@pytest.mark.parametrize("settings", [{"max_new_tokens": 40},
                                      {"max_new_tokens": 40, "temperature": 0.9, "top_p": 0.95, "seed": 1234}],
                         ids=["greedy", "seeded"])
def test_same_tokens_as_in_process(client, pair_dirs, settings):
    from engine.limits import GenerationSettings
    from engine.loop import Generation
    from engine.backends.torch.engine import load_pair
    ensure_loaded(client, pair_dirs)
    pair = load_pair(*pair_dirs)
    messages = [{"role": "user", "content": "Tell me about speculative decoding."}]
    local = Generation(pair, pair.tokenizer.encode_chat(messages), GenerationSettings(**settings)).run()
    rid = client.generate(messages=messages, settings=settings)
    done = client.wait(rid, T)
    assert done["event"] == "done", done
    assert done["token_ids"] == local.tokens and done["text"] == local.text
    assert done["stop_reason"] == local.stop_reason
    chunks = of(client, rid, "tokens")
    assert [t for c in chunks for t in c["tokens"]] == local.tokens
    assert "".join(s for c in chunks for s, _ in c["spans"]) == local.text
    assert sum(len(c["steps"]) for c in chunks) == local.stats.steps + 1  # + the prefill's token
    assert done["stats"]["generated_tokens"] == len(local.tokens) and done["stats"]["steps"] == local.stats.steps
    # baseline mode is lossless against DFlash under greedy decoding
    if settings.get("temperature", 0) == 0:
        base = client.wait(client.generate(messages=messages, settings=settings, mode="baseline"), T)
        assert base["token_ids"] == local.tokens and base["stats"]["block_size"] == 1


def test_cancel_stops_within_one_step_and_busy_is_refused(client, pair_dirs):
    ensure_loaded(client, pair_dirs)
    rid = client.generate(prompt="Count forever:", settings={"max_new_tokens": LONG})
    wait_for(lambda: of(client, rid, "tokens"), T, "first tokens")
    busy = client.wait(client.generate(prompt="second", settings={"max_new_tokens": 3}), T)
    assert busy["code"] == "busy" and busy["active_id"] == rid
    cid = client.cancel()
    ack = client.wait(cid, 10)
    assert ack["event"] == "ok" and ack["cancelled"] == rid
    done = client.wait(rid, 10)
    assert done["event"] == "done" and done["stop_reason"] == "cancelled"
    after = client.events[client.events.index(ack):]
    late = [e for e in after if e.get("id") == rid and e["event"] == "tokens" and e["tokens"]]
    assert len(late) <= 1, f"{len(late)} steps ran after the cancel was seen"
    assert 0 < done["stats"]["generated_tokens"] < LONG // 2
    assert done["text"] and len(done["token_ids"]) == done["stats"]["generated_tokens"]
    after_cancel = client.wait(client.generate(prompt="Next", settings={"max_new_tokens": 5}), T)
    assert after_cancel["event"] == "done" and after_cancel["stop_reason"] == "length"


def test_engine_errors_are_clear_and_the_worker_survives(client, pair_dirs):
    ensure_loaded(client, pair_dirs)
    bad = client.wait(client.generate(prompt="x", settings={"temperature": -1.0}), T)
    assert bad["code"] == "bad_settings" and "temperature" in bad["message"].lower()
    bad = client.wait(client.generate(prompt="x", settings={"max_new_tokens": "many"}), T)
    assert bad["code"] == "bad_settings"
    bad = client.wait(client.generate(prompt="x", settings={"block_size": 32}), T)
    assert bad["code"] == "bad_settings" and "block size" in bad["message"]
    bad = client.wait(client.generate(prompt_ids=[1] * 2100, settings={"max_new_tokens": 2}), T)
    assert bad["code"] == "prompt_too_long"
    bad = client.wait(client.generate(prompt_ids=[1, 10**9], settings={"max_new_tokens": 2}), T)
    assert bad["code"] == "bad_message" and "vocabulary" in bad["message"]
    bad = client.wait(client.generate(messages=[], settings={"max_new_tokens": 2}), T)
    assert bad["code"] == "bad_message" and "messages is empty" in bad["message"]
    info = client.pair_info
    missing = client.wait(client.load_pair("/no/such/model", None), T)
    assert missing["code"] == "bad_checkpoint" and "/no/such/model" in missing["message"]
    assert missing["pair"]["target"] == info["target"] and client.pair_info is info   # refused before unloading
    assert client.wait(client.unload(), T)["event"] == "ok"
    nopair = client.wait(client.generate(prompt="x"), T)
    assert nopair["code"] == "no_pair"
    ensure_loaded(client, pair_dirs)
    hw = client.wait(client.hardware(), T)
    torch_engine = hw["engines"]["torch"]
    assert hw["event"] == "hardware" and torch_engine["version"].startswith("2.")
    assert {"engine": "torch", "device": "cpu", "class": "cpu"}.items() <= torch_engine["devices"][0].items()
    assert torch_engine["devices"][0]["threads"] >= 1 and hw["cpu_count"] >= 1
    assert client.wait(client.generate(prompt="ok", settings={"max_new_tokens": 3}), T)["event"] == "done"


def test_kill_9_reports_within_a_second_and_next_request_restarts(client, pair_dirs):
    ensure_loaded(client, pair_dirs)
    rid = client.generate(prompt="Run long", settings={"max_new_tokens": LONG})
    wait_for(lambda: of(client, rid, "tokens"), T, "first tokens")
    old_pid = client.pid
    os.kill(old_pid, signal.SIGKILL)
    t0 = time.monotonic()
    err = client.wait(rid, 5)
    assert time.monotonic() - t0 < 1.0
    assert err["event"] == "error" and err["code"] == "worker_crashed"
    assert err["signal"] == "SIGKILL" and err["exit_code"] == -signal.SIGKILL
    assert "killed" in err["message"] and "reloads the model" in err["message"]
    assert err["log_path"].endswith("worker.log") and os.path.isfile(err["log_path"])
    assert any("worker" in line for line in err["stderr_tail"])
    assert not client.busy and client.pair_info is None
    again = client.generate(prompt="Hello again", settings={"max_new_tokens": 8})
    done = client.wait(again, T)
    assert done["event"] == "done" and done["stats"]["generated_tokens"] == 8
    assert client.pid != old_pid and client.pair_info is not None  # reloaded without being asked
    assert any(e["event"] == "loaded" and e["id"].startswith("auto-reload") for e in client.events)


def test_a_load_that_fails_leaves_the_loaded_pair_working(client, pair_dirs, tmp_path):
    """A folder that is not a model (it exists, so only the engine's load finds out): the pair loaded before
    stays loaded in the worker, the error says so, and it still answers."""
    ensure_loaded(client, pair_dirs)
    info = client.pair_info
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "config.json").write_text('{"model_type": "llama", "hidden_size": "big"}')
    err = client.wait(client.load_pair(tmp_path / "not-a-model", None, engine="torch"), T)
    assert err["event"] == "error" and err["pair"]["target"] == info["target"] and client.pair_info is info
    done = client.wait(client.generate(prompt="Still here", settings={"max_new_tokens": 4}), T)
    assert done["event"] == "done" and done["stats"]["generated_tokens"] == 4


def test_refused_load_and_unload_keep_the_pair(client, pair_dirs):
    """The client believes the worker's answers, not its own requests: a `busy` refusal changes nothing."""
    ensure_loaded(client, pair_dirs)
    info = client.pair_info
    rid = client.generate(prompt="Keep going:", settings={"max_new_tokens": LONG})
    wait_for(lambda: of(client, rid, "tokens"), T, "first tokens")
    assert client.wait(client.unload(), T)["code"] == "busy"
    assert client.wait(client.load_pair(*pair_dirs), T)["code"] == "busy"
    assert client.pair_info is info and client._last_pair is not None  # what a restart would reload
    client.wait(client.cancel(rid), 10)
    assert client.wait(rid, 10)["stop_reason"] == "cancelled"
    uid = client.unload()
    assert client.wait(uid, T) == {"event": "ok", "id": uid, "cmd": "unload", "unloaded": True}
    assert client.pair_info is None and client._last_pair is None


def test_a_request_that_cannot_be_sent_ends_with_bad_message(client, pair_dirs):
    """Text with a lone surrogate or a NaN setting from the window's side: one error, and the client is not left busy."""
    ensure_loaded(client, pair_dirs)
    err = client.wait(client.generate(prompt="\ud800"), T)
    assert err["code"] == "bad_message" and "surrogate" in err["message"] and not client.busy
    err = client.wait(client.generate(prompt="x", settings={"temperature": float("nan")}), 5)
    assert err["code"] == "bad_message" and "could not be sent" in err["message"] and not client.busy
    assert client.wait(client.generate(prompt="ok", settings={"max_new_tokens": 2}), T)["event"] == "done"


# -- workers that cannot start, do not speak our protocol, or get hostile input -----------------------

def raw_worker():
    """The worker process on bare pipes, and ask(line) -> its next reply, which must be valid UTF-8 JSON."""
    proc = subprocess.Popen(worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=worker_env())
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def ask(raw: bytes) -> dict:
        proc.stdin.write(raw + b"\n")
        proc.stdin.flush()
        return P.decode(lines.get(timeout=20))
    return proc, ask


def test_raw_protocol_errors_and_eof_exit(home):
    """Straight to the worker process over pipes: malformed, unknown and mismatched messages."""
    proc, ask = raw_worker()
    try:
        assert ask(b'{"cmd":"hello","id":"h","protocol":%d}' % P.PROTOCOL_VERSION)["event"] == "hello"
        assert ask(b"{oops")["code"] == "bad_message"
        unknown = ask(b'{"cmd":"teleport","id":"t2"}')
        assert unknown["code"] == "unknown_command" and unknown["id"] == "t2"
        old = ask(b'{"cmd":"hello","id":"h0","protocol":0}')
        assert old["code"] == "version_mismatch" and old["worker_protocol"] == P.PROTOCOL_VERSION
        assert ask(b'{"cmd":"generate","id":"g","prompt":5}')["code"] == "bad_message"
        assert ask(b'{"cmd":"cancel","id":"c"}') == {"event": "ok", "id": "c", "cmd": "cancel", "cancelled": None}
        proc.stdin.close()  # the GUI went away: the worker must exit on its own
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_no_line_kills_the_worker(home):
    """Deep nesting and lone surrogates (in the id, a field name, the text) each get one `bad_message`,
    with the id echoed as a JSON escape, and the worker answers the next command."""
    proc, ask = raw_worker()
    hello = b'{"cmd":"hello","id":"h","protocol":%d}' % P.PROTOCOL_VERSION
    try:
        for raw in (b"[" * 100_000, b'{"a":' * 100_000, b"\xff" * 10):
            err = ask(raw)
            assert (err["event"], err["id"], err["code"]) == ("error", None, "bad_message")
        surrogate_id = ask(b'{"cmd":"hello","id":"\\ud800","protocol":%d}' % P.PROTOCOL_VERSION)
        assert surrogate_id["id"] == "\ud800" and surrogate_id["code"] == "bad_message"
        field = ask(b'{"cmd":"hardware","id":"f","\\udc80":1}')
        assert field["id"] == "f" and field["code"] == "bad_message" and "field name" in field["message"]
        text = ask(b'{"cmd":"generate","id":"t","prompt":"\\udbff"}')
        assert text["id"] == "t" and text["code"] == "bad_message" and "'prompt'" in text["message"]
        assert ask(hello)["event"] == "hello"
    finally:
        proc.kill()
        proc.wait(10)


# The real worker (engine.worker.main) with engine.backends.load_pair wrapped, for failures no model gives on
# demand: a target folder named "exit" raises SystemExit, one named "hang" never returns, and any other load
# is held after its first stage until it is cancelled or the test creates the gate file (one file, one load).
PATCHED_WORKER = """
import os, sys, time
import engine.backends
from engine.worker import main

real_load_pair, gate = engine.backends.load_pair, sys.argv[1]

def load_pair(engine, target, *args, progress=None, cancelled=lambda: False, **kwargs):
    name = os.path.basename(target)
    if name == "exit":
        raise SystemExit(3)
    if name == "hang":
        time.sleep(3600)
    if name == "slow":                 # a load that takes longer than the timeout but keeps reporting
        for _ in range(16):
            progress("weights", "still reading")
            time.sleep(0.25)
        raise SystemExit(4)
    held = [True]

    def hold(stage, message):
        progress(stage, message)
        while held[0] and not cancelled():
            if os.path.exists(gate):
                os.remove(gate)
                held[0] = False
            time.sleep(0.01)
    return real_load_pair(engine, target, *args, progress=hold, cancelled=cancelled, **kwargs)

engine.backends.load_pair = load_pair
main()
"""


def patched_client(gate, **options) -> WorkerClient:
    events: list[dict] = []
    c = WorkerClient(on_event=events.append, command=[sys.executable, "-c", PATCHED_WORKER, str(gate)], **options)
    c.events, c.gate = events, gate
    return c


@pytest.fixture(scope="module")
def patched(home, tmp_path_factory):
    c = patched_client(tmp_path_factory.mktemp("gate") / "open")
    yield c
    assert c.shutdown(10) == 0


def test_system_exit_in_a_load_is_answered_and_the_worker_goes_on(patched, tmp_path):
    (tmp_path / "exit").mkdir()
    err = patched.wait(patched.load_pair(tmp_path / "exit"), T)
    assert err["code"] == "internal" and "SystemExit" in err["message"] and err["pair"] is None
    assert patched.wait(patched.unload(), T)["event"] == "ok" and patched.running


def test_cancel_stops_a_running_load_between_stages(patched, pair_dirs):
    patched.gate.touch()
    assert patched.wait(patched.load_pair(*pair_dirs), T)["event"] == "loaded"  # a pair the next load replaces
    rid = patched.load_pair(*pair_dirs)
    wait_for(lambda: [e["stage"] for e in of(patched, rid, "progress")] == ["import", "weights"], T, "the first stage")
    assert patched.wait(patched.cancel(), 10)["cancelled"] == rid  # no target: the load that runs
    err = patched.wait(rid, T)
    kept = patched.pair_info
    assert err["code"] == "cancelled" and err["pair"]["target"] == kept["target"] == str(pair_dirs[0])
    assert not of(patched, rid, "loaded")   # the pair loaded before stays: it fits beside the one that was loading
    assert patched.wait(patched.generate(prompt="x", settings={"max_new_tokens": 2}), T)["event"] == "done"


def test_cancel_answers_a_queued_load_without_loading_it(patched, pair_dirs):
    first = patched.load_pair(*pair_dirs)
    wait_for(lambda: of(patched, first, "progress"), T, "the first load to start")
    second = patched.load_pair(*pair_dirs)
    assert patched.wait(patched.cancel(second), 10)["cancelled"] == second
    patched.gate.touch()  # let the first load finish
    assert patched.wait(first, T)["event"] == "loaded"
    err = patched.wait(second, T)
    assert err["code"] == "cancelled" and "before it started" in err["message"]
    assert of(patched, second) == [err] and patched.pair_info["id"] == first  # no progress: it never ran
    assert patched.wait(patched.generate(prompt="x", settings={"max_new_tokens": 2}), T)["event"] == "done"


def test_a_load_that_hangs_times_out_and_the_next_request_gets_a_fresh_worker(home, tmp_path):
    (tmp_path / "hang").mkdir()
    c = patched_client(tmp_path / "gate", load_timeout=2)
    try:
        rid = c.load_pair(tmp_path / "hang")
        old_pid = c.pid
        wait_for(lambda: of(c, rid, "progress"), T, "the load to start")
        for _ in range(60):      # a cancel is answered from the worker's main thread: no sign the load goes on
            c.cancel(rid)
            try:
                err = c.wait(rid, 0.3)
                break
            except TimeoutError:
                continue
        assert err["code"] == "timeout" and "said nothing for 2 s" in err["message"]
        assert not c.busy and c.pair_info is None
        wait_for(lambda: not c.running, 10, "the stuck worker to be stopped")
        hello = c.wait(c.request("hello", protocol=P.PROTOCOL_VERSION), T)
        assert hello["event"] == "hello" and hello["pid"] != old_pid
    finally:
        assert c.shutdown(10) == 0


def test_a_slow_load_that_reports_progress_is_not_cut_off(home, tmp_path):
    """The timeout is the worker's silence, not the load's length: a first load that compares engines on a busy
    CPU takes as long as it needs, while it says what it is doing."""
    (tmp_path / "slow").mkdir()
    c = patched_client(tmp_path / "gate", load_timeout=2)
    try:
        assert c.wait(c.hardware(), T)["event"] == "hardware"   # torch imported: the load's own silence is short
        rid = c.load_pair(tmp_path / "slow")
        pid = c.pid
        err = c.wait(rid, 20)
        assert err["code"] == "internal" and "SystemExit: 4" in err["message"]   # its own end, after 4 s, not timeout
        assert len(of(c, rid, "progress")) >= 16 and c.running and c.pid == pid
    finally:
        assert c.shutdown(10) == 0


def test_broken_torch_install_is_an_error_not_a_hang(home, pair_dirs, tmp_path):
    (tmp_path / "torch.py").write_text("raise ImportError('broken torch for this test')\n")
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    c = WorkerClient(env=env)
    try:
        err = c.wait(c.load_pair(*pair_dirs), T)
        assert err["code"] == "engine_unavailable" and "broken torch for this test" in err["message"]
        assert c.running  # the worker itself stays up and answers
        assert c.wait(c.hardware(), T)["code"] == "engine_unavailable"
    finally:
        assert c.shutdown(10) == 0


def test_worker_that_dies_at_import_reports_its_traceback(home):
    script = "import sys; print('loading engine', file=sys.stderr); raise ImportError('engine module is broken')"
    events: list[dict] = []
    c = WorkerClient(on_event=events.append, command=[sys.executable, "-c", script])
    err = c.wait(c.generate(prompt="hi"), 20)
    assert err["code"] == "worker_start_failed" and err["exit_code"] == 1
    assert "could not start" in err["message"]
    assert any("ImportError: engine module is broken" in line for line in err["stderr_tail"])
    assert [e["event"] for e in events if e["event"] == "error"] == ["error"]  # one report, not three
    with open(err["log_path"], encoding="utf-8") as f:
        assert "engine module is broken" in f.read()


def test_missing_executable_and_silent_worker(home, tmp_path):
    c = WorkerClient(command=[str(tmp_path / "no-such-app"), "--worker"])
    err = c.wait(c.generate(prompt="hi"), 5)
    assert err["code"] == "worker_start_failed" and "no-such-app" in err["message"]
    silent = WorkerClient(command=[sys.executable, "-c", "import time; time.sleep(60)"], start_timeout=1.0)
    t0 = time.monotonic()
    err = silent.wait(silent.generate(prompt="hi"), 10)
    assert err["code"] == "worker_start_failed" and "did not answer" in err["message"]
    assert time.monotonic() - t0 < 5 and not silent.running


def test_client_refuses_a_worker_of_another_protocol_version(home):
    """A stand-in for a worker from an older release: it answers hello with protocol 0."""
    old = ("import json, sys\n"
           "msg = json.loads(sys.stdin.readline())\n"
           "print(json.dumps({'event': 'hello', 'id': msg['id'], 'protocol': 0}), flush=True)\n"
           "sys.stdin.read()\n")
    c = WorkerClient(command=[sys.executable, "-c", old])
    err = c.wait(c.hardware(), 20)
    assert err["code"] == "version_mismatch"
    wait_for(lambda: not c.running, 10, "the old worker to be stopped")


def test_log_rotation_keeps_five_files(tmp_path):
    log = WorkerLog(tmp_path / "rot" / "worker.log", max_bytes=2000, backups=4)
    for i in range(400):
        log.write(f"line {i} " + "x" * 40, pid=123)
    log.flush()
    files = sorted(p.name for p in (tmp_path / "rot").iterdir())
    assert files == ["worker.log", "worker.log.1", "worker.log.2", "worker.log.3", "worker.log.4"]
    assert all((tmp_path / "rot" / f).stat().st_size <= 2000 for f in files)
    assert "line 399" in (tmp_path / "rot" / "worker.log").read_text()


def test_describe_exit_in_plain_language():
    assert "out of memory" in describe_exit(-9, True)
    assert "crashed" in describe_exit(-11, True) and "SIGSEGV" in describe_exit(-11, True)
    assert "exit code 3" in describe_exit(3, True)
    assert "could not start" in describe_exit(1, False)


def test_loaded_event_says_whether_thinking_can_be_switched(client, pair_dirs, tmp_path):
    from tests.tiny_torch import save_random_pair
    plain = client.wait(client.load_pair(*pair_dirs), T)
    assert plain["chat_template"] is False and plain["supports_thinking"] is False
    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}")
    target, draft = save_random_pair(tmp_path, block_size=8, chat_template=template)
    thinking = client.wait(client.load_pair(str(target), str(draft)), T)
    assert thinking["chat_template"] is True and thinking["supports_thinking"] is True
    assert client.wait(client.load_pair(*pair_dirs), T)["event"] == "loaded"  # leave the module's pair loaded


def test_a_plain_fallback_is_announced_and_kept_in_the_stats(client, pair_dirs):
    """A random drafter is almost never right: the worker warns when the loop switches to plain decoding."""
    ensure_loaded(client, pair_dirs)
    rid = client.generate(prompt="Hello there", settings={"max_new_tokens": 80, "draft_cutoff": 0.0})
    done = client.wait(rid, T)
    warnings = of(client, rid, "warning")
    assert [w["code"] for w in warnings] == ["plain_fallback"] and "break-even" in warnings[0]["message"]
    assert done["stats"]["fallback"]["reason"] == warnings[0]["message"]
    off = client.wait(client.generate(prompt="Hello there", settings={"max_new_tokens": 80, "draft_cutoff": 0.0,
                                                                       "plain_fallback": False}), T)
    assert off["stats"]["fallback"] is None and off["token_ids"] == done["token_ids"]


def test_an_endless_line_is_read_in_bounded_pieces(monkeypatch):
    """A line past the limit is never held whole: its first piece is refused, the rest skipped, and the
    next line is read as usual."""
    import io

    from engine import worker
    monkeypatch.setattr(P, "MAX_LINE_BYTES", 100)
    stream = io.BytesIO(b"x" * 10_000 + b"\n" + b'{"cmd": "hello"}\n')
    got = list(worker.lines(stream))
    assert [len(g) for g in got] == [101, 17]
    with pytest.raises(P.ProtocolError, match="exceeds the 100-byte limit"):
        P.decode(got[0])
