"""The app's read-only files: the embedded demo pair, the bundled catalog, the icons.

`path()` is the one way to find them. A source checkout and a frozen (PyInstaller) app both keep these
files next to this module (the build copies the folder as it is), so no caller needs to know which kind
of run it is in.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def path(*parts: str) -> Path:
    """Absolute path of an asset, e.g. ``path("icons", "dflash.svg")``; no parts: the assets folder."""
    return _HERE.joinpath(*parts)
