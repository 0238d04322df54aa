"""Build the frozen app: `python installers/build.py` makes dist/dflash-desktop/ (and, on macOS,
dist/DFlash Desktop.app) from installers/dflash-desktop.spec.

Why a script around PyInstaller: the spec needs the version (from pyproject.toml) and icons in each
platform's format, rendered here from the one SVG in assets/icons so no binary icon is kept in git; and
every build should end with the same size report, which the installer tests and CI logs compare. It also
ships llama.cpp's llama-server and GGUF converter (portable builds for --llamacpp-backend, made into the
user's cache first when not there), which the frozen app finds in _internal/llama.cpp (a GPU build's server in
_internal/llama.cpp-<backend>).
Outputs go to build/ and dist/ (git-ignored). Run it from the environment the app runs in (torch CPU
build, PySide6, the project's dependencies, pyinstaller from installers/requirements.txt).
"""
from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
BUILD = ROOT / "build"
ICONS = BUILD / "icons"
ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)
APP_DIR = DIST / "dflash-desktop"


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def executable(app_dir: Path = APP_DIR) -> Path:
    return app_dir / ("dflash-desktop.exe" if sys.platform == "win32" else "dflash-desktop")


def render_icons(out: Path = ICONS) -> None:
    """PNG at every size (Linux menus, the .deb), .ico (Windows) and .icns (macOS, through iconutil)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    import assets
    from PySide6.QtWidgets import QApplication
    # a QApplication, not a QGuiApplication: a process that renders icons and then opens a widget (the
    # test suite does) would otherwise abort, since Qt keeps the first application object for good
    app = QGuiApplication.instance() or QApplication([])  # noqa: F841 (Qt needs it alive)
    renderer = QSvgRenderer(str(assets.path("icons", "dflash.svg")))
    if not renderer.isValid():
        sys.exit("assets/icons/dflash.svg is not a valid SVG")
    out.mkdir(parents=True, exist_ok=True)
    for size in ICON_SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        if not image.save(str(out / f"dflash-desktop-{size}.png")):
            sys.exit(f"could not write the {size}px icon")
    write_ico(out / "dflash-desktop.ico", [out / f"dflash-desktop-{size}.png" for size in (16, 32, 48, 64, 128, 256)])
    if sys.platform == "darwin":
        iconset = out / "dflash-desktop.iconset"
        iconset.mkdir(exist_ok=True)
        for size in (16, 32, 128, 256, 512):
            shutil.copy(out / f"dflash-desktop-{size}.png", iconset / f"icon_{size}x{size}.png")
            if size * 2 in ICON_SIZES:
                shutil.copy(out / f"dflash-desktop-{size * 2}.png", iconset / f"icon_{size}x{size}@2x.png")
        subprocess.run(["iconutil", "-c", "icns", str(iconset), "-o", str(out / "dflash-desktop.icns")], check=True)


def write_ico(path: Path, pngs: list[Path]) -> None:
    """A Windows icon holding every size as PNG (Windows Vista and later), so Explorer, the taskbar and the
    Start menu each pick a sharp one; Qt's ICO writer stores a single size."""
    blobs = [p.read_bytes() for p in pngs]
    sizes = [int.from_bytes(b[16:20], "big") for b in blobs]  # the PNG header's width
    header = struct.pack("<HHH", 0, 1, len(blobs))
    offset = len(header) + 16 * len(blobs)
    entries = b""
    for blob, size in zip(blobs, sizes):
        entries += struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1, 32, len(blob), offset)
        offset += len(blob)
    path.write_bytes(header + entries + b"".join(blobs))


