"""One instance per data folder: real lock attempts from a second process, a lock left by a killed
process, and the "activate" message from a second app launch over a real QLocalServer."""
from __future__ import annotations

import os
import subprocess
import sys
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


def python(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen")
    env.update(kw.pop("env", {}))
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


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
