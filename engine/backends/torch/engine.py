"""The torch engine's operations for the decode loop (the contract is in engine/backends/__init__.py):
a Hugging Face target, our drafter packed for decoding, sampling on the device, caches rolled back to
the accepted prefix after every verify."""
from __future__ import annotations

import json

from pathlib import Path
from typing import Callable

import torch

from ...config import DraftConfig
from ...errors import Cancelled, CheckpointError, EngineError
from ...pairing import check_pair
from ...limits import GenerationSettings
from ...stats import process_peak_bytes
from ...tokenizer import ChatTokenizer
from .. import architecture
from . import ARCHITECTURES, DEVICES, DTYPES, NAME, cpu, quantized
from .draft2_runner import Draft2Runner
from .draft_runner import DraftRunner
from .drafter import DFlashDrafter
from .drafter2 import DFlash2Drafter
from .sampling import Candidates, draw, probabilities, propose, verify
from .target import TargetModel

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# drafter generation (engine/config.py) -> the module that loads it and the runner that decodes with it
DRAFTERS = {1: (DFlashDrafter, DraftRunner), 2: (DFlash2Drafter, Draft2Runner)}


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
    drafter = None
    if cfg is not None:
        check_pair(target, cfg)
        target.capture(cfg.target_layer_ids)
        report("drafter", f"Reading the drafter from {Path(draft_dir).name}")
        drafter_class, _ = DRAFTERS[cfg.generation]
        drafter = drafter_class.from_pretrained(draft_dir, dtype=torch_dtype, device=dev,
                                                available_bytes=free_bytes(dev))
    report("tokenizer", "Reading the tokenizer")
    tokenizer = ChatTokenizer.from_folder(target_dir)
    report("tuning", "Preparing the model for this device")
    if dev.type == "cuda":   # static caches and CUDA graphs where the architecture allows (cuda.py)
        from . import cuda
        if cuda.supported(family):
            pair = cuda.CudaPair(target, drafter, tokenizer, target_dir.name, family)
            report("tuning", "Compiling and capturing the GPU's steps (once per load)")
            pair.warm_up()
            return pair
    return TorchPair(target, drafter, tokenizer, target_dir.name, family)


class TorchPair:
    """A loaded pair and the state of its current generation (one at a time)."""

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, tokenizer: ChatTokenizer | None,
                 name: str = "", family: str = ""):
        self.target, self.drafter, self.tokenizer, self.name = target, drafter, tokenizer, name
        self.device = target.device
        on_cpu = self.device.type == "cpu"
        if on_cpu:
            cpu.tune_target(target.model)
        self.eos_ids: tuple[int, ...] = tokenizer.eos_ids if tokenizer else ()
        self.block_size = drafter.config.block_size if drafter else 1
        self.max_positions = target.max_positions
        self.runner = (DRAFTERS[drafter.generation][1](drafter, target.head.weight,
                                                       cpu.draft_dtype() if on_cpu else None)
                       if drafter else None)
        self.auto_cutoff = cpu.DRAFT_CUTOFF if on_cpu else 0.0
        self.info = {"engine": NAME, "device": str(self.device),
                     "dtype": target.quantization or str(target.embedding.weight.dtype).removeprefix("torch."),
                     "architecture": family or getattr(target.model.config, "model_type", ""),
                     "name": name, "block_size": self.block_size, "has_drafter": drafter is not None,
                     "drafter_generation": drafter.generation if drafter else None,
                     "has_tokenizer": tokenizer is not None,
                     "chat_template": bool(tokenizer and tokenizer.has_template),
                     "supports_thinking": bool(tokenizer and tokenizer.supports_thinking),
                     "vocab_size": target.vocab_rows, "max_positions": target.max_positions,
                     "layers": target.num_layers}
        self._settings = GenerationSettings()
        self._gen: torch.Generator | None = None
        self._drafting = False
        self._cutoff = 0.0
        self._context: list[torch.Tensor] = []   # committed positions' features the drafter has not seen
        self._verified: tuple[int, torch.Tensor | None] = (0, None)   # (position, features) of the last verify
        self._q: torch.Tensor | Candidates | None = None   # the last draft's proposal distribution (sampling)

    # -- the operations the loop calls ---------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompt: list[int], settings: GenerationSettings, drafting: bool) -> int:
        self._settings = settings
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(settings.seed) if settings.seed is not None else self._gen.seed()
        self._drafting = drafting and self.runner is not None
        self._cutoff = self.auto_cutoff if settings.draft_cutoff is None else settings.draft_cutoff
        self._q = None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.target.reset()
        logits, feats = self.target.forward(torch.tensor([prompt], device=self.device), last_only=True,
                                            features=self._drafting)
        self.target.rollback(len(prompt))   # nothing to forget; ends the caches' recording of this forward
        self._context = [feats] if self._drafting else []
        if self._drafting:
            self.runner.reset()
        return self._choose(logits[-1:])

    @torch.inference_mode()
    def draft(self, last: int, pos: int, width: int) -> list[int]:
        context = torch.cat(self._context) if len(self._context) > 1 else self._context[0]
        self._context = []
        cfg = self.runner.config
        block = torch.full((width,), cfg.mask_token_id, dtype=torch.long, device=self.device)
        block[0] = last
        embeds = self.target.embed(block)
        if cfg.input_embedding_scale != 1.0:
            embeds = embeds * cfg.input_embedding_scale
        if cfg.generation == 2:   # one path picked by the candidate selector; the cutoff reads its distributions
            drafts, q, rows = self.runner.propose(embeds, context, last, self._settings, self._gen)
            confidence = (None, rows)
        else:
            logits = self.runner.logits(embeds, context)
            drafts, q = propose(logits, self._settings, self._gen)
            confidence = (logits, q)
        if self._cutoff > 0:
            keep = cpu.confident_prefix(*confidence, self._cutoff)
            drafts, q = drafts[:keep], (q[:keep] if q is not None else None)
        self._q = q
        return drafts.tolist()

    @torch.inference_mode()
    def verify(self, last: int, pos: int, drafts: list[int]) -> tuple[int, int]:
        if self.target.cached_length != pos:
            raise EngineError(f"Internal error: the loop is at position {pos} but the target's cache holds "
                              f"{self.target.cached_length} positions.", code="internal")
        block = torch.tensor([[last, *drafts]], device=self.device)
        logits, feats = self.target.forward(block, features=self._drafting)
        q = self._q if drafts else None
        self._q = None
        n, own = verify(block[0, 1:], q, logits, self._settings, self._gen)
        self._verified = (pos, feats)
        return n, own

    @torch.inference_mode()
    def commit(self, length: int) -> None:
        self.target.rollback(length)
        pos, feats = self._verified
        if self._drafting and feats is not None:
            self._context.append(feats[: length - pos])
        self._verified = (0, None)

    def stop_drafting(self) -> None:
        self._drafting, self._context = False, []

    def memory(self) -> dict:
        if self.device.type == "cuda":
            return {"peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                    "reserved_bytes": int(torch.cuda.memory_reserved(self.device))}
        return {"peak_bytes": process_peak_bytes()}

    # -- helpers -------------------------------------------------------------------------------------
    def _choose(self, logits: torch.Tensor) -> int:
        if self._settings.greedy:
            return int(logits[-1].argmax())
        return int(draw(probabilities(logits, self._settings), self._gen)[0])
