"""The computer in words, for the keys that remember a measurement on it and the lines that report one."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
