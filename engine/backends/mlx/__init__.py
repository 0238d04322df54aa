"""The MLX engine: targets loaded with mlx-lm's own model classes (bf16 or quantized MLX repos, or
Hugging Face folders mlx-lm reads), our DFlash drafter written in MLX, on Apple's GPU (Metal) or, with
mlx[cpu], on the CPU. This file only declares what the engine runs; mlx is imported by the modules
below it, when a pair is loaded, never by the window."""
from __future__ import annotations

NAME = "mlx"
LABEL = "MLX"
# device class (engine/backends/__init__.py) -> MLX's device name, and the dtype unquantized weights run in
DEVICES = {"apple": "gpu", "cpu": "cpu"}
DTYPES = {"apple": "bfloat16", "cpu": "float32"}
# Target model_type -> device classes where greedy DFlash output is checked identical to plain decoding
# and to mlx-lm's own generate (tests/test_mlx_architectures.py runs every entry on MLX's CPU device;
# Apple's GPU runs the same code but never runs in this project's CI: see docs/ENGINES.md).
_BOTH = ("apple", "cpu")
ARCHITECTURES = {
    "qwen3": _BOTH, "llama": _BOTH, "qwen3_moe": _BOTH,
    "qwen3_5": _BOTH, "qwen3_5_moe": _BOTH,    # hybrid: Gated DeltaNet layers, rolled back by hybrid.py
    "gpt_oss": _BOTH,                          # sliding-window layers, attention sinks, MoE
}
# Drafter generations (engine/config.py): DFlash (drafter.py), DFlash2 (drafter2.py), DSpark (dspark.py), EAGLE-3
# in SpecForge's layout (eagle3.py)
DRAFTER_GENERATIONS = (1, 2, 3, 4)
# Speculation methods (engine.backends.METHODS): plain decoding, n-gram lookup (engine/lookup.py, with or without
# a drafter) and the drafters above
METHODS = ("none", "ngram", "eagle3", "dspark", "dflash", "dflash2")
# catalog dtype names of MLX target variants (assets/catalog.json) -> the dtype the unquantized parts
# run in (None: the device's default); quantized layers keep the bits the folder's config.json names
VARIANT_DTYPES = {"q4": None, "q8": None, "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# The weight formats load_pair takes (dtype names, the catalog's variant names among them) -> device classes
FORMATS = {name: _BOTH for name in ("float32", "bfloat16", "float16", *VARIANT_DTYPES)}
INSTALL_HINT = ('Install it with: pip install "dflash-desktop[mlx]" (macOS on Apple Silicon: Metal; Linux: '
                "the CPU build, mlx[cpu]).")


def missing() -> str | None:
    """Why this engine cannot run here (mlx or mlx-lm not installed), or None. Light: finds the packages
    without importing them, so the planner passes over the engine on a Mac without the extra."""
    import importlib.util
    for name in ("mlx", "mlx_lm"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{name} is not installed. {INSTALL_HINT}"
    return None
