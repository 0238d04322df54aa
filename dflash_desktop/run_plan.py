"""Which engine, device and dtype run a catalog pair on this computer: one decision, shown by the model
picker and sent to the worker as it is, so what the user reads is what loads."""
from __future__ import annotations

from dataclasses import dataclass

from engine.backends import DEVICE_LABELS, ENGINES

from .catalog import Pair
from .hardware import NATIVE_BF16_CC, HardwareReport

# engine dtype names -> the catalog's (fit estimates count bytes by these)
CATALOG_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class RunPlan:
    engine: str
    device_class: str     # cuda, apple or cpu
    device: str           # the engine's own name for it (torch: cuda, mps, cpu)
    dtype: str            # the weights' dtype there: float32, bfloat16 or float16

    @property
    def request(self) -> dict:
        """The load_pair fields (docs/PROTOCOL.md)."""
        return {"engine": self.engine, "device": self.device, "dtype": self.dtype}

    @property
    def label(self) -> str:
        return f"{ENGINES[self.engine].label} on the {DEVICE_LABELS[self.device_class]}, {self.dtype}"

    @property
    def catalog_dtype(self) -> str:
        return CATALOG_DTYPES[self.dtype]


AUTO = {"engine": "torch", "device": "auto", "dtype": None}   # before the hardware is known: the engine decides


def plan_for(pair: Pair, report: HardwareReport) -> RunPlan | None:
    """The pair's first engine that runs it on this computer's device, else on its CPU; None if neither."""
    for device_class in dict.fromkeys((report.device, "cpu")):
        for engine, devices in pair.engines.items():
            if device_class in devices:
                info = ENGINES[engine]
                dtype = info.dtypes[device_class]
                if device_class == "cuda" and dtype == "bfloat16" and not _native_bf16(report):
                    dtype = "float16"
                return RunPlan(engine, device_class, info.devices[device_class], dtype)
    return None


def _native_bf16(report: HardwareReport) -> bool:
    gpu = next((g for g in report.gpus if g.index == report.gpu_index), None)
    return gpu is None or gpu.compute_capability is None or gpu.compute_capability >= NATIVE_BF16_CC
