"""The torch engine: Hugging Face transformers targets with our own DFlash drafter, on CPU, CUDA or
Apple's GPU (mps). This file only declares what the engine runs; torch is imported by the modules
below it, when a pair is loaded, never by the window."""
from __future__ import annotations

NAME = "torch"
LABEL = "PyTorch"
# device class (engine/backends/__init__.py) -> torch's device name, and the dtype weights load in there
# (CUDA GPUs without native bfloat16, before compute capability 8.0, take float16)
DEVICES = {"cuda": "cuda", "apple": "mps", "cpu": "cpu"}
DTYPES = {"cuda": "bfloat16", "apple": "bfloat16", "cpu": "float32"}
# Target model_type -> device classes where greedy DFlash output is checked identical to plain decoding
# (tests/test_engine_architectures.py runs every entry on the CPU; CI has no cuda or mps, and what ran
# on a lent GPU is in docs/ENGINES.md).
_ALL = ("cuda", "apple", "cpu")
ARCHITECTURES = {
    "qwen3": _ALL, "llama": _ALL, "qwen3_moe": _ALL,
    "qwen3_5": _ALL, "qwen3_5_moe": _ALL,      # hybrid: Gated DeltaNet layers, rolled back by hybrid.py
    "gpt_oss": _ALL, "gemma4": _ALL,           # sliding-window layers (gpt-oss: attention sinks, MoE)
}

# dtypes that quantize the target while it loads (bitsandbytes, quantized.py) -> bytes per weight of a
# quantized linear layer (NF4: 4 bits and a float32 scale per 64 weights)
QUANTIZED = {"int8": 1.0, "nf4": 0.5625}
# The weight formats load_pair takes (dtype names) -> device classes: the full-precision dtypes everywhere,
# bitsandbytes' quantizations where bitsandbytes runs (not Apple's GPU)
FORMATS = {"float32": _ALL, "bfloat16": _ALL, "float16": _ALL, "int8": ("cuda", "cpu"), "nf4": ("cuda", "cpu")}

# Drafter generations (engine/config.py GENERATIONS): DFlash (drafter.py), DFlash2 (drafter2.py), DSpark (dspark.py),
# EAGLE-3 in SpecForge's layout (eagle3.py; the eager engine on every device, cuda.py's static one has no graphs)
DRAFTER_GENERATIONS = (1, 2, 3, 4)
# Speculation methods (engine.backends.METHODS): plain decoding, n-gram lookup (lookup.py, with or without a
# drafter) and the drafters above
METHODS = ("none", "ngram", "eagle3", "dspark", "dflash", "dflash2")
