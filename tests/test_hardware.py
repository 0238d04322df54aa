"""Hardware detection from recorded probe outputs, plus the real probe on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_desktop.hardware import HardwareProbe, HardwareReport, detect, detect_live

FIXTURES = Path(__file__).parent / "fixtures" / "hardware"
MiB = 2**20


def probe(name: str, **changes) -> HardwareProbe:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    data.update(changes)
    return HardwareProbe.from_dict(data)


def roundtrip(report: HardwareReport) -> None:
    wire = json.loads(json.dumps(report.to_dict()))  # what goes over the JSON protocol
    assert HardwareReport.from_dict(wire) == report


def test_nvidia_via_nvml_picks_cuda_with_free_vram_budget():
    r = detect(probe("nvidia_rtx4090_nvml"))
    assert r.device == "cuda" and r.gpu_index == 0
    (g,) = r.gpus
    assert (g.name, g.source, g.compute_capability, g.driver_version) == (
        "NVIDIA GeForce RTX 4090", "nvml", (8, 9), "550.107.02")
    assert (g.memory_total, g.memory_free) == (24564 * MiB, 23817 * MiB)
    assert r.budget_bytes == 23817 * MiB
    assert "RTX 4090" in r.reason and "25.0 GB free" in r.reason and "compute capability 8.9" in r.reason
    assert {"avx2", "avx512f", "avx512_bf16"} <= set(r.cpu.features)
    assert (r.cpu.physical_cores, r.cpu.logical_cores) == (16, 32)
    assert r.disk.free == 812_000_000_000
    roundtrip(r)


def test_nvidia_smi_fallback_when_nvml_is_missing():
    r = detect(probe("nvidia_rtx3060_smi"))
    assert r.device == "cuda"
    (g,) = r.gpus
    assert (g.source, g.name, g.compute_capability, g.driver_version) == (
        "nvidia-smi", "NVIDIA GeForce RTX 3060", (8, 6), "535.183.01")
    assert (g.memory_total, g.memory_free) == (12288 * MiB, 11910 * MiB)
    assert r.budget_bytes == 11910 * MiB
    assert any("nvidia-smi" in n for n in r.notes)
    roundtrip(r)


def test_apple_silicon_picks_its_gpu_with_seventy_percent_of_unified_memory():
    r = detect(probe("apple_m2_16gb"))
    assert r.device == "apple" and not r.gpus
    assert r.apple.chip == "Apple M2" and r.apple.unified_memory == 16 * 2**30
    assert r.budget_bytes == int(16 * 2**30 * 0.70)
    assert (r.apple.performance_cores, r.apple.efficiency_cores) == (4, 4)
    assert {"neon", "dotprod", "bf16", "i8mm"} <= set(r.cpu.features)
    assert "Apple M2" in r.reason and "GPU" in r.reason
    roundtrip(r)


def test_apple_wired_limit_set_by_the_user_is_the_budget():
    p = probe("apple_m2_16gb")
    p.sysctl = p.sysctl.replace("iogpu.wired_limit_mb: 0", "iogpu.wired_limit_mb: 13000")
    assert detect(p).budget_bytes == 13000 * MiB


def test_cpu_only_machine_explains_why():
    r = detect(probe("cpu_only_i5"))
    assert r.device == "cpu" and not r.gpus
    assert r.budget_bytes == r.ram_available == 11200000 * 1024
    assert "no NVIDIA GPU" in r.reason and "no NVIDIA driver" in r.reason
    assert "avx2" in r.cpu.features and "avx512f" not in r.cpu.features
    assert r.cpu.model.startswith("Intel(R) Core(TM) i5-8250U")
    roundtrip(r)


def test_impossible_override_falls_back_with_a_reason():
    r = detect(probe("apple_m2_16gb"), override="cuda")
    assert r.device == "apple"
    assert "You asked for the NVIDIA GPU (CUDA)" in r.override_note and "no NVIDIA GPU" in r.override_note
    r = detect(probe("cpu_only_i5"), override="apple")
    assert r.device == "cpu" and "Apple Silicon" in r.override_note
    r = detect(probe("nvidia_rtx4090_nvml"), override="quantum")
    assert r.device == "cuda" and "Unknown device" in r.override_note


def test_possible_override_is_honoured():
    r = detect(probe("nvidia_rtx4090_nvml"), override="cpu")
    assert r.device == "cpu" and r.override_note is None
    assert r.reason.startswith("As you asked") and r.budget_source == "available RAM"


def test_rosetta_python_on_apple_silicon_cannot_use_the_gpu():
    r = detect(probe("apple_m2_16gb", machine="x86_64"))
    assert r.device == "cpu" and "Rosetta" in r.reason


def test_old_gpu_below_the_triton_minimum_is_not_used():
    p = probe("nvidia_rtx4090_nvml")
    p.nvml["gpus"][0].update(name="Tesla P100-PCIE-16GB", compute_capability=[6, 0])
    r = detect(p)
    assert r.device == "cpu" and "compute capability 6.0" in r.reason


def test_an_amd_card_is_used_through_llama_cpps_vulkan_build():
    """What the Vulkan build lists is what the app plans for: the card, not the processor's built-in GPU with
    its larger share of system memory, and its free video memory is the budget."""
    r = detect(probe("amd_rx7800xt_vulkan"))
    assert r.device == "vulkan" and not r.gpus
    g = r.vulkan_gpus[0]
    assert (g.name, g.source, g.memory_total, g.memory_free) == (
        "AMD Radeon RX 7800 XT (RADV NAVI32)", "Vulkan1", 16368 * MiB, 15890 * MiB)
    assert r.budget_bytes == 15890 * MiB and "video memory on Vulkan1" in r.budget_source
    assert "RX 7800 XT (RADV NAVI32) through Vulkan" in r.reason and "16.7 GB free of 17.2 GB" in r.reason
    assert any("2 GPUs found; models run on Vulkan1" in n for n in r.notes)
    roundtrip(r)


@pytest.mark.parametrize("seen, why", [
    (None, "llama.cpp's Vulkan build is not on this computer"),
    ({"backend": "vulkan", "returncode": 0, "output": "Available devices:\n  (none)\n"},
     "no GPU with a Vulkan driver was found"),
    ({"backend": "vulkan", "returncode": 127, "output": "llama-server: error while loading shared libraries: "
      "libvulkan.so.1: cannot open shared object file: No such file or directory\n"},
     "the Vulkan loader (libvulkan) is not installed"),
])
def test_without_a_usable_vulkan_gpu_the_cpu_runs_and_asking_for_it_says_why(seen, why):
    r = detect(probe("amd_rx7800xt_vulkan", llama_devices=seen), override="vulkan")
    assert r.device == "cpu" and not r.vulkan_gpus
    assert r.override_note == f"You asked for the GPU (Vulkan), but {why}; using the CPU instead."


def test_cuda_comes_before_vulkan_on_an_nvidia_card():
    nvidia = json.loads((FIXTURES / "nvidia_rtx4090_nvml.json").read_text())
    seen = {"backend": "vulkan", "returncode": 0,
            "output": "  Vulkan0: NVIDIA GeForce RTX 4090 (24564 MiB, 23817 MiB free)\n"}
    assert detect(probe("nvidia_rtx4090_nvml", llama_devices=seen)).device == "cuda"
    assert detect(probe("nvidia_rtx4090_nvml", llama_devices=seen), override="vulkan").device == "vulkan"
    nvidia["nvml"]["gpus"][0]["compute_capability"] = [6, 1]      # too old for the CUDA path: Vulkan drives it
    assert detect(HardwareProbe.from_dict({**nvidia, "llama_devices": seen})).device == "vulkan"


def test_live_probe_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    p = HardwareProbe.live()
    replayed = HardwareProbe.from_dict(json.loads(json.dumps(p.to_dict())))  # recordable as a fixture
    r = detect(replayed)
    if r.gpus or r.apple:
        pytest.skip("this check is written for the CPU-only CI machine")
    assert r.device == "cpu"
    assert r.cpu.logical_cores >= 1 and r.ram_total > 0 and r.ram_available > 0
    assert r.budget_bytes == r.ram_available
    assert len(r.reason) > 20 and r.reason.endswith(".")
    assert detect_live().device == "cpu"


def test_app_shell_never_loads_model_runtimes_or_qt(tmp_path):
    code = (
        "import sys\n"
        "from dflash_desktop import catalog, downloads, fit, hardware, paths\n"
        "r = hardware.detect_live()\n"
        "fit.choose_default_pair(catalog.load_catalog(False), fit.Budget.from_report(r))\n"
        "bad = [m for m in ('torch', 'transformers', 'mlx', 'llama_cpp', 'PySide6', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "DFLASH_DESKTOP_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parent.parent, env=env)
    assert out.returncode == 0, out.stderr
