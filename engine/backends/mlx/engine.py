"""The MLX engine's operations for the decode loop (the contract is in engine/backends/__init__.py): an
mlx-lm target, our MLX drafter or n-gram lookup (engine/lookup.py), sampling on the device, caches rolled back
to the accepted prefix after every verify. Every operation runs on the pair's device stream."""
from __future__ import annotations

import json
import os

from pathlib import Path
from typing import Callable

import mlx.core as mx

from ... import draft_vocab
from ...config import GENERATION_METHODS, DraftConfig
from ...errors import Cancelled, CheckpointError, EngineError
from ...limits import GenerationSettings
from ...lookup import NGRAM_BLOCK, Lookup
from ...stats import process_peak_bytes
from ...pairing import check_pair
from ...penalties import History
from ...tokenizer import ChatTokenizer
from .. import architecture
from . import ARCHITECTURES, DTYPES, NAME, VARIANT_DTYPES
from .drafter import MlxDrafter
from .drafter2 import DRAFTERS
from .loading import load_target
from .sampling import Keys, confident_prefix, draw, penalize, probabilities, propose, verify
from .target import MlxTarget

MLX_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
DRAFT_BITS_ENV = "DFLASH_MLX_DRAFT_BITS"   # 4 or 8: quantize the drafter's linear layers (docs/BENCHMARKS.md)


def resolve_device(device: str | None) -> mx.Device:
    """`auto`: Apple's GPU where Metal is there, else the CPU. A named device that is missing is refused
    with the reason, so the caller can offer the CPU instead."""
    device = device or "auto"
    if device == "auto":
        return mx.gpu if mx.metal.is_available() else mx.cpu
    if device in ("gpu", "mps"):
        if not mx.metal.is_available():
            raise EngineError("Apple's GPU (Metal) cannot be used here: it needs macOS on Apple Silicon and the "
                              "Metal build of mlx. Load the model on the CPU instead.", code="device_unavailable")
        return mx.gpu
    if device == "cpu":
        return mx.cpu
    raise EngineError(f"Unknown device {device!r} for the mlx engine: use auto, cpu or gpu.",
                      code="device_unavailable")


def device_class(device: mx.Device) -> str:
    return "apple" if device == mx.gpu else "cpu"


def devices() -> list[dict]:
    """Every device this engine can use here, with what the app shows about it."""
    out = [{"engine": NAME, "device": "cpu", "class": "cpu"}]
    if mx.metal.is_available():
        info = mx.device_info()
        out.append({"engine": NAME, "device": "gpu", "class": "apple", "name": info.get("device_name", ""),
                    "total_memory_bytes": int(info.get("memory_size", 0)),
                    "working_set_bytes": int(info.get("max_recommended_working_set_size", 0))})
    return out


def free_bytes(device: mx.Device) -> int | None:
    """Memory a load may still take: the unified memory's free part, bounded on the GPU by Metal's
    recommended working set."""
    import psutil
    free = int(psutil.virtual_memory().available)
    if device == mx.gpu:
        limit = int(mx.device_info().get("max_recommended_working_set_size", 0)) - mx.get_active_memory()
        free = min(free, limit) if limit > 0 else free
    return free


def check_architecture(target_dir: Path, device: mx.Device) -> tuple[str, dict]:
    """The target's family and config.json, refused before loading when this engine does not run it here."""
    if not (target_dir / "config.json").is_file():
        raise CheckpointError(f"No config.json in target folder {target_dir}. Point to a downloaded model folder.")
    try:
        config = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
        model_type = str(config.get("model_type"))
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{target_dir / 'config.json'} cannot be read as a JSON object ({exc}). "
                              "Re-download the model.") from None
    family = architecture(model_type)
    where = device_class(device)
    if where not in ARCHITECTURES.get(family, ()):
        runs = ", ".join(sorted(a for a, d in ARCHITECTURES.items() if where in d))
        raise CheckpointError(f"The mlx engine does not run {model_type!r} models (it runs {runs}). "
                              "Pick a pair of a supported architecture, or the torch engine.",
                              code="unsupported_architecture")
    return family, config


def draft_bits_from_env() -> int | None:
    value = os.environ.get(DRAFT_BITS_ENV, "").strip()
    if value in ("", "0"):
        return None
    if value not in ("4", "8"):
        raise EngineError(f"{DRAFT_BITS_ENV}={value!r}: use 4 or 8 (bits of the quantized drafter), or leave it unset.",
                          code="bad_settings")
    return int(value)


