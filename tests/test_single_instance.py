"""One instance per data folder: real lock attempts from a second process, a lock left by a killed
process, and the "activate" message from a second app launch over a real QLocalServer, including two
launches of the real app at the same moment and a first instance that is still starting."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QLockFile, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from dflash_desktop.single_instance import LOCK_NAME, SingleInstance

ROOT = Path(__file__).resolve().parent.parent
CLAIM = """
import sys, time
from pathlib import Path
from PySide6.QtCore import QCoreApplication
from dflash_desktop.single_instance import SingleInstance
app = QCoreApplication([])
instance = SingleInstance(Path(sys.argv[1]))
print(instance.claim(), flush=True)
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))  # keep holding it
"""


# the real app entry, started at a signal: the slow imports first, then `python -m dflash_desktop` within a
# millisecond of the other launch (a double click), which is when the second used to find no one answering
LAUNCH_AT_GO = """
import os, runpy, sys, time
from pathlib import Path
import PySide6.QtWidgets, ui.app, ui.main_window, dflash_desktop.single_instance
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.001)
sys.argv = ["dflash_desktop"]
runpy.run_module("dflash_desktop", run_name="__main__", alter_sys=True)
"""
# a first instance that is slow to start: it holds the lock, listens only on "go" plus a second (as if the
# lock and the socket were far apart), then builds its window for 3 s before its event loop answers
SLOW_FIRST = """
import sys, time
from pathlib import Path
from PySide6.QtCore import QCoreApplication, QTimer
from dflash_desktop.single_instance import SingleInstance
app = QCoreApplication([])
instance = SingleInstance(Path(sys.argv[1]))
assert instance._lock.tryLock(0)
print("locked", flush=True)
sys.stdin.readline()
time.sleep(1)
instance._listen()
time.sleep(3)
instance.activated.connect(lambda: (print("activated", flush=True), QTimer.singleShot(500, app.quit)))
QTimer.singleShot(30_000, app.quit)
app.exec()
"""
SECOND = """
import sys
from pathlib import Path
from PySide6.QtCore import QCoreApplication
from dflash_desktop.single_instance import SingleInstance
app = QCoreApplication([])
instance = SingleInstance(Path(sys.argv[1]))
print("claimed", instance.claim(), flush=True)
started = __import__("time").monotonic()
print("answered", instance.activate_first(), round(__import__("time").monotonic() - started, 1), flush=True)
"""


def python(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen")
    env.update(kw.pop("env", {}))
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def finish(process: subprocess.Popen, timeout: float) -> tuple[int | str, str, str]:
    """Exit code, stdout and stderr; "hung" (and killed) when it did not exit in time, as a second launch
    does while it shows its "did not answer" dialog (nobody closes it offscreen)."""
    try:
        out, err = process.communicate(timeout=max(timeout, 1))
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return "hung", out, err


def claim_elsewhere(folder: Path) -> bool:
    out, err = python("-c", CLAIM, str(folder)).communicate(timeout=60)
    assert out.strip() in ("True", "False"), err
    return out.strip() == "True"


@pytest.fixture
def instances(qapp):
    made = []

    def make(folder: Path) -> SingleInstance:
        made.append(SingleInstance(folder))
        return made[-1]

    yield make
    for instance in made:
        instance.release()


def test_a_second_process_cannot_claim_the_folder_until_the_first_lets_go(tmp_path, instances):
    first = instances(tmp_path)
    assert first.claim()
    assert (tmp_path / LOCK_NAME).exists()
    assert not claim_elsewhere(tmp_path)
    first.release()
    assert claim_elsewhere(tmp_path)


def test_a_lock_left_by_a_killed_instance_does_not_block_the_next_start(tmp_path, instances):
    holder = python("-c", CLAIM, str(tmp_path), "60")
    try:
        assert holder.stdout.readline().strip() == "True"
        assert not instances(tmp_path).claim()
    finally:
        holder.kill()
        holder.wait(30)
    assert (tmp_path / LOCK_NAME).exists()  # the crash left it behind...
    assert instances(tmp_path).claim()      # ...and it is recognised as stale (its process is gone)


def test_a_second_launch_brings_the_first_window_to_the_front_and_exits_0(tmp_path, qtbot, instances):
    """The second process is the real app entry (python -m dflash_desktop) with the same data folder."""
    data = tmp_path / "data"
    data.mkdir()
    first = instances(data)
    assert first.claim()
    try:
        with qtbot.waitSignal(first.activated, timeout=60_000):
            second = python("-m", "dflash_desktop", env={"DFLASH_DESKTOP_HOME": str(tmp_path)})
        out, err = second.communicate(timeout=60)
    finally:
        second.kill()  # a second launch that opened its own window would otherwise stay
    assert second.returncode == 0, err


def test_a_second_launch_says_the_app_is_running_when_the_first_does_not_answer(tmp_path, qtbot, instances):
    """The folder is locked but nobody listens (a first instance that hangs, or an older version)."""
    from ui.app import hand_over

    silent = QLockFile(str(tmp_path / LOCK_NAME))
    assert silent.tryLock(0)
    second = instances(tmp_path)
    assert not second.claim()
    shown = []

    def close_the_box():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            return QTimer.singleShot(20, close_the_box)
        shown.append(box.text())
        box.accept()

    QTimer.singleShot(0, close_the_box)
    assert hand_over(second) == 1
    silent.unlock()
    assert len(shown) == 1 and "already running" in shown[0]


def test_two_launches_at_the_same_moment_open_one_window_and_the_other_hands_over(tmp_path):
    """It used to show "did not answer" in about half the runs: the second found the lock taken before the
    first listened, or gave up after 2 s while the first was still building its window."""
    rounds, results = 4, []
    for n in range(rounds):
        home = tmp_path / f"home{n}"
        go = tmp_path / f"go{n}"
        ready = [tmp_path / f"ready{n}-{i}" for i in range(2)]
        env = {"DFLASH_DESKTOP_HOME": str(home), "DFLASH_DESKTOP_TIMING": "1", "DFLASH_DESKTOP_EXIT_AFTER_MS": "1500"}
        launches = [python("-c", LAUNCH_AT_GO, str(r), str(go), env=env) for r in ready]
        try:
            deadline = time.monotonic() + 60
            while not all(r.exists() for r in ready) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert all(r.exists() for r in ready), [launch.poll() for launch in launches]
            go.touch()
            deadline = time.monotonic() + 40
            ends = [finish(launch, deadline - time.monotonic()) for launch in launches]
        finally:
            for launch in launches:
                launch.kill()
        windows = sum("window-shown-at" in out for _, out, _ in ends)
        results.append(([code for code, _, _ in ends], windows))
        assert all(code == 0 for code, _, _ in ends) and windows == 1, (results, [err[-2000:] for *_, err in ends])


def test_a_second_launch_waits_for_a_first_that_is_still_starting(tmp_path):
    """The first holds the lock but listens only a second later, and answers 3 s after that: the second
    used to give up at once (nothing listening) and show "did not answer"."""
    first = python("-c", SLOW_FIRST, str(tmp_path), stdin=subprocess.PIPE)
    second = None
    try:
        assert first.stdout.readline().strip() == "locked"
        second = python("-c", SECOND, str(tmp_path))
        assert second.stdout.readline().split() == ["claimed", "False"]
        first.stdin.write("go\n")
        first.stdin.flush()
        code, out, err = finish(second, 60)
        assert code == 0 and out.split()[:2] == ["answered", "True"], (code, out, err)
        assert finish(first, 30)[1].split() == ["activated"]
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()


def test_a_second_launch_stops_waiting_once_the_first_is_gone(tmp_path, instances):
    """Its lock was left by a killed process: nobody will answer, so the dialog comes at once."""
    holder = python("-c", CLAIM, str(tmp_path), "60")
    try:
        assert holder.stdout.readline().strip() == "True"
        second = instances(tmp_path)
        assert not second.claim()
    finally:
        holder.kill()
        holder.wait(30)
    started = time.monotonic()
    assert not second.activate_first()
    assert time.monotonic() - started < 1
