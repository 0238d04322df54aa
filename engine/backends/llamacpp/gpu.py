"""Which llama.cpp build and how many layers a GPU device gets, and what to say when it cannot have them.

A GPU build (build.py --backend vulkan, cuda or metal) names the GPUs it can use with `--list-devices`. Before
a server is started on one, that list is read: a missing build, a missing Vulkan loader (the binary does not
start), a driver that offers no usable GPU, or a start that runs out of video memory each become one sentence
that says what to do, and the pair runs on the CPU instead (load_pair's note), so nothing the user has is lost.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import build

# the engine's device name -> the builds that drive it, first preferred (Vulkan also drives NVIDIA cards)
BUILDS_FOR = {"vulkan": ("vulkan",), "cuda": ("cuda", "vulkan"), "metal": ("metal",)}
ALL_LAYERS = 999            # llama.cpp's -ngl: more than any model has, so every layer goes to the GPU
LIST_SECONDS = 30.0         # enumerating devices (a software driver compiles nothing here; real ones take < 1 s)
_LINE = re.compile(r"^\s*(\w+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")
# GPUs built into the processor, which report a share of system memory as theirs: a card beside one is faster
_INTEGRATED = re.compile(r"\b(UHD|Iris|HD Graphics|Radeon\(TM\) Graphics|Radeon Graphics|Radeon \d+M|Vega \d+ "
                         r"Graphics|Intel\(R\) Graphics|llvmpipe)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Device:
    name: str               # llama.cpp's name for it (Vulkan0, CUDA0): what -dev takes
    description: str        # the driver's name for the card
    total: int              # bytes of memory, as the driver reports them
    free: int


class NoGpu(Exception):
    """The GPU cannot be used; the message says why and what to do. The pair then runs on the CPU."""


def parse_devices(text: str) -> list[Device]:
    """The devices of `llama-server --list-devices` output (none: an empty list)."""
    found = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            found.append(Device(m[1], m[2], int(m[3]) << 20, int(m[4]) << 20))
    return found


def best(devices: list[Device]) -> Device:
    """The GPU models run on: a card before a processor's built-in GPU, then the most free memory."""
    return max(devices, key=lambda d: (not _INTEGRATED.search(d.description), d.free))


def list_devices(binary: Path, env: dict) -> list[Device]:
    """The GPUs this build can use here, or NoGpu naming why there are none."""
    try:
        proc = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, errors="replace",
                              timeout=LIST_SECONDS, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NoGpu(f"The GPU driver did not list its devices in {LIST_SECONDS:.0f} s; it may be hung. Restart the "
                    "computer or update the GPU driver.") from None
    except OSError as exc:
        raise NoGpu(f"llama.cpp's GPU build could not be started ({exc}).") from None
    said = proc.stdout + proc.stderr
    if proc.returncode != 0:
        if "libvulkan" in said:
            raise NoGpu("The Vulkan loader (libvulkan) is not installed, so llama.cpp cannot reach the GPU. Install "
                        "your GPU driver's Vulkan support (on Debian or Ubuntu: the libvulkan1 and mesa-vulkan-drivers "
                        "packages, or the vendor's driver).")
        last = [ln for ln in said.splitlines() if ln.strip()][-1:] or ["no output"]
        raise NoGpu(f"llama.cpp's GPU build stopped while listing devices (exit {proc.returncode}: "
                    f"{last[0].strip()[:200]}). Update the GPU driver.")
    devices = parse_devices(proc.stdout)
    if not devices:
        raise NoGpu("No GPU that llama.cpp can use was found: the GPU driver may be missing, too old, or without "
                    "Vulkan support. Install or update the GPU driver.")
    return devices


def found_gpu() -> str | None:
    """The GPU device a load that names none runs on: the first GPU build here that lists a GPU (None: the CPU)."""
    from .server import clean_env
    found = build.builds()
    for device, backend in (("cuda", "cuda"), ("vulkan", "vulkan"), ("metal", "metal")):
        folder = found.get(backend)
        if folder is None:
            continue
        try:
            list_devices(folder / "bin" / f"llama-server{build.EXE}", clean_env())
        except NoGpu:
            continue
        return device
    return None


def gpu_build(device: str) -> Path:
    """The llama-server that drives this device, or NoGpu when no such build is on this computer."""
    for backend in BUILDS_FOR[device]:
        try:
            return build.server_binary(backend)
        except build.BuildMissing:
            continue
    backend = BUILDS_FOR[device][0]
    raise NoGpu(f"llama.cpp's {build.BACKEND_LABELS[backend]} build is not on this computer. Run `python -m "
                f"engine.backends.llamacpp.build --backend {backend}` to use the GPU.")


def out_of_memory(lines: list[str]) -> bool:
    """Whether a server's log says the GPU ran out of memory while loading."""
    text = "\n".join(lines).lower()
    return any(s in text for s in ("erroroutofdevicememory", "device memory allocation", "out of memory",
                                   "failed to allocate", "unable to allocate"))


# what a GPU needs beyond the layers: the compute buffers of a 512-token micro-batch, the driver's own, slack
GPU_MARGIN_FIXED = 768 << 20
GPU_MARGIN_FRACTION = 0.05


def layers_on_gpu(free: int, weights: int, layers: int, kv_per_layer: int, fixed: int = 0) -> int:
    """How many of a model's layers llama.cpp is told to keep on a GPU with `free` bytes: all when the weights,
    the KV cache and the margin fit; else as many whole layers (their weights and cache) as fit beside what must
    stay there whatever the count (`fixed`: a drafter, which shares the target's GPU buffers); 0: none.
    Used by the engine when it starts a server and by the model list to say what will happen."""
    per_layer = weights / max(layers, 1) + kv_per_layer
    room = free - fixed - GPU_MARGIN_FIXED - GPU_MARGIN_FRACTION * (weights + fixed)
    if room >= per_layer * layers:
        return layers
    return max(0, min(layers, int(room // per_layer))) if per_layer > 0 else 0
