"""Engine packs: engine libraries installed after the app, such as torch's CUDA build for an NVIDIA GPU
on Windows (gigabytes, too big to put in every installer). The installers carry the CPU engine; a pack
adds a faster one without reinstalling the app.

A pack is a folder under the packs root (``DFLASH_DESKTOP_ENGINE_PACKS``; a frozen app sets it to
``<user data>/engine-packs``, docs/INSTALL.md):

    <root>/<name>/pack.json        written last, once every file is in place and checked
    <root>/<name>/site-packages/   unpacked wheels: torch/, ...

    pack.json: {"format": 1, "name": "cuda", "title": "CUDA engine", "provides": ["torch"],
                "python": "3.11", "platform": "win32-amd64", "api": 1}

The engine process chooses at start, before any engine library is imported: each valid pack's
site-packages goes to the front of ``sys.path``, so its modules are imported instead of the bundled ones.
A pack that is incomplete, made for another Python, platform or app version, or that provides a module
an earlier pack (by name) already provides, is left out with a sentence that says why; the bundled
engine then runs as before. Nothing in a pack runs until the engine imports it.

Whatever is first on ``sys.path`` is imported instead of the real thing, so a pack is also left out
when it could hand the engine anything other than what it declares: every top-level module and package
in its site-packages must be listed in "provides", and none may be part of Python or of the app; no
link may lead out of its folder; and, on POSIX, neither it, the packs root nor any file in them may be
world-writable (another user could put code there). pack.json is read with bounds (size, nesting), and
no pack, however broken, stops the engine: each problem becomes a note that names the pack.
"""
from __future__ import annotations

import importlib.machinery
import json
import os
import platform
import reprlib
import shlex
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
API = 1  # raised when the engine needs libraries that older packs do not carry
MANIFEST = "pack.json"
ROOT_ENV = "DFLASH_DESKTOP_ENGINE_PACKS"
MAX_MANIFEST_BYTES = 64 * 1024  # a real pack.json is a few hundred bytes
MAX_ENTRIES = 200_000           # files and folders walked in one pack (a CUDA torch has about 20,000)
APP_PACKAGES = frozenset({"engine", "dflash_desktop", "ui", "assets"})  # installers/bundle.py SOURCE_PACKAGES
# Python itself: never replaceable by a pack, even when declared
PYTHON_MODULES = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)
CHECK_MODES = os.name == "posix"  # Windows has no world-writable bit; its ACLs are not checked here


class PackError(ValueError):
    """Why a pack cannot be used, in words for the user."""


@dataclass
class Choice:
    active: list[dict] = field(default_factory=list)   # manifests of the packs in use, with their "path"
    notes: list[str] = field(default_factory=list)     # one sentence per pack left out

    def describe(self) -> dict:
        """For hello and hardware events: which packs are in use, why others are not, and where each
        module a pack provides was actually imported from (once the engine has imported it)."""
        modules = {}
        for pack in self.active:
            for name in pack["provides"]:
                module = sys.modules.get(name)
                modules[name] = getattr(module, "__file__", None) if module else None
        return {"active": [p["name"] for p in self.active], "notes": list(self.notes), "modules": modules}


_current = Choice()


def this_platform() -> str:
    return f"{sys.platform}-{platform.machine().lower()}"


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def root_from_env() -> Path | None:
    value = os.environ.get(ROOT_ENV)
    return Path(value) if value else None


