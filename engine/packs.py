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
"""
from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
API = 1  # raised when the engine needs libraries that older packs do not carry
MANIFEST = "pack.json"
ROOT_ENV = "DFLASH_DESKTOP_ENGINE_PACKS"


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


def check(folder: Path) -> dict:
    """The pack's manifest (with "path": its site-packages) if this process can use it; PackError otherwise."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise PackError(f"it has no {MANIFEST}, so it was not installed completely (an interrupted download?)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackError(f"its {MANIFEST} is unreadable ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackError(f"its {MANIFEST} is not format {FORMAT}")
    expected = {"name": folder.name, "python": this_python(), "platform": this_platform(), "api": API}
    for key, want in expected.items():
        if manifest.get(key) != want:
            raise PackError(f"it was made for {key} {manifest.get(key)!r}, and this app needs {want!r}")
    provides = manifest.get("provides")
    if not (isinstance(provides, list) and provides and all(isinstance(p, str) and p.isidentifier() for p in provides)):
        raise PackError(f"its {MANIFEST} does not list the modules it provides")
    site = folder / "site-packages"
    missing = [p for p in provides if not ((site / p).is_dir() or (site / f"{p}.py").is_file())]
    if missing:
        raise PackError(f"it lacks {', '.join(missing)} in {site}")
    return {**manifest, "path": str(site)}


def choose(root: Path | None) -> Choice:
    """Every usable pack under root, by name; the first pack to provide a module wins it."""
    choice = Choice()
    if root is None or not root.is_dir():
        return choice
    taken: dict[str, str] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            pack = check(folder)
        except PackError as exc:
            choice.notes.append(f"The engine pack in {folder} is not used: {exc}. "
                                "The app's built-in engine runs instead; delete the folder or install the pack again.")
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
