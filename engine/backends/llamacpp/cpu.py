"""What the CPU means for how llama-server is started.

Intel CPUs with AMX (Sapphire Rapids and later: `amx_int8` in /proc/cpuinfo) crash llama.cpp's repacked
AMX matrix kernels with SIGSEGV on their first graph for quantized weights (upstream llama.cpp issue
20824, unfixed in the build we pin). Starting the server with `--no-repack` keeps the weights as they are
in the file and takes the ordinary CPU kernels, which run (docs/BENCHMARKS.md, "AMX").
"""
from __future__ import annotations

import sys
from pathlib import Path

AMX_FLAGS = ("amx_int8", "amx_bf16", "amx_tile")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags as Linux lists them (empty where /proc/cpuinfo is not there)."""
    if cpuinfo is None:
        if not sys.platform.startswith("linux"):
            return set()
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")[:1_000_000]
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def repack_safe(flags: set[str] | None = None) -> bool:
    """Whether llama.cpp may repack weights here: not on a CPU with AMX (its AMX path crashes)."""
    flags = cpu_flags() if flags is None else flags
    return not any(f in flags for f in AMX_FLAGS)
