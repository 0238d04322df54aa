"""Which engine, device and dtype run a catalog pair on this computer: one decision, shown by the model
picker and sent to the worker as it is, so what the user reads is what loads."""
from __future__ import annotations

from dataclasses import dataclass

from engine.backends import DEVICE_LABELS, ENGINES

from .catalog import Pair, Variant
from .hardware import NATIVE_BF16_CC, HardwareReport

# engine dtype names -> the catalog's (fit estimates count bytes by these)
CATALOG_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class RunPlan:
    engine: str
    device_class: str     # cuda, apple, vulkan or cpu
    device: str           # the engine's own name for it (torch: cuda, mps, cpu)
    dtype: str            # the weights' dtype there: float32, bfloat16 or float16, or the variant's
    variant: Variant | None = None   # the engine's own target files (catalog.py), when the pair has them
    own_gguf: str | None = None      # the target is a GGUF llama.cpp runs as it is: its catalog dtype (dtype unused)

    @property
    def request(self) -> dict:
        """The load_pair fields (docs/PROTOCOL.md)."""
        return {"engine": self.engine, "device": self.device, "dtype": self.dtype}

    @property
    def label(self) -> str:
        what = (self.variant.label if self.variant else f"its own {self.own_gguf.upper()} GGUF" if self.own_gguf
                else self.dtype)
        return f"{ENGINES[self.engine].label} on the {DEVICE_LABELS[self.device_class]}, {what}"

    @property
    def catalog_dtype(self) -> str:
        return self.variant.dtype if self.variant else self.own_gguf or CATALOG_DTYPES[self.dtype]

    @property
    def kv_dtype(self) -> str:
        """The KV cache's: a variant's engine (llama.cpp) keeps float16 caches over quantized weights, and
        a target quantized while loading computes (and caches) in bfloat16."""
        if self.own_gguf:
            return "fp16"
        if self.variant is None:
            return self.catalog_dtype
        return "bf16" if self.variant.quantizes else "fp16"

    @property
    def files_variant(self) -> Variant | None:
        """The variant whose own files make the target folder (variant_folder.py), if any."""
        return self.variant if self.variant is not None and not self.variant.quantizes else None


# before the hardware is known: the worker decides (engine.backends.choice.auto_engine)
AUTO = {"engine": "auto", "device": "auto", "dtype": None}


def gpu_classes(report: HardwareReport) -> list[str]:
    """The GPU device classes usable here, the chosen one first: an NVIDIA card that CUDA drives is also one
    llama.cpp's Vulkan build drives, so both are candidates for a pair (fit.py picks between them), unless
    the user named the device."""
    if report.device == "cpu":
        return []
    chosen_by_user = report.requested_device not in (None, "auto")
    return [report.device] + (["vulkan"] if report.vulkan_gpus and report.device != "vulkan" and not chosen_by_user
                              else [])


def plans_here(pair: Pair, report: HardwareReport) -> list[RunPlan]:
    """Every engine and GPU that can run the pair here, in preference order (the device, then the catalog's
    engine order), or its CPU plans when no GPU plan exists. An engine whose runtime is missing here
    (report.engines_missing) is passed over."""
    for classes in (gpu_classes(report), ["cpu"]):
        plans = [plan for device_class in classes for name in pair.engines
                 if (plan := _plan(pair, report, name, device_class)) is not None]
        if plans:
            return plans
    return []


def plan_for(pair: Pair, report: HardwareReport, engine: str | None = None) -> RunPlan | None:
    """The pair's first engine (or the one asked for) that runs it on this computer's GPU, else on its CPU; None
    if none does. Where several could, fit.estimate_here chooses by what fits (the picker's plan)."""
    if engine is None:
        return next(iter(plans_here(pair, report)), None)
    return next((plan for device_class in [*gpu_classes(report), "cpu"]
                 if (plan := _plan(pair, report, engine, device_class)) is not None), None)


def _plan(pair: Pair, report: HardwareReport, name: str, device_class: str) -> RunPlan | None:
    if device_class not in pair.engines[name] or name in report.engines_missing:
        return None
    info = ENGINES[name]
    variant = pair.variant(name)
    dtype = variant.dtype if variant else info.dtypes.get(device_class)
    if device_class == "cuda" and dtype == "bfloat16" and not _native_bf16(report):
        dtype = "float16"
    if not info.takes(dtype, device_class):   # what the engine declares is all it is sent
        return None
    target_file = str(pair.target.get("package_file") or pair.target.get("path") or "")
    own = pair.target["native_dtype"] if name == "llamacpp" and target_file.lower().endswith(".gguf") else None
    return RunPlan(name, device_class, info.devices[device_class], dtype, variant, own_gguf=own)


def runs_line(plan_label: str, planned: str | None, measured: str | None) -> str:
    """The picker's line on what runs a pair: the plan, or the engine a first load here measured faster than it
    (engine/fastest.py: the worker loads that one in the plan's place)."""
    if not plan_label:
        return ""
    if measured is None:
        return f"Runs with {plan_label}\n"
    if measured == planned:
        return f"Runs with {plan_label} · measured fastest here\n"
    return f"Runs with {ENGINES[measured].label}: measured faster here than {plan_label}\n"


def engine_choices(pair: Pair, current: str, device_class: str, missing: dict) -> list[str]:
    """Engines that could run the loaded pair from the same folders, for the settings: those built here that
    list this device or the CPU, without files of their own (a variant needs its own download, which the
    model list does), or only the current engine when it loaded a variant."""
    if pair.variant(current):
        return [current]
    return [name for name, devices in pair.engines.items()
            if name not in missing and not pair.variant(name) and {device_class, "cpu"} & set(devices)]


def engines_for(pair: Pair, report: HardwareReport) -> list[RunPlan]:
    """Every engine that can run the pair here, each on its first device, in the catalog's order of preference
    (the settings offer the choice when there is more than one)."""
    return [plan for plan in (plan_for(pair, report, name) for name in pair.engines) if plan is not None]


def _native_bf16(report: HardwareReport) -> bool:
    gpu = next((g for g in report.gpus if g.index == report.gpu_index), None)
    return gpu is None or gpu.compute_capability is None or gpu.compute_capability >= NATIVE_BF16_CC
