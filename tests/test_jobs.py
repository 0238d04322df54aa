"""The job queue in front of a real worker: callers never see `busy`, jobs run first come first served,
each caller gets only its own events, and a job cancelled while it waits ends at once as a cancelled
request would."""
from __future__ import annotations

import threading

import pytest

from dflash_desktop.jobs import JobQueue
from dflash_desktop.worker_client import WorkerClient

T = 60


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    from tests.tiny_torch import save_random_pair
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("home")))
        target, draft = save_random_pair(tmp_path_factory.mktemp("pair"), block_size=8)
        others: list[dict] = []
        queue = JobQueue(on_event=others.append)
        client = WorkerClient(on_event=queue.intake)
        queue.backend = client
        queue.others = others
        assert queue.submit("load_pair", target=str(target), draft=str(draft)).wait(T)["event"] == "loaded"
        yield queue
        client.shutdown(10)


def test_jobs_run_in_order_and_each_caller_gets_its_own_events(jobs):
    seen: dict[str, list[dict]] = {"a": [], "b": [], "c": []}
    lock = threading.Lock()

    def collect(name):
        def on_event(ev):
            with lock:
                seen[name].append(ev)
        return on_event

    submitted = [jobs.submit("generate", owner=name, on_event=collect(name), prompt=name,
                             settings={"max_new_tokens": 40 + i}) for i, name in enumerate("abc")]
    finals = [job.wait(T) for job in submitted]
    assert [f["event"] for f in finals] == ["done"] * 3     # never `busy`
    assert [f["stats"]["generated_tokens"] for f in finals] == [40, 41, 42]
    for name, job in zip("abc", submitted):
        assert {ev["id"] for ev in seen[name]} == {job.id} and seen[name][-1] is job.final
        assert "".join(t for ev in seen[name] if ev["event"] == "tokens" for t, _ in ev["spans"]) == job.final["text"]
    order = [j.id for j in jobs.finished if j in submitted]
    assert order == [j.id for j in submitted]
    assert not [ev for ev in jobs.others if ev.get("id") in order]


def test_cancel_ends_a_waiting_job_at_once_and_a_running_one_on_the_worker(jobs):
    running = jobs.submit("generate", prompt="long", settings={"max_new_tokens": 1500, "block_size": 1})
    waiting = jobs.submit("generate", prompt="never", settings={"max_new_tokens": 5})
    load = jobs.submit("load_pair", target="/nowhere")
    assert waiting.state == load.state == "queued" and jobs.busy
    assert jobs.cancel(waiting.id) and jobs.cancel(load.id)
    assert waiting.final == {"event": "done", "id": waiting.id, "stop_reason": "cancelled", "text": "",
                             "token_ids": [], "stats": None}
    assert load.final["event"] == "error" and load.final["code"] == "cancelled"
    assert jobs.cancel(running.id)
    done = running.wait(T)
    assert done["stop_reason"] == "cancelled" and done["stats"]["generated_tokens"] < 1500
    assert not jobs.busy and jobs.pair_info is not None    # the cancelled load never ran
    assert not jobs.cancel(running.id) and not jobs.cancel("no-such-job")
