"""The Windows installer script (installers/windows/dflash-desktop.nsi), built here with makensis around a
small stand-in payload; the real app is packed the same way on a Windows runner. Where wine is
installed, the installers run as a user runs them: silent install, an upgrade in place that keeps the
user's data, silent uninstall that leaves chats and models behind."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from installers import build
from installers.windows import make_installer

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not shutil.which("makensis"), reason="makensis not installed (apt-get install nsis)")
UNINST_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Uninstall\DFlashDesktop"


def payload(folder: Path, version: str, extra: str | None = None) -> Path:
    """A stand-in for dist/dflash-desktop: the files the installer handles, not a working app."""
    (folder / "_internal").mkdir(parents=True)
    (folder / "dflash-desktop.exe").write_text(f"stand-in {version}")
    (folder / "_internal" / "common.txt").write_text(version)
    if extra:
        (folder / "_internal" / extra).write_text(version)
    return folder


@pytest.fixture(scope="module")
def installers(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("nsis")
    build.render_icons(tmp / "icons")
    icon = tmp / "icons" / "dflash-desktop.ico"
    out = {}
    for version, extra in (("0.1.0", "only-in-old.txt"), ("0.2.0", None)):
        out[version] = make_installer.make_installer(payload(tmp / f"payload-{version}", version, extra),
                                                     tmp / f"DFlash-Desktop-{version}-Setup.exe", version, icon)
    return out


def test_script_compiles_around_a_payload(installers):
    for setup in installers.values():
        data = setup.read_bytes()
        assert data[:2] == b"MZ" and len(data) > 50_000, f"{setup} is not a Windows program"
        assert b"stand-in" not in data  # the payload is compressed inside, not stored raw


def test_script_refuses_to_build_without_its_defines(tmp_path):
    """The script checks what make_installer.py must pass: a plain makensis run fails with the reason."""
    run = subprocess.run(["makensis", "-V2", str(make_installer.SCRIPT)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode != 0 and "VERSION is missing" in run.stdout + run.stderr


class Wine:
    """A throwaway Windows user: its own wine prefix and home folder (wine links Desktop to $HOME)."""

    def __init__(self, tmp: Path):
        self.home = tmp / "home"
        self.home.mkdir()
        self.env = {**os.environ, "WINEPREFIX": str(tmp / "prefix"), "HOME": str(self.home), "WINEDEBUG": "-all",
                    "WINEDLLOVERRIDES": "mscoree,mshtml=", "DISPLAY": ""}
        self.user = tmp / "prefix" / "drive_c" / "users" / os.environ.get("USER", "root")
        self.run("wineboot", "-i")

    def run(self, *command: str) -> subprocess.CompletedProcess:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=300)
        subprocess.run(["wineserver", "-w"], env=self.env, timeout=300)  # an uninstaller re-launches itself
        return result

    def reg(self) -> str:
        return self.run("wine", "reg", "query", UNINST_KEY).stdout

    @property
    def local(self) -> Path:
        return self.user / "AppData" / "Local"


@pytest.mark.skipif(not shutil.which("wine"), reason="wine not installed: only the compile check runs")
def test_silent_install_upgrade_and_uninstall_under_wine(installers, tmp_path):
    wine = Wine(tmp_path)
    app = wine.local / "Programs" / "DFlash Desktop"
    data = wine.local / "DFlashDesktop"
    start_menu = wine.user / "AppData" / "Roaming" / "Microsoft" / "Windows" / "Start Menu" / "Programs"
    shortcuts = [start_menu / "DFlash Desktop.lnk", wine.home / "DFlash Desktop.lnk"]  # Desktop -> $HOME

    assert wine.run("wine", str(installers["0.1.0"]), "/S").returncode == 0
    assert (app / "dflash-desktop.exe").read_text() == "stand-in 0.1.0"
    assert (app / "_internal" / "only-in-old.txt").is_file() and (app / "uninstall.exe").is_file()
    assert all(s.is_file() for s in shortcuts), "Start-menu and desktop shortcuts"
    assert "DisplayVersion    REG_SZ    0.1.0" in wine.reg() and "uninstall.exe\" /S" in wine.reg()

    # the user's data where paths.data_dir() keeps it on Windows: chats, and a downloaded engine pack
    (data / "engine-packs" / "cuda").mkdir(parents=True)
    (data / "chats.sqlite3").write_text("my chats")

    assert wine.run("wine", str(installers["0.2.0"]), "/S").returncode == 0   # upgrade in place
    assert (app / "dflash-desktop.exe").read_text() == "stand-in 0.2.0"
    assert not (app / "_internal" / "only-in-old.txt").exists(), "a file of the old version lingers"
    assert (data / "chats.sqlite3").read_text() == "my chats"
    assert (data / "engine-packs" / "cuda").is_dir(), "an upgrade keeps engine packs"
    assert "DisplayVersion    REG_SZ    0.2.0" in wine.reg()

    assert wine.run("wine", str(app / "uninstall.exe"), "/S").returncode == 0
    assert not app.exists(), f"left behind: {list(app.rglob('*')) if app.exists() else ''}"
    assert not any(s.exists() for s in shortcuts)
    assert "DFlashDesktop" not in wine.reg()
    assert (data / "chats.sqlite3").read_text() == "my chats", "uninstall keeps the user's chats"
    assert not (data / "engine-packs").exists(), "uninstall removes engine packs (program code)"
