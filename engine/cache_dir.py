"""The app's cache folder as the engine sees it: the place dflash_desktop.paths.cache_dir names (one environment
variable, DFLASH_DESKTOP_HOME, moves both), read here because the engine does not import the app."""
from __future__ import annotations

import json
import os
from pathlib import Path


def app_cache() -> Path:
    home = os.environ.get("DFLASH_DESKTOP_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    import platformdirs
    return Path(platformdirs.user_cache_dir("DFlashDesktop", appauthor=False))


def files_id(path) -> str:
    """A file, or a folder's own files, as names, sizes and times: a key part that makes a changed model be
    measured again."""
    if path is None:
        return "-"
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []
    return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files) or str(path)


def read_record(name: str) -> dict:
    """A measurement file kept in the app's cache (a JSON object by key), or {} when it is missing or damaged:
    what it held is then measured again."""
    try:
        data = json.loads((app_cache() / name).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_record(name: str, data: dict) -> None:
    """Replace the file whole (a crash mid-write leaves the old one, never half of it)."""
    path = app_cache() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)
