"""Which engine runs a pair: the policy behind a load that names "auto" (the app's first start, the CLI and
the server by default), the files each engine takes, the llama.cpp-then-torch fallback, and the engines
offered when one crashes. The worker asks here; it holds no engine policy of its own."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError, EngineError, PairMismatchError
from . import ENGINES, LoadedPair, load_pair, missing_engines


def auto_engine(target_dir, device: str = "auto", draft_dir=None) -> str:
    """The engine for a load that names "auto" (the app's first start, before the hardware is probed): the
    mlx engine on Apple Silicon where it is installed and runs the pair on Apple's GPU, else the torch
    engine on a GPU, else llama.cpp when it is built here and runs the pair on the CPU (it decodes faster
    there: docs/BENCHMARKS.md), else torch. An engine is taken only for a drafter generation it runs; a Gemma 4
    assistant drafter folder goes to llama.cpp, the one engine that runs them, and so do a DSpark or EAGLE-3 one the
    torch engine does not compute (another backbone or layout, a head type of its own). A device named by one
    engine's word for it (vulkan, metal: llama.cpp; gpu: MLX) goes to that engine."""
    files = _files_of(Path(target_dir), draft_dir)
    if files is None:
        return "torch"                       # the torch engine's load explains what is wrong
    model_type, generation, llamacpp_only, unpacked = files
    if llamacpp_only:
        return "llamacpp"                    # its load explains what else is needed

    def usable(name: str, device_class: str) -> bool:
        info = ENGINES.get(name)
        return bool(info and info.runs(model_type, device_class) and generation in info.drafter_generations
                    and name not in missing_engines())
    if device == "auto":
        import platform
        import sys
        if sys.platform == "darwin" and platform.machine() == "arm64" and usable("mlx", "apple"):
            return "mlx"
    if device not in ("auto", "cpu"):     # a GPU by its name: the engine that names its devices so (cuda: torch)
        base = device.split(":")[0]
        named = [name for name, info in ENGINES.items() if base in info.devices.values()]
        return "torch" if "torch" in named or not named else named[0]
    if device == "auto" and _torch_may_see_a_gpu():
        import torch
        if torch.cuda.is_available() or torch.backends.mps.is_available():
            return "torch"
    # (an unpackable GGUF has no config.json for the layer check; llama.cpp reads its own layers)
    exports = unpacked or _exports_drafter_layers(target_dir, draft_dir)
    return "llamacpp" if usable("llamacpp", "cpu") and exports else "torch"


def _torch_may_see_a_gpu() -> bool:
    """False where PyTorch's own build says it has no GPU, outside macOS and with no engine pack that could replace
    it, so a llama.cpp load does not import PyTorch (400 MB and seconds) only to ask it. The build is read from
    torch/version.py (parsed, not run: PyPI's Windows wheel is CPU-only without a "+cpu" in its version), else from
    the version in its metadata (a frozen app keeps its modules in an archive)."""
    import sys
    from importlib import metadata

    from .. import packs
    if sys.platform == "darwin" or packs.current().active:
        return True
    built = _torch_build()
    if built is not None:
        return bool(built.get("cuda") or built.get("hip"))
    try:
        return not metadata.version("torch").endswith("+cpu")
    except metadata.PackageNotFoundError:     # neither: ask PyTorch itself
        return True


def _torch_build() -> dict | None:
    """The constants of the installed torch/version.py (cuda, hip, ...), read without importing PyTorch; None where
    there is no such file to read."""
    import ast
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
        source = Path(next(iter(spec.submodule_search_locations or ())), "version.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (ImportError, ValueError, StopIteration, AttributeError, OSError, SyntaxError):
        return None
    found = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
            found[target.id] = node.value.value
    return found if "cuda" in found else None


def runners(target_dir, draft_dir, device_class: str) -> list[str]:
    """Every engine built here that runs these files on this device class, in the engines' order: those a
    first load compares by their speed (engine/fastest.py)."""
    files = _files_of(Path(target_dir), draft_dir)
    if files is None:
        return []
    model_type, generation, llamacpp_only, unpacked = files
    missing = missing_engines()
    out = [name for name, info in ENGINES.items() if name not in missing and info.runs(model_type, device_class)
           and generation in info.drafter_generations and (name == "llamacpp" or not llamacpp_only)]
    if "llamacpp" in out and not (unpacked or _exports_drafter_layers(target_dir, draft_dir)):
        out.remove("llamacpp")
    return out


def _files_of(target: Path, draft_dir) -> tuple[str, int, bool, bool] | None:
    """What engines need to know of a pair's files: the target's model_type, the drafter's generation, whether
    only llama.cpp reads them (GGUF files alone; a Gemma 4 assistant; a DSpark or EAGLE-3 drafter the torch and
    MLX engines do not compute) and whether the target is a GGUF the others unpack. None: unreadable files."""
    unpacked = _unpackable_gguf(target, draft_dir)
    if unpacked is not None:
        model_type = unpacked                # a GGUF the other engines read once unpacked (engine/gguf_folder.py)
    elif _gguf_only(target) or (draft_dir is not None and Path(draft_dir).suffix.lower() == ".gguf"):
        return "", 1, True, False            # only llama.cpp reads GGUF
    else:
        try:
            model_type = str(json.loads((target / "config.json").read_text(encoding="utf-8"))["model_type"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    generation = 1
    if draft_dir is not None:
        try:
            from ..config import DraftConfig, generation_of
            from ..eagle3_config import layout_problem
            from ..weights import folder_tensors
            from .llamacpp.convert import drafter_kind
            drafter = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
            kind = drafter_kind(drafter)
            if kind == "mtp":
                return model_type, 1, True, unpacked is not None     # only llama.cpp runs Gemma 4's assistants
            if kind in ("dspark", "eagle3"):
                try:
                    cfg = DraftConfig.from_dict(drafter)
                except EngineError:
                    return model_type, 1, True, unpacked is not None   # a drafter only llama.cpp computes
                if cfg.eagle3 is not None and layout_problem(cfg, folder_tensors(Path(draft_dir))):
                    return model_type, 1, True, unpacked is not None   # a layout only llama.cpp's converter reads
            generation = generation_of(drafter)
        except (OSError, ValueError, TypeError, AttributeError, EngineError):
            return None
    return model_type, generation, False, unpacked is not None


def _unpackable_gguf(target, draft_dir) -> str | None:
    """The architecture of a GGUF target file that transformers can unpack for torch and MLX, paired with a
    drafter folder (or none); None for anything else."""
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
    from ..config import DraftConfig
    try:
        layers = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
        cfg = DraftConfig.from_file(Path(draft_dir) / "config.json")
        return cfg.eagle3 is not None or max(cfg.target_layer_ids) < int(layers) - 1   # EAGLE-3's it hands over
    except (OSError, ValueError, TypeError, KeyError, EngineError):
        return False


def check_files(engine: str, target, draft) -> None:
    """Refuse, before anything is unloaded, paths the engine cannot take: a folder that does not exist, or a
    file where a folder is needed (llama.cpp takes GGUF files; the other engines unpack a GGUF target)."""
    for what, path in (("target", target), ("drafter", draft)):
        if path is None or Path(path).is_dir():
            continue
        if Path(path).suffix.lower() == ".gguf" and Path(path).is_file() and (engine == "llamacpp" or what == "target"):
            continue
        raise CheckpointError(f"The {what} folder {path} does not exist." if not Path(path).exists()
                              else f"The {what} {path} is a file; give its folder (a GGUF drafter only runs "
                              "with the llama.cpp engine).")


def load_chosen(engine: str, target, draft=None, device: str = "auto", dtype: str | None = None, progress=None,
                cancelled=lambda: False, may_fall_back: bool = False) -> tuple[LoadedPair, str, str | None]:
    """Load with the named engine. may_fall_back: the engine was auto_engine's pick, not the user's, so where
    llama.cpp cannot convert or run the pair (or its server crashes on this CPU) the torch engine runs it
    when it reads the target. Returns the pair, the engine that runs it, and a note when it fell back."""
    check_files(engine, target, draft)
    try:
        return load_pair(engine, target, draft, device=device, dtype=dtype, progress=progress,
                         cancelled=cancelled), engine, None
    except EngineError as exc:
        if not (may_fall_back and engine == "llamacpp" and torch_can_load(target)
                and (isinstance(exc, (CheckpointError, PairMismatchError)) or exc.code == "engine_crashed")):
            raise
        note = f"llama.cpp could not run this pair, so the torch engine runs it. {exc}"
    if progress is not None:
        progress("engine", "llama.cpp could not run this pair; loading it with the torch engine")
    return load_pair("torch", target, draft, device=device, dtype=dtype, progress=progress,
                     cancelled=cancelled), "torch", note


def torch_can_load(target) -> bool:
    """A Hugging Face model folder (config.json), which the torch engine reads, or a GGUF whose architecture
    transformers can unpack into one (engine/gguf_folder.py)."""
    target = Path(target)
    if target.suffix.lower() == ".gguf" and target.is_file():
        return _unpackable_gguf(target, None) is not None
    return target.is_dir() and (target / "config.json").is_file()


def runs_what_was_refused(msg: dict, refused: str) -> list[str]:
    """After an engine refused a load as `unsupported_architecture`, the engine built here that runs the pair, as
    the way out: llama.cpp, whose converter reads drafters the torch and MLX engines do not compute (other EAGLE-3
    layouts, DSpark's own vocabularies, Gemma 4's assistants) and which runs more architectures on the CPU."""
    target, draft = msg.get("target"), msg.get("draft")
    if refused == "llamacpp" or "llamacpp" in missing_engines() or not target:
        return []
    try:
        kind = None
        if draft is not None and Path(draft).is_dir():
            from .llamacpp.convert import drafter_kind
            kind = drafter_kind(json.loads((Path(draft) / "config.json").read_text(encoding="utf-8")))
            if kind is None:
                return []
        if Path(target).is_dir():
            model_type = json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))["model_type"]
            if not ENGINES["llamacpp"].runs(str(model_type), "cpu"):
                return []
        if kind == "dflash" and not _exports_drafter_layers(target, draft):
            return []
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return ["llamacpp"]


def other_engines(info: dict) -> list[str]:
    """Engines besides the one that crashed that run the loaded pair's target from its files here."""
    if not torch_can_load(str(info.get("target") or "")):
        return []
    arch, missing = str(info.get("architecture") or ""), missing_engines()
    return [name for name, e in ENGINES.items() if name != info.get("engine") and name not in missing
            and e.runs(arch, "cpu")]


# a pair in memory takes up to this many times its files' bytes while it loads (a bfloat16 checkpoint in float32,
# a quantized GGUF unpacked by torch takes more, and llama.cpp maps its file once)
LOAD_GROWTH = {"llamacpp": 1.5, "default": 2.5, "gguf_unpacked": 8.0}
KEEP_SHARE = 0.6          # the new pair may take at most this share of the memory free now


def _bytes_of(path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def keeps_loaded_pair(loaded: dict | None, engine: str, target, draft=None, available: int | None = None) -> bool:
    """Whether the pair loaded now stays while another loads, so that a load that fails leaves it working: only
    a pair in the computer's memory (not a GPU's, which two models rarely share), and only when the new pair
    fits beside it in the memory free now. Otherwise it goes first, and a failed load leaves nothing loaded."""
    if loaded is None:
        return False
    if str(loaded.get("device") or "cpu") != "cpu":
        return False
    return fits_in_memory([engine], target, draft, available)


def fits_in_memory(engines: list[str], target, draft=None, available: int | None = None) -> bool:
    """Whether the pair loaded by each of these engines at once fits in the memory free now (engine/fastest.py:
    an engine that cannot hold it alone is not compared; several that fit together are timed turn about)."""
    if available is None:
        import psutil
        available = psutil.virtual_memory().available
    return sum(_load_bytes(engine, target, draft) for engine in engines) <= KEEP_SHARE * available


def _load_bytes(engine: str, target, draft) -> float:
    unpacked = engine != "llamacpp" and Path(target).suffix.lower() == ".gguf"
    growth = LOAD_GROWTH["gguf_unpacked" if unpacked else engine if engine in LOAD_GROWTH else "default"]
    return growth * (_bytes_of(target) + (_bytes_of(draft) if draft else 0))
