"""The DFlash draft checkpoint's config.json, read the way the published z-lab files write it.

This module alone decides a drafter's generation (config.json `architectures`): DFlash (gen 1), DFlash2 (gen 2,
grouped dynamic convolutions and a candidate selector), DSpark (gen 3, DFlash's layers with a Markov head that
biases each block slot's logits by the token drafted before it) or EAGLE-3 (gen 4, SpecForge's layout: one layer
that drafts a token per pass from the target's features and its own last output). Loaders dispatch on
DraftConfig.generation; an architecture we do not know is refused by name."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import speculators
from .dspark_config import DSparkConfig
from .eagle3_config import CHAIN, Eagle3Config
from .errors import CheckpointError
from .weights import config_int, draft_value, real, whole

# config.json `architectures` name -> drafter generation
GENERATIONS = {"DFlashDraftModel": 1, "DFlash2DraftModel": 2, "DSparkDraftModel": 3, "Qwen3DSparkModel": 3,
               "LlamaForCausalLMEagle3": 4, "Eagle3LlamaForCausalLM": 4}
# drafter generation -> the speculation method it drafts for (engine.backends.METHODS)
GENERATION_METHODS = {1: "dflash", 2: "dflash2", 3: "dspark", 4: "eagle3"}
GENERATION_LABELS = {1: "DFlash", 2: "DFlash2", 3: "DSpark", 4: "EAGLE-3"}
LAYER_TYPES = ("full_attention", "sliding_attention")
# dflash_config keys of a DFlash2 drafter. Any other nested key is refused: it may change what the
# drafter computes, and a drafter silently run without it would propose worse tokens.
DFLASH2_KEYS = ("block_size", "mask_token_id", "target_layer_ids", "conv_kernel_size", "conv_group_size",
                "selector_rank", "selector_top_k", "output_multiplier", "final_logit_softcapping",
                "input_embedding_scale")

REQUIRED_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "num_hidden_layers", "rms_norm_eps", "vocab_size",
)
# Upper bounds far above any real drafter, so that a damaged config cannot size a giant model.
LIMITS = {"hidden_size": 1 << 16, "intermediate_size": 1 << 18, "num_attention_heads": 1024,
          "num_key_value_heads": 1024, "num_hidden_layers": 256, "vocab_size": 1 << 23}


def generation_of(raw: dict[str, Any], source: str = "config.json") -> int:
    """1 or 2 from `architectures`; absent means the first DFlash format. Anything else is refused by name. A
    drafter saved by vLLM's speculators library is read as the z-lab config it translates to (its own
    `architectures` may read DFlashDraftModel, but its target layers count from one and its settings sit
    elsewhere, so it must never pass for z-lab's as it is)."""
    if speculators.kind(raw) in speculators.KINDS:
        raw = speculators.translated(raw, source)
    names = raw.get("architectures")
    if names is None:
        return 1
    if not (isinstance(names, list) and len(names) == 1 and isinstance(names[0], str)):
        raise CheckpointError(f"{source}: architectures must name one drafter architecture, got {names!r}. "
                              "Re-download the drafter.")
    name = names[0]
    if name not in GENERATIONS:
        known = ", ".join(f"{n} ({GENERATION_LABELS[g]})" for n, g in GENERATIONS.items())
        raise CheckpointError(
            f"This drafter is a {name} ({source}, architectures), which the torch and MLX engines do not "
            f"compute: they run {known} drafters. Load the pair with the llama.cpp engine, which also converts "
            "Gemma 4's assistants and other EAGLE-3 and DSpark layouts, or pick a drafter of one of those kinds.",
            code="unsupported_architecture")
    return GENERATIONS[name]


