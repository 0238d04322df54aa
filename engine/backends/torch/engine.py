"""The torch engine's loader: which device and dtype, the architecture check, reading the target, the drafter
and the tokenizer, and the engine that runs them (eager.py everywhere; cuda.py's static engine on NVIDIA GPUs
for the architectures it has graphs for)."""
from __future__ import annotations

import json

from pathlib import Path
from typing import Callable

import torch

from ... import draft_vocab
from ...config import DraftConfig
from ...errors import Cancelled, CheckpointError, EngineError
from ...pairing import check_pair
from ...tokenizer import ChatTokenizer
from .. import architecture
from . import ARCHITECTURES, DEVICES, DTYPES, NAME, cpu, quantized
from .eager import DRAFTERS, TorchPair
from .target import TargetModel

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DeviceUnavailable(EngineError):
    code = "device_unavailable"


def resolve_device(device: str | None) -> torch.device:
    """`auto`: CUDA when torch sees an NVIDIA GPU, else Apple's GPU, else the CPU. A named device that
    is missing is refused with the reason, so the caller can offer the CPU instead."""
    device = device or "auto"
    mps = getattr(torch.backends, "mps", None)
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if mps and mps.is_available() else "cpu")
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        why = ("this copy of torch was built without CUDA" if torch.version.cuda is None
               else "torch sees no NVIDIA GPU (is the driver installed?)")
        raise DeviceUnavailable(f"The NVIDIA GPU (cuda) cannot be used: {why}. Load the model on the CPU instead.")
    if kind == "mps" and not (mps and mps.is_available()):
        raise DeviceUnavailable("Apple's GPU (mps) cannot be used here: it needs macOS on Apple Silicon. "
                                "Load the model on the CPU instead.")
    if kind not in ("cpu", "cuda", "mps"):
        raise DeviceUnavailable(f"Unknown device {device!r}: use auto, cpu, cuda, cuda:N or mps.")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise DeviceUnavailable(f"Device {device!r} is not valid here ({exc}).") from None


def free_bytes(device: torch.device) -> int | None:
    """Memory a load may still take on this device (None where no honest figure exists: mps)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        import psutil
        return int(psutil.virtual_memory().available)
    return None


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return getattr(torch, DTYPES[device_class(device)])


def device_class(device: torch.device) -> str:
    return next(cls for cls, name in DEVICES.items() if name == device.type)


def devices() -> list[dict]:
    """Every device this engine can use here, with what the app shows about it."""
    out = [{"engine": NAME, "device": "cpu", "class": "cpu", "threads": torch.get_num_threads(),
            "bfloat16_faster": cpu.bfloat16_is_faster_here()}]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append({"engine": NAME, "device": f"cuda:{i}", "class": "cuda", "name": p.name,
                        "total_memory_bytes": int(p.total_memory), "capability": f"{p.major}.{p.minor}"})
    mps = getattr(torch.backends, "mps", None)
    if mps and mps.is_available():
        out.append({"engine": NAME, "device": "mps", "class": "apple"})
    return out


def check_architecture(target_dir: Path, device: torch.device) -> str:
    """The target's model_type, refused before loading when this engine does not run it on this device."""
    if not (target_dir / "config.json").is_file():
        raise CheckpointError(f"No config.json in target folder {target_dir}. Point to a downloaded model folder.")
    try:
        model_type = str(json.loads((target_dir / "config.json").read_text(encoding="utf-8")).get("model_type"))
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{target_dir / 'config.json'} cannot be read as a JSON object ({exc}). "
                              "Re-download the model.") from None
    family = architecture(model_type)
    where = device_class(device)
    if where not in ARCHITECTURES.get(family, ()):
        runs = ", ".join(sorted(a for a, d in ARCHITECTURES.items() if where in d))
        raise CheckpointError(f"The torch engine does not run {model_type!r} models on the {where} "
                              f"(it runs {runs} there). Pick a pair of a supported architecture.",
                              code="unsupported_architecture")
    return family


def load_pair(target_dir, draft_dir=None, device: str | None = "auto", dtype: str | None = None,
              progress: Callable[[str, str], None] | None = None,
              cancelled: Callable[[], bool] = lambda: False) -> "TorchPair":
    """Load and check a pair; draft_dir None gives a target-only pair (plain decoding). Each stage is
    reported to progress(stage, message); a true cancelled() between stages stops the load."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # progress is ours to report, not stderr noise

    def report(stage: str, message: str) -> None:
        if cancelled():
            raise Cancelled("Loading was cancelled; nothing is loaded.")
        if progress is not None:
            progress(stage, message)

    target_dir = Path(target_dir)
    dev = resolve_device(device)
    if dtype is not None and dtype not in TORCH_DTYPES and dtype not in quantized.QUANTIZED:
        raise EngineError(f"Unknown dtype {dtype!r}: use {', '.join([*TORCH_DTYPES, *quantized.QUANTIZED])}.",
                          code="bad_settings")
    torch_dtype = TORCH_DTYPES.get(dtype) or default_dtype(dev)   # quantized: the layers they keep, the drafter
    family = check_architecture(target_dir, dev)
    quantize = dtype if dtype in quantized.QUANTIZED else None
    cfg = DraftConfig.from_file(Path(draft_dir) / "config.json") if draft_dir else None
    report("weights", f"Reading the target's weights from {target_dir.name}")
    target = TargetModel.from_pretrained(target_dir, dtype=torch_dtype, device=dev, available_bytes=free_bytes(dev),
                                         quantize=quantize)
    drafter = vocab = None
    if cfg is not None:
        check_pair(target, cfg)
        target.capture(cfg.capture_layers(target.num_layers))
        report("drafter", f"Reading the drafter from {Path(draft_dir).name}")
        drafter_class, _ = DRAFTERS[cfg.generation]
        drafter = drafter_class.from_pretrained(draft_dir, dtype=torch_dtype, device=dev,
                                                available_bytes=free_bytes(dev))
        vocab = draft_vocab.load(Path(draft_dir), target.vocab_rows)
    report("tokenizer", "Reading the tokenizer")
    tokenizer = ChatTokenizer.from_folder(target_dir)
    report("tuning", "Preparing the model for this device")
    if dev.type == "cuda":   # static caches and CUDA graphs where the architecture allows (cuda.py)
        from . import cuda
        if cuda.supported(family) and (drafter is None or drafter.generation in cuda.STATIC_RUNNERS):
            pair = cuda.CudaPair(target, drafter, tokenizer, target_dir.name, family, vocab=vocab)
            report("tuning", "Compiling and capturing the GPU's steps (once per load)")
            pair.warm_up()
            return pair
    return TorchPair(target, drafter, tokenizer, target_dir.name, family, vocab)


def describe() -> dict:
    """The engine's library version and every device it can use here."""
    return {"version": torch.__version__, "cuda_version": torch.version.cuda, "devices": devices()}
