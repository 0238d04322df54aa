"""A windowed app can start without standard streams (a Windows console=False build, an app started from
a desktop menu): dflash_desktop/stdio.py must give it working ones, or the first print, traceback or
log line fails. Here the streams are really missing: the child starts with file descriptors 0-2 closed."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_without_streams(args: list[str], home: Path) -> int:
    def close_std_fds():
        for fd in (0, 1, 2):
            os.close(fd)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DFLASH_DESKTOP_HOME": str(home)}
    return subprocess.run([sys.executable, *args], env=env, preexec_fn=close_std_fds, timeout=120).returncode


def test_output_of_a_streamless_start_goes_to_the_log(tmp_path):
    code = ("import sys; assert sys.stdout is None and sys.stderr is None and sys.stdin is None\n"
            "from dflash_desktop.__main__ import main; sys.exit(main(['--version']))")
    assert run_without_streams(["-c", code], tmp_path) == 0
    log = tmp_path / "logs" / "app-output.log"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert log.read_text().strip() == f"dflash-desktop {version}"


def test_without_the_substitute_the_same_start_fails(tmp_path):
    """The check above can fail: writing to a missing stream is an error."""
    code = "import sys; sys.stderr.write('x')"
    assert run_without_streams(["-c", code], tmp_path) != 0
