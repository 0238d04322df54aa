"""The llama.cpp engine: GGUF targets with GGUF drafters (DFlash, DFlash2, DSpark, EAGLE-3, Gemma 4 assistants), run by
llama-server (built from the pinned llama-cpp-python sdist, build.py) on 127.0.0.1. The server drafts and verifies
by itself, so this engine streams (docs/ENGINES.md, "Engines that run their own loop"). This file only declares;
the modules below it start processes and read files only when a pair is loaded."""
from __future__ import annotations

NAME = "llamacpp"
LABEL = "llama.cpp"
# device class -> what the engine calls it; the build decides which exist (build.py --backend, gpu.py)
DEVICES = {"cuda": "cuda", "apple": "metal", "vulkan": "vulkan", "cpu": "cpu"}
# GGUF targets come in their file's own type; safetensors targets are converted to this one
DTYPES = {"cuda": "float16", "apple": "float16", "vulkan": "float16", "cpu": "float32"}
# Target model_type -> device classes where greedy DFlash is checked identical to plain decoding
# (tests/test_llamacpp_architectures.py on tiny random stand-ins of each, tests/test_llamacpp_engine.py on the
# demo pair, on the CPU build; tests/test_llamacpp_vulkan.py the same stand-ins and the demo pair on the Vulkan
# build, run by Mesa's software driver; the CUDA and Metal builds never ran in this project's CI). The catalog plans
# DFlash pairs from this; a GGUF the user brings runs whatever the built llama-server loads (plain decoding of
# every architecture, DFlash where the server's graph hands the drafter the target's layers).
ARCHITECTURES = {arch: ("cpu", "vulkan") for arch in ("qwen3", "llama", "qwen3_moe", "qwen3_5", "qwen3_5_moe",
                                                     "gpt_oss", "gemma4")}
# Speculation methods (engine.backends.METHODS) its server runs here, each checked identical to plain decoding
# (tests/test_llamacpp_methods.py): n-gram lookup needs no drafter, MTP a target GGUF that keeps its
# multi-token-prediction head or a Gemma 4 assistant beside a Gemma 4 target, EAGLE-3, DSpark, DFlash and DFlash2
# their drafters; a pair's calibration (calibrate.py) measures those its files allow and keeps the fastest
METHODS = ("none", "ngram", "mtp", "eagle3", "dspark", "dflash", "dflash2")
# Drafter generations (engine/config.py) its converter and graph take: DFlash2's convolutions and candidate
# selector are in the pinned llama.cpp (src/models/dflash.cpp), drafted as draft-dflash; DSpark's Markov head too,
# drafted as draft-dspark; EAGLE-3 as draft-eagle3 (every layout its converter reads, not only the torch engine's)
DRAFTER_GENERATIONS = (1, 2, 3, 4)
# GGUF file types (llama.cpp's llama_ftype, general.file_type) by their usual names
GGUF_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1", 10: "q2_k", 11: "q3_k_s",
              12: "q3_k_m", 13: "q3_k_l", 14: "q4_k_s", 15: "q4_k_m", 16: "q5_k_s", 17: "q5_k_m", 18: "q6_k",
              19: "iq2_xxs", 20: "iq2_xs", 21: "q2_k_s", 22: "iq3_xs", 23: "iq3_xxs", 24: "iq1_s", 25: "iq4_nl",
              26: "iq3_s", 27: "iq3_m", 28: "iq2_s", 29: "iq2_m", 30: "iq4_xs", 31: "iq1_m", 32: "bf16",
              36: "tq1_0", 37: "tq2_0", 38: "mxfp4_moe"}
# The weight formats load_pair takes -> device classes: a GGUF's own type (it picks that file from a folder
# of several), or a dtype a safetensors target is converted to (convert.OUTTYPES)
FORMATS = {name: tuple(DEVICES) for name in ("float32", "float16", "bfloat16", *GGUF_TYPES.values())}
# Tokens per llama.cpp micro-batch (its -ub). With flash attention off (the CPU's choice, engine.py) a step
# holds float32 attention scores for this many queries over the whole context: fit.py counts that memory.
UBATCH = 512


def missing() -> str | None:
    """Why this engine cannot run here (no llama.cpp build), or None."""
    from . import build
    try:
        build.find_build()
    except build.BuildMissing as exc:
        return str(exc)
    return None
