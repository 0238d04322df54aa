"""Wrap the frozen Windows app (dist/dflash-desktop/, from installers/build.py) in the NSIS installer
dist/DFlash-Desktop-<version>-Setup.exe, from installers/windows/dflash-desktop.nsi.

makensis runs on Linux too, so tests/test_installers_nsis.py builds the same script around a small
stand-in payload (--payload, --out) and, where wine is installed, installs and uninstalls it silently.
--sign-command "signtool sign ... %1" signs the uninstaller as makensis writes it (the workflow signs the
app before and the installer after).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
from installers import build  # noqa: E402  (installers/build.py: paths and the version)

SCRIPT = HERE / "dflash-desktop.nsi"


def makensis() -> str:
    found = shutil.which("makensis")
    if not found:
        sys.exit("makensis not found: install NSIS 3 (apt-get install nsis, choco install nsis)")
    return found


def make_installer(payload: Path, out: Path, version: str, icon: Path, sign_command: str | None = None) -> Path:
    if not (payload / "dflash-desktop.exe").is_file():
        sys.exit(f"{payload} has no dflash-desktop.exe: build the app first (python installers/build.py)")
    out.parent.mkdir(parents=True, exist_ok=True)
    defines = {"VERSION": version, "PAYLOAD": str(payload.resolve()), "OUTFILE": str(out.resolve()),
               "ICON": str(icon.resolve())}
    if sign_command:
        defines["SIGN_COMMAND"] = sign_command
    command = [makensis(), "-V2", "-WX", *(f"-D{k}={v}" for k, v in defines.items()), str(SCRIPT)]
    subprocess.run(command, check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    version = build.version()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", type=Path, default=build.APP_DIR)
    parser.add_argument("--out", type=Path, default=build.DIST / f"DFlash-Desktop-{version}-Setup.exe")
    parser.add_argument("--version", default=version)
    parser.add_argument("--icon", type=Path, default=build.ICONS / "dflash-desktop.ico")
    parser.add_argument("--sign-command")
    args = parser.parse_args(argv)
    out = make_installer(args.payload, args.out, args.version, args.icon, args.sign_command)
    print(f"{out.name}: {out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
