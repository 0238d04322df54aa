"""Package the frozen Linux app (dist/dflash-desktop/, from installers/build.py) the two ways Linux users
install software: a .deb (double-click it, or `sudo apt install ./file.deb`; removed with the package
manager) and a .tar.gz (unpack anywhere, no root; a script adds it to the desktop menu).

    python installers/linux/make_packages.py      -> dist/dflash-desktop_<version>_amd64.deb
                                                      dist/dflash-desktop-<version>-linux-x86_64.tar.gz

The .deb puts the app in /opt/dflash-desktop, a command in /usr/bin, a menu entry and icons under
/usr/share. Its Depends are the system libraries PyInstaller deliberately does not bundle (OpenGL, EGL,
fontconfig, D-Bus, the X keyboard and cursor libraries Qt's xcb plugin loads), so the app starts on a
minimal desktop install. Both packages are built with dpkg-deb and Python's tarfile, nothing else.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
from installers import build  # noqa: E402  (installers/build.py: paths and the version)

PACKAGE = "dflash-desktop"
DEB_DEPENDS = ("libgl1, libegl1, libfontconfig1, libfreetype6, libdbus-1-3, libglib2.0-0, "
               "libxkbcommon0, libxkbcommon-x11-0, libxcb-cursor0, libxcb-icccm4, libxcb-image0, "
               "libxcb-keysyms1, libxcb-randr0, libxcb-render-util0, libxcb-shape0, libxcb-xinerama0, libxcb-xkb1, "
               "libx11-xcb1")
DESCRIPTION = """Fast local LLMs with DFlash speculative decoding
 DFlash Desktop runs a language model on your own computer together with a small
 block-diffusion drafter, so answers come faster with exactly the same text.
 It works offline from the first start: a small demo model pair is built in."""


def desktop_entry(exec_path: str, icon: str) -> str:
    return ("[Desktop Entry]\nType=Application\nName=DFlash Desktop\n"
            "Comment=Fast local LLMs with DFlash speculative decoding\n"
            f"Exec={exec_path}\nIcon={icon}\nTerminal=false\nCategories=Development;Utility;\n"
            "StartupWMClass=dflash-desktop\nKeywords=LLM;AI;chat;model;\n")


def build_glibc() -> str:
    """The bundle's programs need the C library they were linked against here, or a newer one."""
    return os.confstr("CS_GNU_LIBC_VERSION").split()[1]


def copy_app(dest: Path) -> None:
    if not build.executable().is_file():
        sys.exit(f"{build.executable()} is missing: run python installers/build.py first")
    shutil.copytree(build.APP_DIR, dest, symlinks=True)


def installed_size_kib(folder: Path) -> int:
    return sum(f.lstat().st_size for f in folder.rglob("*")) // 1024 + 1


def make_deb(version: str, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="dflash-deb-") as tmp:
        root = Path(tmp) / "root"
        copy_app(root / "opt" / PACKAGE)
        (root / "usr" / "bin").mkdir(parents=True)
        (root / "usr" / "bin" / PACKAGE).symlink_to(f"/opt/{PACKAGE}/{PACKAGE}")
        apps = root / "usr" / "share" / "applications"
        apps.mkdir(parents=True)
        (apps / f"{PACKAGE}.desktop").write_text(desktop_entry(f"/opt/{PACKAGE}/{PACKAGE}", PACKAGE))
        for size in build.ICON_SIZES:
            icon_dir = root / "usr" / "share" / "icons" / "hicolor" / f"{size}x{size}" / "apps"
            icon_dir.mkdir(parents=True)
            shutil.copy(build.ICONS / f"{PACKAGE}-{size}.png", icon_dir / f"{PACKAGE}.png")
        scalable = root / "usr" / "share" / "icons" / "hicolor" / "scalable" / "apps"
        scalable.mkdir(parents=True)
        shutil.copy(ROOT / "assets" / "icons" / "dflash.svg", scalable / f"{PACKAGE}.svg")
        control = root / "DEBIAN" / "control"
        control.parent.mkdir()
        control.write_text(
            f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: amd64\nSection: utils\nPriority: optional\n"
            f"Maintainer: DFlash Desktop <dflash-desktop@users.noreply.github.com>\n"
            f"Installed-Size: {installed_size_kib(root)}\nDepends: libc6 (>= {build_glibc()}), {DEB_DEPENDS}\n"
            f"Homepage: https://github.com/dflash-desktop/dflash-desktop\nDescription: {DESCRIPTION}\n")
        deb = out_dir / f"{PACKAGE}_{version}_amd64.deb"
        # menu and icon caches are refreshed by dpkg triggers (desktop-file-utils, hicolor-icon-theme)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)], check=True,
                       stdout=subprocess.DEVNULL)
    return deb


MENU_SCRIPT = """#!/bin/sh
# Adds DFlash Desktop (this unpacked copy) to your desktop menu; `--remove` takes it out again.
# Nothing outside your home folder is touched, no root needed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
apps="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
icons="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/256x256/apps"
if [ "${1:-}" = "--remove" ]; then
    rm -f "$apps/dflash-desktop.desktop" "$icons/dflash-desktop.png"
    echo "removed the menu entry"
    exit 0
fi
mkdir -p "$apps" "$icons"
cp "$here/dflash-desktop.png" "$icons/dflash-desktop.png"
sed "s|@EXEC@|$here/dflash-desktop|" "$here/dflash-desktop.desktop.in" > "$apps/dflash-desktop.desktop"
echo "added DFlash Desktop to the menu ($apps/dflash-desktop.desktop)"
"""


def make_tarball(version: str, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="dflash-tar-") as tmp:
        app = Path(tmp) / PACKAGE
        copy_app(app)
        shutil.copy(build.ICONS / f"{PACKAGE}-256.png", app / f"{PACKAGE}.png")
        (app / f"{PACKAGE}.desktop.in").write_text(desktop_entry('"@EXEC@"', PACKAGE))
        script = app / "add-to-menu.sh"
        script.write_text(MENU_SCRIPT)
        script.chmod(0o755)
        tarball = out_dir / f"{PACKAGE}-{version}-linux-x86_64.tar.gz"
        with tarfile.open(tarball, "w:gz", compresslevel=6) as tar:
            tar.add(app, arcname=PACKAGE, filter=_owned_by_root)
    return tarball


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def main() -> int:
    version = build.version()
    build.DIST.mkdir(exist_ok=True)
    for make in (make_tarball, make_deb):
        path = make(version, build.DIST)
        print(f"{path.name}: {path.stat().st_size / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
