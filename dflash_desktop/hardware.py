"""Hardware detection: what this computer has and which kind of device should run the models.

Two layers, so that detection can be tested on machines we do not own:

- ``HardwareProbe`` holds raw outputs (NVML values, ``nvidia-smi`` CSV text, ``sysctl`` text,
  ``/proc/cpuinfo`` and ``/proc/meminfo`` text, psutil numbers, disk usage, the GPUs a GPU build of
  llama-server lists). ``HardwareProbe.live()``
  collects them on this machine; ``to_dict``/``from_dict`` record and replay them as JSON fixtures.
- ``detect(probe, override)`` is pure: it parses the raw outputs into a ``HardwareReport`` and picks
  the device class (cuda / apple / vulkan / cpu, engine/backends) with a one-sentence reason. Which engine runs
  a pair on that device is run_plan.py's decision.

Never imports torch or any model runtime: this runs in the GUI process.
"""

from __future__ import annotations

import csv
import io
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.backends import DEVICE_CLASSES, missing_engines

APPLE_GPU_FRACTION = 0.70  # macOS lets the GPU wire roughly 2/3 to 3/4 of unified memory
MIN_CUDA_CC = (7, 5)  # the GPU kernels the app uses need Turing or newer
NATIVE_BF16_CC = (8, 0)

SYSCTL_KEYS = (
    "machdep.cpu.brand_string", "hw.memsize", "hw.ncpu", "hw.physicalcpu",
    "hw.perflevel0.physicalcpu", "hw.perflevel1.physicalcpu", "hw.optional.arm64",
    "hw.optional.neon", "hw.optional.AdvSIMD", "hw.optional.arm.FEAT_DotProd",
    "hw.optional.arm.FEAT_BF16", "hw.optional.arm.FEAT_I8MM", "machdep.cpu.features",
    "machdep.cpu.leaf7_features", "iogpu.wired_limit_mb",
)
NVIDIA_SMI_QUERY = "index,name,memory.total,memory.free,driver_version,compute_cap"

# Instruction-set flags worth showing, normalised across /proc/cpuinfo and sysctl spellings.
_X86_FLAGS = {
    "sse4_2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16", "avx_vnni": "avx_vnni", "amx_tile": "amx", "amx_bf16": "amx_bf16",
}
_ARM_FLAGS = {"asimd": "neon", "asimddp": "dotprod", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm",
              "bf16": "bf16", "asimdhp": "fp16"}
_MAC_INTEL_FLAGS = {"SSE4.2": "sse4_2", "AVX1.0": "avx", "FMA": "fma", "F16C": "f16c", "AVX2": "avx2",
                    "AVX512F": "avx512f", "AVX512BW": "avx512bw", "AVX512VNNI": "avx512_vnni"}
_MAC_ARM_FLAGS = {"hw.optional.neon": "neon", "hw.optional.AdvSIMD": "neon",
                  "hw.optional.arm.FEAT_DotProd": "dotprod", "hw.optional.arm.FEAT_BF16": "bf16",
                  "hw.optional.arm.FEAT_I8MM": "i8mm"}


# ----------------------------------------------------------------------------- raw probe

