"""The DFlash draft checkpoint's config.json, read the way the published z-lab files write it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .weights import config_int, whole

REQUIRED_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "num_hidden_layers", "rms_norm_eps", "vocab_size",
)
# Upper bounds far above any real drafter, so that a damaged config cannot size a giant model.
LIMITS = {"hidden_size": 1 << 16, "intermediate_size": 1 << 18, "num_attention_heads": 1024,
          "num_key_value_heads": 1024, "num_hidden_layers": 256, "vocab_size": 1 << 23}


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
    max_position_embeddings: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "DraftConfig":
        missing = [k for k in REQUIRED_KEYS if k not in raw]
        dflash = raw.get("dflash_config") or {}
        block_size = dflash.get("block_size", raw.get("block_size"))
        mask_id = dflash.get("mask_token_id", raw.get("mask_token_id"))
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
        layer_ids = dflash.get("target_layer_ids")
        if layer_ids is None:
            if num_target_layers is None:
                raise CheckpointError(
                    f"{source} has neither dflash_config.target_layer_ids nor num_target_layers, "
                    "so the target layers to read cannot be known. Use a complete DFlash draft checkpoint.")
            layer_ids = default_target_layer_ids(num_target_layers, layers)
        if not (isinstance(layer_ids, list) and layer_ids and len(layer_ids) <= 64
                and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024 for i in layer_ids)):
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids must list layer numbers, got "
                                  f"{layer_ids!r}. Re-download the drafter.")
        heads = num["num_attention_heads"]
        head_dim = config_int(raw, "head_dim", source, 1, 4096) if raw.get("head_dim") else num["hidden_size"] // heads
        layer_types = tuple(raw.get("layer_types") or ["full_attention"] * layers)
        if len(layer_types) != layers:
            raise CheckpointError(f"{source}: layer_types lists {len(layer_types)} layers but "
                                  f"num_hidden_layers is {layers}.")
        eps = raw["rms_norm_eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise CheckpointError(f"{source}: rms_norm_eps must be a small positive number, got {eps!r}.")
        window = raw.get("sliding_window")
        if window is not None:
            window = config_int(raw, "sliding_window", source, 1, 1 << 24)
        return cls(
            hidden_size=num["hidden_size"], intermediate_size=num["intermediate_size"],
            num_attention_heads=heads, num_key_value_heads=num["num_key_value_heads"],
            head_dim=head_dim, num_hidden_layers=layers, rms_norm_eps=float(eps),
            vocab_size=num["vocab_size"], block_size=block_size, mask_token_id=mask_id,
            target_layer_ids=tuple(layer_ids), num_target_layers=num_target_layers,
            layer_types=layer_types, sliding_window=window,
            max_position_embeddings=config_int(raw, "max_position_embeddings", source, 1, 1 << 24)
            if "max_position_embeddings" in raw else 32768, raw=dict(raw))

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
