"""Report every artefact's size and hold it to its budget: `python installers/sizes.py` (after a build).

A budget catches a broken trim (torch's test binaries or a CUDA library back in the bundle is hundreds of
MB) long before a user downloads it. Each budget is the measured size plus about 15%; docs/INSTALL.md
lists the measured sizes. Prints a Markdown table (the workflow adds it to the run's summary) and exits
1 if anything is over budget.
"""
from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

DIST = Path(__file__).resolve().parent.parent / "dist"
MIB = 2**20

# artefact (glob under dist/) -> budget in MiB: each raised by 94 when the chat pair's model joined the bundle
# (SmolLM2's Q4_1 GGUF is 93.8 MiB and hardly compresses: gzip keeps 88% of it)
BUDGETS = {
    "dflash-desktop": 1094,                       # the unpacked onedir app (Linux; Windows is similar)
    "dflash-desktop-*-linux-x86_64.tar.gz": 474,
    "dflash-desktop_*_amd64.deb": 394,
    "DFlash-Desktop-*-Setup.exe": 394,
    "DFlash-Desktop-*-macOS-*.dmg": 444,
}


def size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return path.stat().st_size


def measure(dist: Path = DIST) -> list[tuple[str, float, int]]:
    """(name, MiB, budget MiB) of each artefact found in dist/."""
    rows = []
    for path in sorted(dist.iterdir()) if dist.is_dir() else []:
        for pattern, budget in BUDGETS.items():
            if fnmatch.fnmatchcase(path.name, pattern):
                rows.append((path.name, size(path) / MIB, budget))
    return rows


def main() -> int:
    rows = measure()
    if not rows:
        print(f"no artefacts in {DIST}: build first (python installers/build.py)")
        return 1
    print("| artefact | size (MiB) | budget (MiB) |\n|---|---|---|")
    for name, mib, budget in rows:
        print(f"| {name} | {mib:.0f} | {budget}{' **over budget**' if mib > budget else ''} |")
    return 1 if any(mib > budget for _, mib, budget in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