@dataclass
class HardwareProbe:
    """Raw probe outputs, exactly as the sources gave them (JSON-serialisable)."""

    system: str = ""
    machine: str = ""
    release: str = ""
    processor: str = ""
    nvml: dict | None = None
    nvidia_smi: str | None = None
    sysctl: str | None = None
    cpuinfo: str | None = None
    meminfo: str | None = None
    psutil: dict | None = None
    disk: dict | None = None
    copy: dict | None = None    # {"bytes", "seconds"}: the best of three in-memory copies (memory bandwidth)
    llama_devices: dict | None = None   # {"backend", "output"}: a GPU build's `llama-server --list-devices`
    errors: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HardwareProbe":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @classmethod
    def live(cls, models_dir: str | os.PathLike | None = None) -> "HardwareProbe":
        """Collect every source available on this machine; failures are recorded, never raised."""
        probe = cls(system=platform.system(), machine=platform.machine(), release=platform.release(),
                    processor=platform.processor())
        _try(probe, "nvml", _read_nvml)
        if probe.nvml is None or probe.nvml.get("error"):
            _try(probe, "nvidia_smi", _read_nvidia_smi)
        if probe.system == "Darwin":
            _try(probe, "sysctl", _read_sysctl)
        if Path("/proc/cpuinfo").exists():
            _try(probe, "cpuinfo", lambda: _first_cpu_block(Path("/proc/cpuinfo").read_text()))
        if Path("/proc/meminfo").exists():
            _try(probe, "meminfo", lambda: Path("/proc/meminfo").read_text())
        _try(probe, "psutil", _read_psutil)
        if models_dir is None:
            from . import paths
            models_dir = paths.models_dir()
        _try(probe, "disk", lambda: _read_disk(models_dir))
        _try(probe, "copy", _time_copy)
        _try(probe, "llama_devices", _read_llama_devices)
        return probe


def _try(probe: HardwareProbe, name: str, fn) -> None:
    try:
        setattr(probe, name, fn())
    except Exception as exc:  # noqa: BLE001 (a missing source is normal (no GPU, no sysctl...))
        probe.errors[name] = f"{type(exc).__name__}: {exc}"


def _read_nvml() -> dict:
    import pynvml  # lazy: nvidia-ml-py is only useful on NVIDIA machines

    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 (pynvml fails in many ways where no NVIDIA driver is loaded)
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append({"index": i, "name": text(pynvml.nvmlDeviceGetName(handle)),
                         "memory_total": int(mem.total), "memory_free": int(mem.free),
                         "compute_capability": [int(major), int(minor)]})
        return {"driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver_version": int(pynvml.nvmlSystemGetCudaDriverVersion()), "gpus": gpus}
    finally:
        pynvml.nvmlShutdown()


def _read_nvidia_smi() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,nounits"],
                         capture_output=True, text=True, timeout=10)
    if out.returncode != 0:  # old drivers lack compute_cap
        query = NVIDIA_SMI_QUERY.replace(",compute_cap", "")
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,nounits"],
                             capture_output=True, text=True, timeout=10)
    out.check_returncode()
    return out.stdout


def _read_llama_devices() -> dict | None:
    """What the GPU build of llama.cpp, when one is on this computer, says it can use: the one probe that
    sees AMD and Intel GPUs as llama.cpp will (through their Vulkan drivers)."""
    from engine.backends.llamacpp import build
    from engine.backends.llamacpp.server import clean_env
    found = {b: folder for b, folder in build.builds().items() if b != "cpu"}
    if not found:
        return None
    backend, folder = next(iter(found.items()))
    out = subprocess.run([str(folder / "bin" / f"llama-server{build.EXE}"), "--list-devices"], capture_output=True,
                         text=True, errors="replace", timeout=30, env=clean_env(), stdin=subprocess.DEVNULL)
    return {"backend": backend, "output": out.stdout if out.returncode == 0 else out.stdout + out.stderr,
            "returncode": out.returncode}