def load_pair(target_dir, draft_dir=None, device: str | None = "auto", dtype: str | None = None,
              progress: Callable[[str, str], None] | None = None,
              cancelled: Callable[[], bool] = lambda: False, draft_bits: int | None = None) -> "MlxPair":
    """Load and check a pair; draft_dir None gives a target-only pair (plain decoding). Each stage is
    reported to progress(stage, message); a true cancelled() between stages stops the load.
    draft_bits (default: DFLASH_MLX_DRAFT_BITS) quantizes the drafter to 4 or 8 bits."""
    def report(stage: str, message: str) -> None:
        if cancelled():
            raise Cancelled("Loading was cancelled; nothing is loaded.")
        if progress is not None:
            progress(stage, message)
    target_dir = Path(target_dir)
    dev = resolve_device(device)
    if dtype in VARIANT_DTYPES:       # a catalog variant's name (the quantization is the folder's own)
        dtype = VARIANT_DTYPES[dtype]
    if dtype is not None and dtype not in MLX_DTYPES:
        raise EngineError(f"Unknown dtype {dtype!r}: use {', '.join([*MLX_DTYPES, *VARIANT_DTYPES])}.",
                          code="bad_settings")
    mlx_dtype = MLX_DTYPES[dtype or DTYPES[device_class(dev)]]
    family, config = check_architecture(target_dir, dev)
    cfg = DraftConfig.from_file(Path(draft_dir) / "config.json") if draft_dir else None
    bits = draft_bits if draft_bits is not None else draft_bits_from_env()
    report("weights", f"Reading the target's weights from {target_dir.name}")
    with mx.stream(dev):
        model = load_target(target_dir, family, config, mlx_dtype, free_bytes(dev))
        target = MlxTarget(model, config, dev)
        drafter = None
        if cfg is not None:
            check_pair(target, cfg)
            target.capture(cfg.capture_layers(target.num_layers))
            report("drafter", f"Reading the drafter from {Path(draft_dir).name}")
            drafter_class = DRAFTERS[cfg.generation]
            drafter = drafter_class.from_pretrained(draft_dir, dtype=mlx_dtype, available_bytes=free_bytes(dev),
                                                    bits=bits)
    report("tokenizer", "Reading the tokenizer")
    tokenizer = ChatTokenizer.from_folder(target_dir)
    vocab = draft_vocab.load(Path(draft_dir), target.vocab_rows) if drafter is not None else None
    return MlxPair(target, drafter, tokenizer, target_dir.name, family, vocab)


