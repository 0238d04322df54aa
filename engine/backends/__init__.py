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
DEVICE_CLASSES = ("cuda", "apple", "cpu")
DEVICE_LABELS = {"cuda": "NVIDIA GPU (CUDA)", "apple": "Apple GPU", "cpu": "CPU"}
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
                      int(getattr(mod, "UBATCH", 0)), dict(mod.FORMATS))


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


def auto_engine(target_dir, device: str = "auto", draft_dir=None) -> str:
    """The engine for a load that names "auto" (the app's first start, before the hardware is probed): the
    mlx engine on Apple Silicon where it is installed and runs the pair on Apple's GPU, else the torch
    engine on a GPU, else llama.cpp when it is built here and runs the pair on the CPU (it decodes faster
    there: docs/BENCHMARKS.md), else torch. An engine is taken only for a drafter generation it runs."""
    import json
    from pathlib import Path
    unpacked = _unpackable_gguf(Path(target_dir), draft_dir)
    if unpacked is not None:
        model_type = unpacked                # a GGUF the other engines read once unpacked (engine/gguf_folder.py)
    elif _gguf_only(Path(target_dir)) or (draft_dir is not None and Path(draft_dir).suffix.lower() == ".gguf"):
        return "llamacpp"                    # only llama.cpp reads GGUF; its load explains what else is needed
    else:
        try:
            model_type = str(json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))["model_type"])
        except (OSError, ValueError, KeyError, TypeError):
            return "torch"                   # the torch engine's load explains what is wrong
    generation = 1
    if draft_dir is not None:
        try:
            from ..config import generation_of
            generation = generation_of(json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, AttributeError, EngineError):
            return "torch"                   # the torch engine's load explains what is wrong

    def usable(name: str, device_class: str) -> bool:
        info = ENGINES.get(name)
        return bool(info and info.runs(model_type, device_class) and generation in info.drafter_generations
                    and name not in missing_engines())
    if device == "auto":
        import platform
        import sys
        if sys.platform == "darwin" and platform.machine() == "arm64" and usable("mlx", "apple"):
            return "mlx"
    if device not in ("auto", "cpu"):
        return "torch"
    if device == "auto":
        import torch
        if torch.cuda.is_available() or torch.backends.mps.is_available():
            return "torch"
    # (an unpackable GGUF has no config.json for the layer check; llama.cpp reads its own layers)
    exports = unpacked is not None or _exports_drafter_layers(target_dir, draft_dir)
    return "llamacpp" if usable("llamacpp", "cpu") and exports else "torch"


def _unpackable_gguf(target, draft_dir) -> str | None:
    """The architecture of a GGUF target file that transformers can unpack for torch and MLX, paired with a
    drafter folder (or none); None for anything else."""
    from pathlib import Path
    if not (target.suffix.lower() == ".gguf" and target.is_file()):
        return None
    if draft_dir is not None and not (Path(draft_dir) / "config.json").is_file():
        return None
    from ..gguf_folder import unpackable_architecture
    return unpackable_architecture(target)


def _gguf_only(target) -> bool:
    """A GGUF file, or a folder of GGUF files without a Hugging Face model beside them."""
    if target.suffix.lower() == ".gguf":
        return True
    return target.is_dir() and not (target / "config.json").is_file() and any(target.glob("*.gguf"))


def _exports_drafter_layers(target_dir, draft_dir) -> bool:
    """llama.cpp's graphs cannot hand a drafter the target's last layer (docs/ENGINES.md): a drafter that
    reads it runs on torch instead of failing to load."""
    if draft_dir is None:
        return True
    import json
    from pathlib import Path
    from ..config import DraftConfig
    try:
        layers = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
        return max(DraftConfig.from_file(Path(draft_dir) / "config.json").target_layer_ids) < int(layers) - 1
    except (OSError, ValueError, TypeError, KeyError, EngineError):
        return False


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
    engines that read safetensors as the Hugging Face folder made from it once (engine/gguf_folder.py)."""
    from pathlib import Path
    if engine != "llamacpp" and Path(target_dir).suffix.lower() == ".gguf" and Path(target_dir).is_file():
        from .. import gguf_folder
        target_dir = gguf_folder.hf_folder(Path(target_dir), progress)
    return importlib.import_module(engine_info(engine).package).load_pair(
        target_dir, draft_dir, device=device, dtype=dtype, progress=progress, cancelled=cancelled)


class LoadedPair(Protocol):
    """What an engine hands the decode loop. The loop keeps the position, the tokens, the stop rules and
    the statistics; the engine keeps everything that lives on the device (caches, the drafter's
    context, the random generator and the draft distributions), for one generation at a time."""

    info: dict               # engine, device, dtype, name, block_size, max_positions, vocab_size, layers ...
    tokenizer: object | None  # engine.tokenizer.ChatTokenizer, or None (token ids only)
    eos_ids: tuple[int, ...]
    block_size: int          # the drafter's block size; 1 without a drafter
    max_positions: int

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


class StreamingPair(Protocol):
    """An engine that drafts and verifies on its own (llama-server, a remote vLLM/SGLang server) offers
    this instead of prefill/draft/verify/commit; the loop applies the same stop rules, text and stats."""

    info: dict
    tokenizer: object | None
    eos_ids: tuple[int, ...]
    block_size: int
    max_positions: int

    def stream(self, prompt: list[int], settings, baseline: bool):
        """A generator of engine.loop.Chunk: tokens as they come, the last chunk with the totals the engine
        reports. The loop closes it (GeneratorExit) to stop early: the engine then cancels its request."""

    def memory(self) -> dict:
        """As LoadedPair.memory."""
