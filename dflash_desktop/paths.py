"""Where the app keeps its files.

Everything goes through these functions so that one environment variable, ``DFLASH_DESKTOP_HOME``,
can relocate the whole app (tests, portable installs). Without it we follow the platform's
conventions through platformdirs, and models live in the shared Hugging Face cache so that models
another tool already downloaded are reused instead of fetched twice.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import platformdirs

APP_NAME = "DFlashDesktop"
HOME_ENV = "DFLASH_DESKTOP_HOME"
MODELS_ENV = "DFLASH_DESKTOP_MODELS"


def _home() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Per-user data folder (chats, settings, catalog copy)."""
    home = _home()
    return _ensure(home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)))


def logs_dir() -> Path:
    """Log folder; kept apart from data so users can clear it freely."""
    home = _home()
    return _ensure(home / "logs" if home else Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)))


def cache_dir() -> Path:
    """Disposable cache (refreshed catalog, thumbnails)."""
    home = _home()
    return _ensure(home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)))


def hf_hub_cache_default() -> Path:
    """The shared Hugging Face hub cache, resolved the way huggingface_hub resolves it.

    Computed from the environment at call time (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME) rather than
    read from ``huggingface_hub.constants``, whose values are frozen at import.
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def models_dir() -> Path:
    """Folder holding downloaded models, in the Hugging Face cache layout.

    Order: ``DFLASH_DESKTOP_MODELS`` (a user's chosen folder), then ``<DFLASH_DESKTOP_HOME>/models``,
    then the shared Hugging Face cache.
    """
    if os.environ.get(MODELS_ENV):
        return _ensure(Path(os.environ[MODELS_ENV]).expanduser())
    home = _home()
    return _ensure(home / "models" if home else hf_hub_cache_default())


def settings_file() -> Path:
    """JSON settings file (written by the settings module)."""
    home = _home()
    base = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    return _ensure(base) / "settings.json"


def existing_parent(path: Path) -> Path:
    """Closest existing ancestor of ``path``: what disk-usage queries need before a folder exists."""
    path = Path(path).absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or ".")


def engine_packs_dir() -> Path:
    """Engine packs (engine/packs.py) a frozen app's engine uses: per user, beside the data and not in the
    install folder, which a .deb or a signed macOS app cannot write and an upgrade replaces."""
    return data_dir() / "engine-packs"


class FileTooLargeError(OSError):
    """A file longer than the most its reader takes; nothing past that bound was read."""


def read_small_file(path: Path | str, max_bytes: int) -> bytes:
    """A small file (settings, a chat export) read whole, with bounds: a FIFO, a device (a link to /dev/zero,
    say) or a folder is refused before a byte is read, since reading it could block or never end, and a file
    longer than ``max_bytes`` after ``max_bytes + 1`` bytes. Both raise OSError with a message saying why."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer (and changes nothing for a regular file)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file (it is a pipe, a device or a folder), so it was not read")
    with open(fd, "rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(f"{path} is larger than {max_bytes:,} bytes, the most read from it")
    return data
