"""The seam between the one decode loop (engine/loop.py) and the engines that run models.

Every engine lives in a package of its own under engine/backends/ and imports its heavy library only
inside it. The package's __init__ is light: it declares the engine's name, the device classes it can
use and the target architectures it decodes losslessly on each, so the window can read them without
importing torch. docs/ENGINES.md is the human-readable form of this contract.

Pure standard library.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..errors import EngineError

# The kinds of hardware a machine can offer; each engine maps them to its own device names.
# vulkan: a GPU of any vendor (AMD, Intel, NVIDIA) that llama.cpp's Vulkan build reaches through its driver
DEVICE_CLASSES = ("cuda", "apple", "vulkan", "cpu")
DEVICE_LABELS = {"cuda": "NVIDIA GPU (CUDA)", "apple": "Apple GPU", "vulkan": "GPU (Vulkan)", "cpu": "CPU"}
# The ways to speculate a pair can run (docs/ENGINES.md, "Speculation methods"); each engine declares its own in
# METHODS, and a loaded pair's info["methods"] says which its files allow
METHODS = {"none": "plain decoding", "ngram": "n-gram lookup", "mtp": "MTP heads", "eagle3": "EAGLE-3",
           "dspark": "DSpark", "dflash": "DFlash", "dflash2": "DFlash2"}
# model_type spellings of text-only checkpoints, mapped to the family name the tables use
_TEXT_ONLY = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "gemma4_text": "gemma4"}


@dataclass(frozen=True)
class EngineInfo:
    name: str
    label: str
    package: str                                  # imported when a pair is loaded
    devices: dict[str, str]                       # device class -> the engine's device name
    dtypes: dict[str, str]                        # device class -> the dtype weights load in by default
    architectures: dict[str, tuple[str, ...]]     # target model_type -> device classes it runs on
    drafter_generations: tuple[int, ...] = (1,)   # drafter generations it decodes with (engine/config.py)
    quantized: dict[str, float] = field(default_factory=dict)   # dtypes it quantizes to while loading -> bytes/weight
    score_rows: int = 0       # queries whose float32 attention scores it holds per head over the whole context
    formats: dict[str, tuple[str, ...]] = field(default_factory=dict)   # weight format (dtype name) -> device classes
    methods: tuple[str, ...] = ("none", "dflash")   # keys of METHODS it runs

    def runs(self, model_type: str, device_class: str) -> bool:
        """DFlash checked identical to plain decoding for this architecture on this device class."""
        return device_class in self.architectures.get(architecture(model_type), ())

    def takes(self, dtype: str, device_class: str | None = None) -> bool:
        """Whether load_pair accepts this weight format (on this device class, when named)."""
        return dtype in self.formats and (device_class is None or device_class in self.formats[dtype])


def device_class_of(engine: str, device: str) -> str:
    """The device class behind an engine's own device name ("gpu" is Apple's GPU to mlx, "cuda:1" NVIDIA's
    to torch), read from the engine's declaration; cpu when the engine or name is unknown."""
    info = ENGINES.get(engine)
    names = info.devices if info else {c: c for c in DEVICE_CLASSES}
    base = device.split(":")[0]
    return next((cls for cls, name in names.items() if name == base), "cpu")


def check_format(engine: str | None, dtype: str | None, device_class: str | None = None) -> None:
    """Refuse a weight format the named engine does not declare (any engine's, for "auto" or none), with the
    formats that would work: the one check the planner, the protocol and the worker share."""
    if dtype is None:
        return
    infos = [ENGINES[engine]] if engine in ENGINES else list(ENGINES.values())
    if any(info.takes(dtype, device_class) for info in infos):
        return
    where = f" on the {DEVICE_LABELS.get(device_class, device_class)}" if device_class else ""
    if engine in ENGINES:
        names = [n for n, devices in ENGINES[engine].formats.items() if device_class is None or device_class in devices]
        others = [i.label for i in ENGINES.values() if i.name != engine and i.takes(dtype)]
        hint = f" {' and '.join(others)} can load {dtype!r}." if others else ""
        raise EngineError(f"The {ENGINES[engine].label} engine does not load {dtype!r} weights{where}; it takes "
                          f"{', '.join(names)}.{hint}", code="bad_settings")
    raise EngineError(f"No engine loads {dtype!r} weights{where}; known formats: "
                      f"{', '.join(sorted({n for i in infos for n in i.formats}))}.", code="bad_settings")