def check(folder: Path, root: Path | None = None) -> dict:
    """The pack's manifest (with "path": its site-packages) if this process can use it; PackError otherwise.
    root is the packs root (folder's parent unless given): the folder may be a link only to a place inside it."""
    root = Path(os.path.realpath(folder.parent if root is None else root))
    real = Path(os.path.realpath(folder))
    if real == root or not real.is_relative_to(root):
        raise PackError(f"its folder is a link to {real}, outside {root}; move the pack's files into {folder} "
                        "instead of linking to them")
    manifest_path = real / MANIFEST
    if not manifest_path.is_file():
        raise PackError(f"it has no {MANIFEST}, so it was not installed completely (an interrupted download?)")
    _check_files(real)
    manifest = _read_manifest(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackError(f"its {MANIFEST} is not format {FORMAT}")
    expected = {"name": folder.name, "python": this_python(), "platform": this_platform(), "api": API}
    for key, want in expected.items():
        if manifest.get(key) != want:
            raise PackError(f"it was made for {key} {_short.repr(manifest.get(key))}, and this app needs {want!r}")
    provides = manifest.get("provides")
    if not (isinstance(provides, list) and provides and all(isinstance(p, str) and p.isidentifier() for p in provides)):
        raise PackError(f"its {MANIFEST} does not list the modules it provides")
    python_own = sorted(set(provides) & (PYTHON_MODULES | APP_PACKAGES))
    if python_own:
        raise PackError(f"it would replace {_names(python_own)}, part of Python or of the app itself, which no "
                        "pack may provide")
    site = real / "site-packages"
    shipped = _top_level_modules(site)
    missing = [p for p in provides if p not in shipped]
    if missing:
        raise PackError(f"it lacks {_names(missing)} in {site}")
    undeclared = sorted(set(shipped) - set(provides))
    if undeclared:
        names = _names([f"{shipped[m]} (part of Python)" if m in PYTHON_MODULES else shipped[m] for m in undeclared])
        raise PackError(f"its site-packages also holds {names}, which its {MANIFEST} does not declare; a pack may "
                        "only add the modules it lists in \"provides\", never replace others the engine imports")
    return {**manifest, "path": str(site)}


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60  # a hostile pack.json's values go into notes and logs: keep them short


def _names(names: list[str], most: int = 8) -> str:
    shown = ", ".join(_short.repr(n)[1:-1] for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _read_manifest(path: Path) -> object:
    """pack.json parsed with bounds: a regular file (a FIFO or device could block or never end), at most
    MAX_MANIFEST_BYTES, nested no deeper than the parser's recursion limit."""
    try:
        # O_NONBLOCK: a FIFO put in its place does not wait for a writer (nothing changes for a regular file)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise PackError(f"its {MANIFEST} is not a regular file")
            data = file.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise PackError(f"its {MANIFEST} is unreadable ({exc})") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise PackError(f"its {MANIFEST} is larger than {MAX_MANIFEST_BYTES:,} bytes, far more than a pack needs")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise PackError(f"its {MANIFEST} is unreadable (its JSON is nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PackError(f"its {MANIFEST} is unreadable ({exc})") from None


def _world_writable(path: str | Path, st: os.stat_result | None = None) -> bool:
    st = os.stat(path, follow_symlinks=False) if st is None else st
    return CHECK_MODES and bool(st.st_mode & stat.S_IWOTH)


def _check_files(real: Path) -> None:
    """Every file and folder of the pack stays inside it and, on POSIX, only its owner can change it.
    Walked with a stack (no recursion: the folder may be nested arbitrarily deep) and at most MAX_ENTRIES."""
    if _world_writable(real):
        raise PackError(f"every user of this computer can change its folder (it is world-writable), so the engine "
                        f"could run code they put there; run  chmod -R o-w {shlex.quote(str(real))}  to fix it")
    stack, seen = [real], 0
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > MAX_ENTRIES:
                    raise PackError(f"it holds more than {MAX_ENTRIES:,} files and folders, far more than an "
                                    "engine needs")
                if entry.is_symlink() or getattr(entry, "is_junction", lambda: False)():
                    target = Path(os.path.realpath(entry.path))
                    if not target.is_relative_to(real):
                        raise PackError(f"{entry.path} is a link to {target}, outside the pack; the engine would "
                                        "import whatever is there, so put the file itself in the pack")
                    continue  # its target is inside the pack, and checked there
                if _world_writable(entry.path, entry.stat(follow_symlinks=False)):
                    raise PackError(f"every user of this computer can change {entry.path} (it is world-writable), so "
                                    "the engine could run code they put there; run  "
                                    f"chmod -R o-w {shlex.quote(str(real))}  to fix it")
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


def _top_level_modules(site: Path) -> dict[str, str]:
    """What `import NAME` could find in site: NAME -> the file or folder. Any folder with a module's name counts
    (a folder without __init__.py is a namespace package); a file counts by the suffixes import looks for."""
    suffixes = sorted(importlib.machinery.all_suffixes(), key=len, reverse=True)
    found = {}
    try:
        entries = list(os.scandir(site))
    except OSError:
        return found
    for entry in entries:
        if entry.is_dir():
            if entry.name.isidentifier() and entry.name != "__pycache__":  # __pycache__ alone imports nothing
                found[entry.name] = entry.name + "/"
            continue
        suffix = next((s for s in suffixes if entry.name.endswith(s)), None)
        if suffix and entry.name[:-len(suffix)].isidentifier():
            found.setdefault(entry.name[:-len(suffix)], entry.name)
    return found


def choose(root: Path | None) -> Choice:
    """Every usable pack under root, by name; the first pack to provide a module wins it. Never raises:
    whatever is wrong with the root or a pack becomes a note, and the engine starts with what is left."""
    choice = Choice()
    try:
        if root is None or not root.is_dir():
            return choice
        if _world_writable(os.path.realpath(root)):
            choice.notes.append(f"No engine pack in {root} is used: every user of this computer can change that "
                                "folder (it is world-writable), so the engine could run code they put there. Run  "
                                f"chmod o-w {shlex.quote(str(root))}  to fix it. The app's built-in engine runs "
                                "instead.")
            return choice
        folders = sorted(p for p in root.iterdir() if p.is_dir())
    except (OSError, ValueError) as exc:
        choice.notes.append(f"No engine pack in {root} is used: the folder cannot be read ({exc}). "
                            "The app's built-in engine runs instead.")
        return choice
    taken: dict[str, str] = {}
    for folder in folders:
        try:
            pack = check(folder, root)
        except PackError as exc:
            choice.notes.append(f"The engine pack in {folder} is not used: {exc}. "
                                "The app's built-in engine runs instead; delete the folder or install the pack again.")
            continue
        except Exception as exc:  # noqa: BLE001 (an OSError mid-walk, anything: one pack never stops the engine)
            choice.notes.append(f"The engine pack in {folder} is not used: checking it failed "
                                f"({type(exc).__name__}: {exc}). The app's built-in engine runs instead; delete the "
                                "folder or install the pack again.")
            continue
        clash = [m for m in pack["provides"] if m in taken]
        if clash:
            choice.notes.append(f"The engine pack in {folder} is not used: the {taken[clash[0]]} pack already "
                                f"provides {', '.join(clash)}.")
            continue
        taken.update({m: pack["name"] for m in pack["provides"]})
        choice.active.append(pack)
    return choice


def activate(root: Path | None) -> Choice:
    """Choose the packs and put them first on sys.path; call before any engine library is imported."""
    global _current
    _current = choose(root)
    sys.path[:0] = [pack["path"] for pack in _current.active]
    return _current


def current() -> Choice:
    """What activate() chose in this process (nothing, until it runs)."""
    return _current
