"""The app's cache folder as the engine sees it: the place dflash_desktop.paths.cache_dir names (one environment
variable, DFLASH_DESKTOP_HOME, moves both), read here because the engine does not import the app."""
from __future__ import annotations

import os
from pathlib import Path


def app_cache() -> Path:
    home = os.environ.get("DFLASH_DESKTOP_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    import platformdirs
    return Path(platformdirs.user_cache_dir("DFlashDesktop", appauthor=False))