def _info(package: str) -> EngineInfo:
    mod = importlib.import_module(package)
    # an engine package that names no DRAFTER_GENERATIONS runs the first (DFlash) drafters only
    return EngineInfo(mod.NAME, mod.LABEL, package, dict(mod.DEVICES), dict(mod.DTYPES), dict(mod.ARCHITECTURES),
                      tuple(getattr(mod, "DRAFTER_GENERATIONS", (1,))), dict(getattr(mod, "QUANTIZED", {})),
                      int(getattr(mod, "UBATCH", 0)), dict(mod.FORMATS), tuple(mod.METHODS))


ENGINES: dict[str, EngineInfo] = {info.name: info for info in (
    _info("engine.backends.torch"),
    _info("engine.backends.mlx"),
    _info("engine.backends.llamacpp"),
)}


def missing_engines() -> dict[str, str]:
    """Engines whose runtime is not on this computer (a llama.cpp that was never built), with the reason.
    Light: each engine's check reads files, it imports nothing heavy."""
    out = {}
    for info in ENGINES.values():
        check = getattr(importlib.import_module(info.package), "missing", None)
        reason = check() if check else None
        if reason:
            out[info.name] = reason
    return out


def architecture(model_type: str) -> str:
    """The family a config.json model_type belongs to (text-only checkpoints share their family's)."""
    return _TEXT_ONLY.get(model_type, model_type)


def engine_info(name: str) -> EngineInfo:
    try:
        return ENGINES[name]
    except KeyError:
        raise EngineError(f"Unknown engine {name!r}; this build has {', '.join(ENGINES)}.",
                          code="engine_unavailable") from None


def load_pair(engine: str, target_dir, draft_dir=None, device: str = "auto", dtype: str | None = None,
              progress: Callable[[str, str], None] | None = None,
              cancelled: Callable[[], bool] = lambda: False) -> "LoadedPair":
    """Load a target (and drafter) with the named engine; progress(stage, message) reports each stage, and
    between stages a true cancelled() stops the load with engine.errors.Cancelled. A GGUF target reaches the
    engines that read safetensors as the Hugging Face folder made from it once (engine/gguf_folder.py), and a
    drafter saved by vLLM's speculators library reaches every engine as its z-lab import (engine/speculators.py)."""
    from pathlib import Path
    if draft_dir is not None and Path(draft_dir).is_dir():
        from .. import speculators
        draft_dir = speculators.imported(Path(draft_dir), progress, engine)
    if engine != "llamacpp" and Path(target_dir).suffix.lower() == ".gguf" and Path(target_dir).is_file():
        from .. import gguf_folder
        target_dir = gguf_folder.hf_folder(Path(target_dir), progress)
    return importlib.import_module(engine_info(engine).package + ".engine").load_pair(
        target_dir, draft_dir, device=device, dtype=dtype, progress=progress, cancelled=cancelled)


def describe(engine: str) -> dict:
    """What an engine runs with here (library versions, devices), or why it cannot run: a package declares,
    its engine module (imported only when the engine's runtime is present) describes."""
    reason = missing_engines().get(engine)
    if reason:
        return {"available": False, "missing": reason, "devices": []}
    return {"available": True, **importlib.import_module(engine_info(engine).package + ".engine").describe()}