class MlxPair:
    """A loaded pair and the state of its current generation (one at a time)."""

    capabilities = frozenset({"close"})

    def __init__(self, target: MlxTarget, drafter: MlxDrafter | None, tokenizer: ChatTokenizer | None,
                 name: str = "", family: str = "", vocab: draft_vocab.DraftVocab | None = None):
        self.target, self.drafter, self.tokenizer, self.name = target, drafter, tokenizer, name
        # the drafter's frequency ranking (draft_vocab.py), where its generation drafts from one
        self.vocab = draft_vocab.for_generation(vocab, drafter.generation) if drafter is not None else None
        self.draft_vocab = None       # the answer's draft vocabulary size (None: every token), for its stats
        self._subset: tuple[mx.array, mx.array] | None = None   # (ids, the head's rows for them): the last size
        self.device = target.device
        self.eos_ids: tuple[int, ...] = tokenizer.eos_ids if tokenizer else ()
        self.block_size = drafter.config.verify_width if drafter else 1
        self.max_positions = target.max_positions
        dtype = str(target.dtype).removeprefix("mlx.core.")
        quantized = [n for n, m in (("target", target.model), ("drafter", drafter)) if m is not None and _quantized(m)]
        self.info = {"engine": NAME, "device": "gpu" if self.device == mx.gpu else "cpu", "dtype": dtype,
                     "quantized": quantized, "architecture": family, "name": name,
                     "block_size": self.block_size, "has_drafter": drafter is not None,
                     # every pair runs n-gram lookup in blocks of its own when an answer names it; a target
                     # alone decodes plainly by default: on MLX's CPU lookup lost to plain decoding (its verify
                     # costs several steps, docs/BENCHMARKS.md) and Apple's GPU never measured it
                     "methods": ["none", "ngram", *([GENERATION_METHODS[drafter.generation]] if drafter else [])],
                     "method": GENERATION_METHODS[drafter.generation] if drafter else "none",
                     "ngram_block": NGRAM_BLOCK, "drafter_generation": drafter.generation if drafter else None,
                     "has_tokenizer": tokenizer is not None,
                     "chat_template": bool(tokenizer and tokenizer.has_template),
                     "supports_thinking": bool(tokenizer and tokenizer.supports_thinking),
                     "vocab_size": target.vocab_rows, "max_positions": target.max_positions,
                     "layers": target.num_layers, "draft_vocab": len(self.vocab.ranked) if self.vocab else None}
        self._settings = GenerationSettings()
        self._keys = Keys(0)
        self._drafting = False
        self._cutoff = 0.0
        self._context: list[mx.array] = []   # committed positions' features the drafter has not seen
        self._tokens: list[int] = []          # and their tokens (EAGLE-3 reads them beside the features)
        self._verified: tuple[int, mx.array | None] = (0, None)
        self._q: mx.array | None = None       # the last draft's proposal distribution (sampling only)
        self._history = History()             # the tokens the repeat penalty reads
        self._lookup: Lookup | None = None    # n-gram lookup's context, when it drafts this answer

    # -- the operations the loop calls ---------------------------------------------------------------
    def prefill(self, prompt: list[int], settings: GenerationSettings, drafting: bool) -> int:
        with mx.stream(self.device):
            self._settings = settings
            self._keys = Keys(settings.seed)
            lookup = drafting and settings.method == "ngram"
            self._lookup = Lookup(prompt) if lookup else None
            self._drafting = drafting and self.drafter is not None and not lookup
            self._cutoff = settings.draft_cutoff or 0.0   # a GPU verifies whole blocks; a cutoff only when asked
            self._q = None
            self._history = History(prompt, settings.penalized)
            mx.reset_peak_memory()
            self.target.reset()
            logits, feats = self.target.forward(prompt, last_only=True, features=self._drafting)
            self.target.rollback(len(prompt))
            self._context = [feats] if self._drafting else []
            self._tokens = list(prompt) if self._drafting else []
            if self._drafting:
                self.drafter.reset()
            self._use_vocabulary(settings.draft_vocab)
            return self._choose(logits)

    def draft(self, last: int, pos: int, width: int) -> list[int]:
        if self._lookup is not None:      # n-gram lookup: a certain proposal (verify makes its q)
            return self._lookup.propose(width - 1)
        with mx.stream(self.device):
            context = mx.concatenate(self._context) if len(self._context) > 1 else self._context[0]
            tokens, self._context, self._tokens = self._tokens, [], []
            cfg = self.drafter.config
            if self.drafter.generation == 4:    # EAGLE-3: a token per pass, each after the one before
                drafts, q, logits = self.drafter.propose(context, [*tokens[1:], last], self.target.embed,
                                                         self.target.head, width - 1, self._settings, self._keys,
                                                         self.target.vocab_rows)
                return self._keep(drafts, q, logits)
            block = self.target.embed(mx.array([last] + [cfg.mask_token_id] * (cfg.input_width(width) - 1)))
            if cfg.input_embedding_scale != 1.0:
                block = block * cfg.input_embedding_scale
            hidden = self.drafter.hidden(block, context)[cfg.first_draft:]
            if self.drafter.generation == 2:
                return self._draft_path(hidden, last)
            if self._subset is None:
                logits, ids = self.target.head(hidden).astype(mx.float32), None
            else:
                ids, rows = self._subset
                logits = (hidden @ rows.T).astype(mx.float32)
            if self.drafter.generation == 3:    # DSpark: left to right through the Markov head
                drafts, q, logits = self.drafter.propose(logits, last, self._settings, self._keys, ids,
                                                         self.target.vocab_rows)
            else:
                drafts, q = propose(logits, self._settings, self._keys, ids, self.target.vocab_rows)
            return self._keep(drafts, q, logits)

    def _keep(self, drafts: mx.array, q: mx.array | None, logits: mx.array) -> list[int]:
        """The drafts up to the cutoff's confident prefix; their proposal distribution waits for verify."""
        if self._cutoff > 0:
            keep = confident_prefix(logits, q, self._cutoff)
            drafts, q = drafts[:keep], (q[:keep] if q is not None else None)
        self._q = q
        return drafts.tolist()

    def _draft_path(self, hidden: mx.array, last: int) -> list[int]:
        """DFlash2: the candidate selector's path; under sampling its proposal is each row's selector
        distribution over its candidates, zero elsewhere (which the residual rule allows). The cutoff reads
        those distributions."""
        drafts, candidates, rows = self.drafter.propose(hidden, self.target.head(hidden), last, self._settings,
                                                        self._keys)
        keep = confident_prefix(None, rows, self._cutoff) if self._cutoff > 0 else drafts.shape[0]
        q = None
        if not self._settings.greedy:
            q = mx.zeros((drafts.shape[0], self.target.vocab_rows), dtype=mx.float32)
            q[mx.arange(drafts.shape[0])[:, None], candidates] = rows
        self._q = q[:keep] if q is not None else None
        return drafts[:keep].tolist()

    def verify(self, last: int, pos: int, drafts: list[int]) -> tuple[int, int]:
        if self.target.cached_length != pos:
            raise EngineError(f"Internal error: the loop is at position {pos} but the target's cache holds "
                              f"{self.target.cached_length} positions.", code="internal")
        with mx.stream(self.device):
            logits, feats = self.target.forward([last, *drafts], features=self._drafting)
            q = self._q if drafts else None
            if self._lookup is not None and drafts and not self._settings.greedy:
                # q is one at each draft: the residual rule keeps a draft x with probability p(x), else draws from
                # p without x, so sampling stays exact
                q = (mx.arange(logits.shape[-1])[None, :] == mx.array(drafts)[:, None]).astype(mx.float32)
            self._q = None
            n, own = verify(drafts, q, logits, self._settings, self._keys, self._history.windows(last, drafts))
            self._history.advance(last, drafts, n)
            if self._drafting:
                self._tokens += [last, *drafts[:n]]
            if self._lookup is not None:
                self._lookup.extend([*drafts[:n], own])
            self._verified = (pos, feats)
            return n, own

    def commit(self, length: int) -> None:
        with mx.stream(self.device):
            self.target.rollback(length)
            pos, feats = self._verified
            if self._drafting and feats is not None:
                self._context.append(feats[: length - pos])
            self._verified = (0, None)

    def stop_drafting(self) -> None:
        self._drafting, self._context, self._tokens, self._lookup = False, [], [], None

    def _use_vocabulary(self, setting: int | None) -> None:
        """Draft over the ranked tokens the setting chooses (DraftVocab.chosen); the last size's rows are kept."""
        ids = self.vocab.chosen(setting, self.device == mx.cpu) if self.vocab is not None else None
        own = self.drafter.config.own_head_size if self.drafter is not None else None    # EAGLE-3's, where narrower
        self.draft_vocab = len(ids) if ids is not None else own
        if ids is None:
            self._subset = None
        elif self._subset is None or self._subset[0].size != len(ids):
            index = mx.array(ids)
            self._subset = (index, head_rows(self.target, index))

    def close(self) -> None:
        """Give the memory back when the worker drops this pair: the weights, the caches, then MLX's buffer
        cache (on Apple's GPU it otherwise keeps freed buffers for reuse)."""
        self.target = self.drafter = None
        self._context, self._verified, self._q, self._subset = [], (0, None), None, None
        mx.clear_cache()

    def memory(self) -> dict:
        if self.device == mx.gpu:
            return {"peak_bytes": int(mx.get_peak_memory())}
        return {"peak_bytes": process_peak_bytes()}

    # -- helpers -------------------------------------------------------------------------------------
    def _choose(self, logits: mx.array) -> int:
        if self._settings.penalized:
            logits = penalize(logits[-1:], [self._history.tokens], self._settings.repeat_penalty)
        if self._settings.greedy:
            token = int(logits[-1].argmax())
        else:
            token = int(draw(probabilities(logits[-1:], self._settings), self._keys)[0])
        if self._lookup is not None:
            self._lookup.extend([token])
        return token


def head_rows(target: MlxTarget, index: mx.array) -> mx.array:
    """Rows `index` of the target's LM head [K, H] in its compute dtype; a quantized head's rows dequantized."""
    module = target.text.get("lm_head")
    module = target.embedding if module is None else module      # tied embeddings: the embedding is the head
    if getattr(module, "scales", None) is not None:
        biases = getattr(module, "biases", None)
        rows = mx.dequantize(module.weight[index], module.scales[index], None if biases is None else biases[index],
                             group_size=module.group_size, bits=module.bits, mode=getattr(module, "mode", "affine"))
    else:
        rows = module.weight[index]
    return rows.astype(target.dtype)


def _quantized(module) -> bool:
    import mlx.nn as nn
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in module.named_modules())


def describe() -> dict:
    """The engine's library versions and every device it can use here."""
    import mlx_lm
    return {"version": mx.__version__, "mlx_lm_version": mlx_lm.__version__, "devices": devices()}
