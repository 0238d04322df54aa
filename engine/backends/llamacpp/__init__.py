"""The llama.cpp engine: GGUF targets with DFlash GGUF drafters, run by llama-server (built from the
pinned llama-cpp-python sdist, build.py) on 127.0.0.1. The server drafts and verifies by itself, so this
engine streams (docs/ENGINES.md, "Engines that run their own loop"). This file only declares; the
modules below it start processes and read files only when a pair is loaded."""
from __future__ import annotations

NAME = "llamacpp"
LABEL = "llama.cpp"
# device class -> what the engine calls it; the build decides which exist (build.py --backend)
DEVICES = {"cuda": "cuda", "apple": "metal", "cpu": "cpu"}
# GGUF targets come in their file's own type; safetensors targets are converted to this one
DTYPES = {"cuda": "float16", "apple": "float16", "cpu": "float32"}
# Target model_type -> device classes where greedy DFlash is checked identical to plain decoding
# (tests/test_llamacpp_engine.py, on the CPU build; GPU builds never run in this project's CI).
ARCHITECTURES = {"qwen3": ("cpu",)}
# Tokens per llama.cpp micro-batch (its -ub). With flash attention off (the CPU's choice, engine.py) a step
# holds float32 attention scores for this many queries over the whole context: fit.py counts that memory.
UBATCH = 512


def load_pair(target_dir, draft_dir=None, device: str = "auto", dtype: str | None = None, progress=None,
              cancelled=lambda: False):
    from .engine import load_pair as load
    return load(target_dir, draft_dir, device=device, dtype=dtype, progress=progress, cancelled=cancelled)


def missing() -> str | None:
    """Why this engine cannot run here (no llama.cpp build), or None."""
    from . import build
    try:
        build.find_build()
    except build.BuildMissing as exc:
        return str(exc)
    return None


def describe() -> dict:
    """The build in use (version, backend, patches), or why there is none."""
    from . import build
    try:
        import json
        info = json.loads((build.find_build() / "BUILD.json").read_text(encoding="utf-8"))
    except build.BuildMissing as exc:
        return {"version": None, "devices": [], "missing": str(exc)}
    return {"version": f"llama.cpp from llama-cpp-python {info['llama_cpp_python']}", "backend": info["backend"],
            "patches": info["patches"], "devices": sorted({"cpu", info["backend"]})}