def _read_sysctl() -> str:
    # One call per key: sysctl stops at the first unknown key on some macOS versions.
    lines = []
    for key in SYSCTL_KEYS:
        out = subprocess.run(["sysctl", key], capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            lines.append(out.stdout.strip())
    return "\n".join(lines) + "\n"


def _first_cpu_block(text: str) -> str:
    """Keep only the first processor's block: the rest repeats it and can be 100s of KB."""
    return text.split("\n\n", 1)[0] + "\n"


def _read_psutil() -> dict:
    import psutil

    vm = psutil.virtual_memory()
    return {"logical": psutil.cpu_count(logical=True), "physical": psutil.cpu_count(logical=False),
            "ram_total": int(vm.total), "ram_available": int(vm.available)}


def _time_copy(size: int = 128 << 20) -> dict:
    """Copy 128 MB (more than any CPU cache) three times and keep the fastest: a measure of how fast this
    CPU streams memory, which is what bounds plain decoding on a CPU (every weight is read per token)."""
    import time
    src = b"\x01" * size
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        copy = bytearray(src)
        best = min(best, time.perf_counter() - start)
        del copy
    return {"bytes": 2 * size, "seconds": best}   # read once, written once


def _read_disk(models_dir) -> dict:
    from .paths import existing_parent

    path = existing_parent(Path(models_dir))
    usage = shutil.disk_usage(path)
    return {"path": str(models_dir), "total": int(usage.total), "free": int(usage.free)}


# ----------------------------------------------------------------------------- report

@dataclass
class GPUInfo:
    index: int
    name: str
    memory_total: int
    memory_free: int
    compute_capability: tuple[int, int] | None
    driver_version: str | None
    source: str  # "nvml" or "nvidia-smi"


@dataclass
class CPUInfo:
    model: str
    arch: str
    physical_cores: int | None
    logical_cores: int
    features: list[str]


@dataclass
class AppleInfo:
    chip: str
    unified_memory: int
    gpu_budget: int
    performance_cores: int | None = None
    efficiency_cores: int | None = None


@dataclass
class DiskInfo:
    path: str
    total: int
    free: int


@dataclass
class HardwareReport:
    os: str
    cpu: CPUInfo
    ram_total: int
    ram_available: int
    gpus: list[GPUInfo]
    apple: AppleInfo | None
    disk: DiskInfo | None
    device: str                 # device class: cuda, apple, vulkan or cpu
    reason: str
    budget_bytes: int
    budget_source: str
    gpu_index: int | None = None
    requested_device: str | None = None
    override_note: str | None = None
    notes: list[str] = field(default_factory=list)
    memory_bytes_per_s: float | None = None   # measured memory streaming rate, when probed
    engines_missing: dict[str, str] = field(default_factory=dict)   # engine -> why its runtime is absent here
    vulkan_gpus: list[GPUInfo] = field(default_factory=list)   # what llama.cpp's Vulkan build can use

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HardwareReport":
        d = dict(data)
        d["cpu"] = CPUInfo(**d["cpu"])
        d["gpus"] = [GPUInfo(**{**g, "compute_capability": tuple(g["compute_capability"])
                                if g.get("compute_capability") else None}) for g in d["gpus"]]
        d["vulkan_gpus"] = [GPUInfo(**{**g, "compute_capability": None}) for g in d.get("vulkan_gpus", [])]
        d["apple"] = AppleInfo(**d["apple"]) if d.get("apple") else None
        d["disk"] = DiskInfo(**d["disk"]) if d.get("disk") else None
        return cls(**d)


def gib(n: float) -> str:
    """Human size in GB (decimal, like disk makers and the hub), one decimal."""
    return f"{n / 1e9:.1f} GB"


# ----------------------------------------------------------------------------- parsing

def parse_kv(text: str | None, sep: str = ":") -> dict[str, str]:
    """'key: value' lines (sysctl, /proc/*) -> dict; the first occurrence wins."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if sep in line:
            key, value = line.split(sep, 1)
            out.setdefault(key.strip(), value.strip())
    return out


def parse_meminfo(text: str | None) -> tuple[int, int] | None:
    """(total, available) bytes from /proc/meminfo."""
    kv = parse_kv(text)
    try:
        total = int(kv["MemTotal"].split()[0]) * 1024
        avail = int(kv.get("MemAvailable", kv.get("MemFree", "0 kB")).split()[0]) * 1024
        return total, avail
    except (KeyError, ValueError, IndexError):
        return None


def parse_nvidia_smi(text: str | None) -> list[GPUInfo]:
    """GPUs from ``nvidia-smi --query-gpu=... --format=csv,nounits`` output (MiB units)."""
    if not text or not text.strip():
        return []
    rows = list(csv.reader(io.StringIO(text.strip())))
    header = [re.sub(r"\s*\[.*\]", "", h).strip() for h in rows[0]]
    gpus = []
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        rec = dict(zip(header, (c.strip() for c in row)))
        cc = None
        if re.fullmatch(r"\d+\.\d+", rec.get("compute_cap", "")):
            major, minor = rec["compute_cap"].split(".")
            cc = (int(major), int(minor))
        gpus.append(GPUInfo(index=int(rec["index"]), name=rec["name"],
                            memory_total=int(float(rec["memory.total"])) * 2**20,
                            memory_free=int(float(rec["memory.free"])) * 2**20,
                            compute_capability=cc, driver_version=rec.get("driver_version"),
                            source="nvidia-smi"))
    return gpus


def _gpus(probe: HardwareProbe) -> tuple[list[GPUInfo], list[str]]:
    notes = []
    nvml = probe.nvml or {}
    if nvml.get("gpus"):
        driver = nvml.get("driver_version")
        return [GPUInfo(index=g["index"], name=g["name"], memory_total=g["memory_total"],
                        memory_free=g["memory_free"],
                        compute_capability=tuple(g["compute_capability"]) if g.get("compute_capability") else None,
                        driver_version=driver, source="nvml") for g in nvml["gpus"]], notes
    if nvml.get("error"):
        notes.append(f"NVML unavailable ({nvml['error']})")
    elif "nvml" in probe.errors:
        notes.append(f"NVML unavailable ({probe.errors['nvml']})")
    gpus = parse_nvidia_smi(probe.nvidia_smi)
    if gpus:
        notes.append("GPU details read from nvidia-smi")
    return gpus, notes


def _vulkan_gpus(probe: HardwareProbe) -> list[GPUInfo]:
    """The GPUs llama.cpp's Vulkan build lists (its --list-devices), as GPUInfo."""
    from engine.backends.llamacpp.gpu import best, parse_devices
    seen = probe.llama_devices or {}
    if seen.get("backend") != "vulkan" or seen.get("returncode", 0) != 0:
        return []
    devices = parse_devices(seen.get("output", ""))
    first = best(devices) if devices else None      # the one the engine runs on, listed first
    return [GPUInfo(index=i, name=d.description, memory_total=d.total, memory_free=d.free, compute_capability=None,
                    driver_version=None, source=d.name)
            for i, d in enumerate(sorted(devices, key=lambda d: d is not first))]


def video_memory_source(g: GPUInfo) -> str:
    """Where a budget on a GPU that llama.cpp's Vulkan build lists comes from, in words."""
    return f"free video memory on {g.source}, {g.name}"


def _vulkan_problem(probe: HardwareProbe, vulkan: list[GPUInfo]) -> str | None:
    if vulkan:
        return None
    seen = probe.llama_devices
    if not seen or seen.get("backend") != "vulkan":
        return "llama.cpp's Vulkan build is not on this computer"
    if "libvulkan" in seen.get("output", ""):
        return "the Vulkan loader (libvulkan) is not installed"
    return "no GPU with a Vulkan driver was found"


def _cpu(probe: HardwareProbe, sysctl: dict[str, str]) -> CPUInfo:
    ps = probe.psutil or {}
    info = parse_kv(probe.cpuinfo)
    features: set[str] = set()
    if info.get("flags"):
        features |= {_X86_FLAGS[f] for f in info["flags"].split() if f in _X86_FLAGS}
    if info.get("Features"):
        features |= {_ARM_FLAGS[f] for f in info["Features"].split() if f in _ARM_FLAGS}
    for key, name in _MAC_ARM_FLAGS.items():
        if sysctl.get(key) == "1":
            features.add(name)
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
        features |= {_MAC_INTEL_FLAGS[f] for f in sysctl.get(key, "").split() if f in _MAC_INTEL_FLAGS}
    model = (sysctl.get("machdep.cpu.brand_string") or info.get("model name") or probe.processor
             or probe.machine or "unknown CPU")
    logical = ps.get("logical") or _int(sysctl.get("hw.ncpu")) or os.cpu_count() or 1
    physical = ps.get("physical") or _int(sysctl.get("hw.physicalcpu"))
    return CPUInfo(model=model, arch=probe.machine, physical_cores=physical, logical_cores=int(logical),
                   features=sorted(features))


def _rate(copy: dict | None) -> float | None:
    try:
        return float(copy["bytes"]) / float(copy["seconds"]) if copy and float(copy["seconds"]) > 0 else None
    except (KeyError, TypeError, ValueError):
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _apple(probe: HardwareProbe, sysctl: dict[str, str], ram_total: int) -> AppleInfo | None:
    if probe.system != "Darwin" or sysctl.get("hw.optional.arm64") != "1":
        return None
    memory = _int(sysctl.get("hw.memsize")) or ram_total
    wired_mb = _int(sysctl.get("iogpu.wired_limit_mb")) or 0
    budget = wired_mb * 2**20 if wired_mb > 0 else int(memory * APPLE_GPU_FRACTION)
    return AppleInfo(chip=sysctl.get("machdep.cpu.brand_string", "Apple Silicon"), unified_memory=memory,
                     gpu_budget=budget, performance_cores=_int(sysctl.get("hw.perflevel0.physicalcpu")),
                     efficiency_cores=_int(sysctl.get("hw.perflevel1.physicalcpu")))


# ----------------------------------------------------------------------------- device choice

def _cuda_problem(probe: HardwareProbe, gpus: list[GPUInfo]) -> str | None:
    """Why CUDA cannot run here, or None when it can."""
    if not gpus:
        error = (probe.nvml or {}).get("error") or probe.errors.get("nvml") or ""
        if "LibraryNotFound" in error or "No module named" in error:
            why = "no NVIDIA driver is installed"
        elif error:
            why = f"the NVIDIA driver did not answer: {error}"
        else:
            why = "the NVIDIA driver reports no GPU"
        return f"no NVIDIA GPU was found ({why})"
    usable = [g for g in gpus if g.compute_capability is None or g.compute_capability >= MIN_CUDA_CC]
    if not usable:
        g = gpus[0]
        cc = ".".join(map(str, g.compute_capability))
        return (f"the {g.name} has compute capability {cc}, and the app's GPU kernels need "
                f"{MIN_CUDA_CC[0]}.{MIN_CUDA_CC[1]} or newer")
    return None


def _apple_problem(probe: HardwareProbe, apple: AppleInfo | None, sysctl: dict[str, str]) -> str | None:
    if probe.system != "Darwin":
        return f"Apple's GPU is used only on macOS with Apple Silicon, and this is {probe.system or 'another OS'}"
    if apple is None:
        return "this Mac has an Intel processor; its GPU is used only on Apple Silicon (M1 or newer)"
    if probe.machine != "arm64":
        return ("Python is running under Rosetta (x86_64) on Apple Silicon; install the native arm64 "
                "build of the app to use the GPU")
    return None


def detect(probe: HardwareProbe, override: str | None = None) -> HardwareReport:
    """Parse raw probe outputs and choose a device class. Pure: same probe, same report."""
    sysctl = parse_kv(probe.sysctl)
    ps = probe.psutil or {}
    mem = parse_meminfo(probe.meminfo)
    ram_total = (mem[0] if mem else None) or ps.get("ram_total") or _int(sysctl.get("hw.memsize")) or 0
    ram_available = (mem[1] if mem else None) or ps.get("ram_available") or ram_total
    gpus, notes = _gpus(probe)
    apple = _apple(probe, sysctl, ram_total)
    cpu = _cpu(probe, sysctl)
    disk = DiskInfo(**probe.disk) if probe.disk else None

    vulkan = _vulkan_gpus(probe)
    problems = {"cuda": _cuda_problem(probe, gpus), "apple": _apple_problem(probe, apple, sysctl),
                "vulkan": _vulkan_problem(probe, vulkan), "cpu": None}
    auto = next(c for c in DEVICE_CLASSES if problems[c] is None)
    device, override_note = auto, None
    if override and override != "auto":
        if override not in DEVICE_CLASSES:
            override_note = f"Unknown device '{override}' ignored; choose one of {', '.join(DEVICE_CLASSES)}."
        elif problems[override]:
            override_note = (f"You asked for {_LABEL[override]}, but {problems[override]}; "
                             f"using {_LABEL[auto]} instead.")
        else:
            device = override

    report = HardwareReport(
        os=f"{probe.system} {probe.release} {probe.machine}".strip(), cpu=cpu, ram_total=int(ram_total),
        ram_available=int(ram_available), gpus=gpus, apple=apple, disk=disk, device=device, reason="",
        budget_bytes=0, budget_source="", requested_device=override, override_note=override_note,
        notes=notes, memory_bytes_per_s=_rate(probe.copy), vulkan_gpus=vulkan)
    _explain(report, problems, chosen_by_user=device == override)
    return report


_LABEL = {"cuda": "the NVIDIA GPU (CUDA)", "apple": "the Apple GPU (Metal)", "vulkan": "the GPU (Vulkan)",
          "cpu": "the CPU"}


def _explain(r: HardwareReport, problems: dict, chosen_by_user: bool) -> None:
    """Fill the device's memory budget and the one-sentence reason."""
    prefix = "As you asked, " if chosen_by_user else ""
    if r.device == "cuda":
        usable = [g for g in r.gpus if g.compute_capability is None or g.compute_capability >= MIN_CUDA_CC]
        g = max(usable, key=lambda g: g.memory_free)
        cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "unknown"
        r.gpu_index, r.budget_bytes = g.index, g.memory_free
        r.budget_source = f"free VRAM on GPU {g.index} ({g.name})"
        r.reason = (f"{prefix}using the {g.name} (CUDA): {gib(g.memory_free)} free of "
                    f"{gib(g.memory_total)} VRAM, compute capability {cc}, driver {g.driver_version or 'unknown'}.")
        if g.compute_capability and g.compute_capability < NATIVE_BF16_CC:
            r.notes.append("This GPU has no native bfloat16; models run in float16.")
        if len(r.gpus) > 1:
            r.notes.append(f"{len(r.gpus)} GPUs found; models run on GPU {g.index}, the one with most free memory.")
    elif r.device == "apple":
        a = r.apple
        r.budget_bytes = a.gpu_budget
        r.budget_source = f"about {round(a.gpu_budget / a.unified_memory * 100)}% of unified memory"
        r.reason = (f"{prefix}using the GPU of the {a.chip}: {gib(a.unified_memory)} unified memory, "
                    f"of which about {gib(a.gpu_budget)} can hold models.")
    elif r.device == "vulkan":
        g = r.vulkan_gpus[0]
        r.gpu_index, r.budget_bytes = g.index, g.memory_free
        r.budget_source = video_memory_source(g)
        r.reason = (f"{prefix}using the {g.name} through Vulkan (llama.cpp): {gib(g.memory_free)} free of "
                    f"{gib(g.memory_total)} video memory.")
        if len(r.vulkan_gpus) > 1:
            r.notes.append(f"{len(r.vulkan_gpus)} GPUs found; models run on {g.source} ({g.name}), a card before a "
                           "built-in GPU, then the one with most free memory.")
    else:
        r.budget_bytes = r.ram_available
        r.budget_source = "available RAM"
        why = problems["apple"] if r.os.startswith("Darwin") else problems["cuda"]
        if chosen_by_user:
            r.reason = (f"As you asked, running on the CPU ({r.cpu.model}, {r.cpu.logical_cores} threads, "
                        f"{gib(r.ram_available)} RAM free); expect much slower generation than on a GPU.")
        else:
            r.reason = (f"Running on the CPU ({r.cpu.model}, {r.cpu.logical_cores} threads, "
                        f"{gib(r.ram_available)} RAM free) because {why}; expect slow generation.")
        if r.cpu.arch in ("x86_64", "AMD64") and "avx2" not in r.cpu.features:
            r.notes.append("This CPU lacks AVX2, so CPU generation will be very slow.")


def detect_live(override: str | None = None, models_dir=None) -> HardwareReport:
    """Probe this machine and detect in one call (takes well under a second without a GPU)."""
    report = detect(HardwareProbe.live(models_dir), override)
    report.engines_missing = missing_engines()
    return report