# What a loaded pair may declare in its `capabilities` (the loop and the worker read the set, never probe;
# tests/test_engine_contract.py holds every engine's declaration to what its class implements):
CAPABILITIES = {
    "stream": "it drafts and verifies on its own: stream() instead of prefill/draft/verify/commit",
    "stop_drafting": "a streaming pair that can decode the rest of an answer plainly (the loop's fallback)",
    "interrupt": "interrupt() from another thread wakes a stream that waits (cancel); the loop sets `cancelled`",
    "plain_step_s": "plain_step_s: seconds per plain token it measured itself (the fallback starts from it)",
    "close": "close() frees what it holds outside this process's memory (a server, a device) at unload",
    "prepare": "prepare(settings, baseline) gets ready for an answer (starts its server) before the clock starts",
}


class LoadedPair(Protocol):
    """What an engine hands the decode loop. The loop keeps the position, the tokens, the stop rules and
    the statistics; the engine keeps everything that lives on the device (caches, the drafter's
    context, the random generator and the draft distributions), for one generation at a time."""

    info: dict               # engine, device, dtype, name, block_size, max_positions, vocab_size, layers ...
    tokenizer: object | None  # engine.tokenizer.ChatTokenizer, or None (token ids only)
    eos_ids: tuple[int, ...]
    block_size: int          # the drafter's block size; 1 without a drafter
    max_positions: int
    capabilities: frozenset[str]   # names from CAPABILITIES, "stream" never among them

    def prefill(self, prompt: list[int], settings, drafting: bool) -> int:
        """Start a generation: run the prompt from position 0 and return the first token, chosen by the
        settings' sampling rule. drafting: whether draft() will be called in this generation."""

    def draft(self, last: int, pos: int, width: int) -> list[int]:
        """Propose up to width-1 tokens after `last`, which sits at position pos (not yet in the target's
        cache). May return fewer (a confidence cutoff), never more."""

    def verify(self, last: int, pos: int, drafts: list[int]) -> tuple[int, int]:
        """Run the target on [last, *drafts] at positions pos.. and apply the acceptance rule to the drafts
        of the latest draft() (or none). Returns (accepted drafts n, the target's own token after them)."""

    def commit(self, length: int) -> None:
        """Keep positions < length in every cache (attention KV, sliding windows, recurrent and
        convolution state) and forget the rest; the kept new positions feed the drafter's next context."""

    def stop_drafting(self) -> None:
        """draft() will not be called again in this generation (plain fallback): drop drafter context."""

    def memory(self) -> dict:
        """Bytes in use: at least peak_bytes (the process or device peak during the last generation)."""


@dataclass
class Chunk:
    """What a stream hands the loop: tokens as they come and, on the last chunk of an engine that runs its
    own speculative loop (a server), the totals it reports (StreamingPair.stream); engine.loop.StepStream
    makes one per step of a step engine."""
    tokens: list[int]
    drafted: list[bool] | None = None   # per token, when the engine can tell (None: it cannot)
    totals: dict | None = None          # drafted, accepted, steps: each a count, or None if not reported
    fallback: dict | None = None        # the engine runs plain decoding instead of DFlash, and why (as Step)
    seconds: float | None = None        # the step's own time where the engine measures it (a server's timings)
    draft_seconds: float | None = None  # of which the draft pass (a step engine's drafter; None: not drafted)
    proposed: int | None = None         # a step engine's step: drafts offered and accepted (None: not a step)
    accepted: int = 0
    plain: bool | None = None           # the step drafted nothing (None: the stream's mode says)
    stop: str | None = None             # the engine can go no further (context_full)
    method: str | None = None           # the method drafting this answer, where the engine picks it per answer


class StreamingPair(Protocol):
    """An engine that drafts and verifies on its own (llama-server, a remote vLLM/SGLang server) offers
    this instead of prefill/draft/verify/commit; the loop applies the same stop rules, text and stats."""

    info: dict
    tokenizer: object | None
    eos_ids: tuple[int, ...]
    block_size: int
    max_positions: int
    capabilities: frozenset[str]   # "stream" and any others from CAPABILITIES

    def stream(self, prompt: list[int], settings, baseline: bool):
        """A generator of engine.loop.Chunk: tokens as they come, the last chunk with the totals the engine
        reports. The loop closes it (GeneratorExit) to stop early: the engine then cancels its request."""

    def memory(self) -> dict:
        """As LoadedPair.memory."""