def windows_version_file(path: Path, ver: str) -> None:
    """The version resource Windows shows in the file's properties (and Authenticode signs along)."""
    nums = tuple(int(x) for x in (ver.split(".") + ["0"] * 4)[:4])
    path.write_text(f"""VSVersionInfo(
  ffi=FixedFileInfo(filevers={nums}, prodvers={nums}, mask=0x3f, flags=0x0, OS=0x40004, fileType=0x1,
                    subtype=0x0, date=(0, 0)),
  kids=[StringFileInfo([StringTable('040904B0', [
      StringStruct('CompanyName', 'DFlash Desktop'), StringStruct('FileDescription', 'DFlash Desktop'),
      StringStruct('FileVersion', '{ver}'), StringStruct('InternalName', 'dflash-desktop'),
      StringStruct('OriginalFilename', 'dflash-desktop.exe'), StringStruct('ProductName', 'DFlash Desktop'),
      StringStruct('ProductVersion', '{ver}')])]),
        VarFileInfo([VarStruct('Translation', [1033, 1200])])])
""", encoding="utf-8")


def default_llamacpp_backend(platform: str = sys.platform, machine: str | None = None) -> str:
    """Metal on Apple Silicon, the CPU build on an Intel Mac; on Linux and Windows the CPU build with the
    Vulkan build beside it, which drives any vendor's GPU through its driver (the CPU build runs where there
    is no Vulkan loader). A CUDA llama-server needs NVIDIA's runtime on the user's computer, so it ships only
    when asked for."""
    import platform as _platform
    machine = machine or _platform.machine()
    if platform == "darwin":
        return "metal" if machine == "arm64" else "cpu"
    return "cpu,vulkan"


def llamacpp_builds(backends: str) -> list[Path]:
    """The portable llama.cpp builds to ship (comma-separated backends), the CPU build first: taken from the
    user's cache, built there first when missing (engine/backends/llamacpp/build.py: the pinned sdist,
    cmake; a few minutes each)."""
    from engine.backends.llamacpp import build as llamacpp
    names = sorted(dict.fromkeys(b.strip() for b in backends.split(",") if b.strip()), key=lambda b: b != "cpu")
    unknown = [b for b in names if b not in llamacpp.BACKENDS]
    if unknown or not names:
        sys.exit(f"--llamacpp-backend: unknown {', '.join(unknown) or 'empty list'}; choose from "
                 f"{', '.join(llamacpp.BACKENDS)} (comma-separated)")
    folders = [llamacpp.build(b, portable=True, log=lambda m: print(f"llama.cpp: {m}", flush=True)) for b in names]
    print(f"shipping the llama.cpp builds in {', '.join(map(str, folders))}")
    return folders


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="drop PyInstaller's cache of the last build first")
    parser.add_argument("--llamacpp-backend", default=default_llamacpp_backend(),
                        help="the llama.cpp builds to ship, comma-separated from cpu, cuda, vulkan, metal (default "
                             "here: %(default)s), built portable into the user's cache first when not there")
    parser.add_argument("--without-llamacpp", action="store_true",
                        help="ship no llama.cpp engine (the app then runs every pair with torch)")
    args = parser.parse_args(argv)
    ver = version()
    started = time.monotonic()
    render_icons()
    if sys.platform == "win32":
        windows_version_file(BUILD / "windows-version.txt", ver)
    command = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
               "--distpath", str(DIST), "--workpath", str(BUILD / "pyinstaller"),
               str(ROOT / "installers" / "dflash-desktop.spec")]
    if args.clean:
        command.insert(3, "--clean")
    llamacpp = "" if args.without_llamacpp else os.pathsep.join(map(str, llamacpp_builds(args.llamacpp_backend)))
    subprocess.run(command, check=True, cwd=ROOT,
                   env={**os.environ, "DFLASH_APP_VERSION": ver, "DFLASH_LLAMACPP_BUNDLE": llamacpp})
    exe = executable()
    if not exe.is_file():
        sys.exit(f"PyInstaller finished but {exe} is missing")
    print(f"built {exe} (version {ver}) in {time.monotonic() - started:.0f} s; "
          f"{folder_size(APP_DIR) / 2**20:.0f} MiB in {APP_DIR}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
