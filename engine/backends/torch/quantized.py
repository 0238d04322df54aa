"""Targets quantized by bitsandbytes: 8-bit (LLM.int8) or 4-bit NF4 linear layers, so an 8B target fits a
GPU with 8-12 GB. Two ways in: a full-precision folder loaded with dtype "int8" or "nf4" (quantized while it
loads), or a folder whose config.json already carries bitsandbytes' quantization_config (a pre-quantized
checkpoint, loaded as it is). Embeddings, norms and the LM head stay in the compute dtype, and so does the
drafter; greedy DFlash stays exactly the quantized target's own greedy decoding.

bitsandbytes runs on NVIDIA GPUs (its CUDA kernels) and on CPUs (where the tests use it); Apple's GPU is
refused. It and accelerate (which transformers needs to place quantized weights) are the optional
`nvidia` extra: pip install "dflash-desktop[nvidia]"."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...errors import CheckpointError, EngineError
from . import QUANTIZED  # noqa: F401  (the dtypes and their bytes per weight, declared with the engine)

INSTALL = 'pip install "dflash-desktop[nvidia]"'


def prequantized(folder: Path) -> str | None:
    """The quantization a folder's config.json declares for bitsandbytes ("int8" or "nf4"), else None.
    Another method (GPTQ, AWQ, fp8...) is refused by name: transformers would need code we do not ship."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None       # the loader's own checks report an unreadable config
    quant = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    if method != "bitsandbytes":
        raise CheckpointError(f"{folder} is quantized with {method!r}, which the torch engine does not load; "
                              "it loads bitsandbytes 8-bit/4-bit checkpoints, or full-precision weights it can "
                              "quantize itself (int8, nf4).", code="unsupported_architecture")
    if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
        return "nf4" if quant.get("bnb_4bit_quant_type", "nf4") == "nf4" else "fp4"
    return "int8"


def require(device: torch.device, what: str) -> None:
    """bitsandbytes and accelerate importable, on a device bitsandbytes runs on; else a clear refusal."""
    if device.type == "mps":
        raise EngineError(f"{what} needs an NVIDIA GPU or the CPU: bitsandbytes does not run on Apple's GPU. "
                          "Load the full-precision model, or use the mlx engine's own 4-bit/8-bit variants.",
                          code="bad_settings")
    for module in ("bitsandbytes", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            raise EngineError(f"{what} needs the {module} package, which is not installed: {INSTALL}, "
                              "then load the model again.", code="engine_unavailable") from None


def loading_config(name: str, compute_dtype: torch.dtype):
    """transformers' BitsAndBytesConfig that quantizes a full-precision target while it loads."""
    from transformers import BitsAndBytesConfig
    if name == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