@dataclass(frozen=True)
class DFlash2Config:
    """What a DFlash2 drafter adds: the convolution around each sublayer and the candidate selector."""
    conv_kernel_size: int
    conv_group_size: int          # channels per group; the dynamic taps are per group
    selector_rank: int
    selector_top_k: int
    output_multiplier: float
    final_logit_softcapping: float | None   # None: no tanh capping

    @classmethod
    def from_dict(cls, raw: dict[str, Any], hidden: int, vocab: int, source: str) -> "DFlash2Config":
        nested = raw.get("dflash_config") or {}
        unknown = sorted(set(nested) - set(DFLASH2_KEYS))
        if unknown:
            raise CheckpointError(
                f"{source}: dflash_config.{unknown[0]} is not a DFlash2 setting this version knows (it knows "
                f"{', '.join(DFLASH2_KEYS)}). It may change what the drafter computes, so the drafter is refused "
                "rather than run without it. Update DFlash Desktop or pick another drafter.")
        missing = [k for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
                   if draft_value(raw, k) is None]
        if missing:
            raise CheckpointError(f"{source} is a DFlash2 drafter without {', '.join(missing)} (dflash_config). "
                                  "The checkpoint is incomplete: re-download the drafter.")
        group = whole(draft_value(raw, "conv_group_size"), "conv_group_size", source, 1, hidden)
        if hidden % group:
            raise CheckpointError(f"{source}: conv_group_size {group} does not divide hidden_size {hidden}. "
                                  "The file is damaged; re-download it.")
        cap = draft_value(raw, "final_logit_softcapping")
        return cls(
            conv_kernel_size=whole(draft_value(raw, "conv_kernel_size"), "conv_kernel_size", source, 1, 64),
            conv_group_size=group,
            selector_rank=whole(draft_value(raw, "selector_rank"), "selector_rank", source, 1, 1 << 14),
            selector_top_k=whole(draft_value(raw, "selector_top_k"), "selector_top_k", source, 1, min(vocab, 1024)),
            output_multiplier=real(draft_value(raw, "output_multiplier", 1.0), "output_multiplier", source, 0.0, 1e4),
            # the reference caps only when the value is above 0
            final_logit_softcapping=None if cap is None or (type(cap) in (int, float) and cap == 0) else
            real(cap, "final_logit_softcapping", source, 0.0, 1e4))


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Layer choice when the config names none: the middle layer for one, else evenly spaced in [1, L-3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    step = (end - start) / (num_draft_layers - 1)
    return [int(round(start + i * step)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    layer_types: tuple[str, ...]
    sliding_window: int | None
    causal: tuple[bool, ...]        # per layer: block rows see only earlier block rows
    max_position_embeddings: int
    input_embedding_scale: float    # multiplies the target's embedding of the block
    generation: int                 # 1: DFlash, 2: DFlash2, 3: DSpark, 4: EAGLE-3 (GENERATIONS)
    dflash2: DFlash2Config | None   # generation 2 only
    raw: dict[str, Any] = field(repr=False, compare=False)
    dspark: DSparkConfig | None = None   # generation 3 only
    eagle3: Eagle3Config | None = None   # generation 4 only

    @property
    def own_head_size(self) -> int | None:
        """The tokens an EAGLE-3 drafter's own head scores, where fewer than the target's (None: every token)."""
        e = self.eagle3
        return e.draft_vocab_size if e is not None and e.draft_vocab_size < self.vocab_size else None

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose outputs the drafter reads, for a target of this depth (EAGLE-3's default
        depends on it)."""
        return self.eagle3.capture_layers(target_layers) if self.eagle3 is not None else self.target_layer_ids

    @property
    def first_draft(self) -> int:
        """The block slot whose output is the first draft: 0 for DSpark from the anchor, else 1 (slot 0 is the
        last committed token, which the drafter reads but does not predict)."""
        return 0 if self.dspark is not None and self.dspark.sample_from_anchor else 1

    @property
    def verify_width(self) -> int:
        """The widest block the target verifies: the last token and the most drafts one drafter pass makes."""
        return self.block_size + 1 - self.first_draft

    def input_width(self, width: int) -> int:
        """The drafter's block for a verify of `width` (the last token, then width - 1 drafts)."""
        return width - 1 + self.first_draft

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "DraftConfig":
        if speculators.kind(raw) in speculators.KINDS:
            raw = speculators.translated(raw, source)
        generation = generation_of(raw, source)
        missing = [k for k in REQUIRED_KEYS if k not in raw]
        if not isinstance(raw.get("dflash_config") or {}, dict):
            raise CheckpointError(f"{source}: dflash_config must be a JSON object. Re-download the drafter.")
        # an EAGLE-3 drafter drafts a token per pass: its "block" is the chain a step proposes, and it has no mask
        block_size = CHAIN + 1 if generation == 4 else draft_value(raw, "block_size")
        mask_id = 0 if generation == 4 else draft_value(raw, "mask_token_id")
        if block_size is None:
            missing.append("block_size (top level or dflash_config.block_size)")
        if mask_id is None:
            missing.append("dflash_config.mask_token_id")
        if missing:
            raise CheckpointError(
                f"{source} is missing required keys: {', '.join(missing)}. "
                "Is this a DFlash draft checkpoint? Re-download the drafter or pick another one.")
        # Every number is checked before anything is sized from it: a null, a string or 10**6 layers
        # is refused here, with the key and the file named.
        num = {key: config_int(raw, key, source, 1, high) for key, high in LIMITS.items()}
        block_size = whole(block_size, "block_size", source, 2, 64)
        mask_id = whole(mask_id, "dflash_config.mask_token_id", source, 0, 1 << 23)
        layers = num["num_hidden_layers"]
        num_target_layers = raw.get("num_target_layers")
        if num_target_layers is not None:
            num_target_layers = config_int(raw, "num_target_layers", source, 1, 1024)
        layer_ids = draft_value(raw, "target_layer_ids")
        eagle3 = Eagle3Config.from_dict(raw, num["vocab_size"], source) if generation == 4 else None
        if eagle3 is not None:   # which three layers may depend on the target's depth: capture_layers says
            layer_ids = []
        elif layer_ids is None:
            if generation == 2:   # the DFlash2 reference has no fallback either
                raise CheckpointError(f"{source} is a DFlash2 drafter without dflash_config.target_layer_ids. "
                                      "The checkpoint is incomplete: re-download the drafter.")
            if num_target_layers is None:
                raise CheckpointError(
                    f"{source} has neither dflash_config.target_layer_ids nor num_target_layers, "
                    "so the target layers to read cannot be known. Use a complete DFlash draft checkpoint.")
            layer_ids = default_target_layer_ids(num_target_layers, layers)
        if not (isinstance(layer_ids, list) and (layer_ids or eagle3) and len(layer_ids) <= 64
                and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024 for i in layer_ids)):
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids must list layer numbers, got "
                                  f"{layer_ids!r}. Re-download the drafter.")
        heads = num["num_attention_heads"]
        head_dim = config_int(raw, "head_dim", source, 1, 4096) if raw.get("head_dim") else num["hidden_size"] // heads
        layer_types = tuple(raw.get("layer_types") or ["full_attention"] * layers)
        if len(layer_types) != layers:
            raise CheckpointError(f"{source}: layer_types lists {len(layer_types)} layers but "
                                  f"num_hidden_layers is {layers}.")
        strange = [t for t in layer_types if t not in LAYER_TYPES]
        if strange:
            raise CheckpointError(f"{source}: layer_types holds {strange[0]!r}; a drafter layer is one of "
                                  f"{', '.join(LAYER_TYPES)}. Re-download the drafter or pick another one.")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{source}: hidden_act is {act!r}, but DFlash drafters use silu. "
                                  "This drafter is of a kind DFlash Desktop does not run.")
        # The reference's rule: without is_causal, exactly the sliding layers are causal in the block;
        # with it, it decides for every layer (DFlash2 drafters say false).
        is_causal = raw.get("is_causal")
        if is_causal is not None and not isinstance(is_causal, bool):
            raise CheckpointError(f"{source}: is_causal must be true or false, got {is_causal!r}.")
        causal = tuple(t == "sliding_attention" if is_causal is None else is_causal for t in layer_types)
        eps = raw["rms_norm_eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise CheckpointError(f"{source}: rms_norm_eps must be a small positive number, got {eps!r}.")
        window = raw.get("sliding_window")
        if window is not None:
            window = config_int(raw, "sliding_window", source, 1, 1 << 24)
        elif "sliding_attention" in layer_types:
            raise CheckpointError(f"{source} has sliding_attention layers but no sliding_window. "
                                  "Re-download the drafter.")
        scale = real(draft_value(raw, "input_embedding_scale", 1.0), "input_embedding_scale", source, 0.0, 1e4)
        dflash2 = (DFlash2Config.from_dict(raw, num["hidden_size"], num["vocab_size"], source)
                   if generation == 2 else None)
        return cls(
            hidden_size=num["hidden_size"], intermediate_size=num["intermediate_size"],
            num_attention_heads=heads, num_key_value_heads=num["num_key_value_heads"],
            head_dim=head_dim, num_hidden_layers=layers, rms_norm_eps=float(eps),
            vocab_size=num["vocab_size"], block_size=block_size, mask_token_id=mask_id,
            target_layer_ids=tuple(layer_ids), num_target_layers=num_target_layers,
            layer_types=layer_types, sliding_window=window, causal=causal,
            max_position_embeddings=config_int(raw, "max_position_embeddings", source, 1, 1 << 24)
            if "max_position_embeddings" in raw else 32768, input_embedding_scale=scale,
            generation=generation, dflash2=dflash2, raw=dict(raw),
            dspark=DSparkConfig.from_dict(raw, num["vocab_size"], source) if generation == 3 else None,
            eagle3=eagle3)

    @classmethod
    def from_file(cls, path: Path) -> "DraftConfig":
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"No config.json in {Path(path).parent}: this is not a DFlash draft "
                                  "directory. Point to the folder that holds config.json and *.safetensors.")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path} is not valid JSON ({exc}). The file is corrupt: re-download it.")
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path} must hold a JSON object.")
        return cls.from_dict(raw, source=str(path))
