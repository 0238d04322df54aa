"""The DFlash draft checkpoint's config.json, read the way the published z-lab files write it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError

REQUIRED_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "num_hidden_layers", "rms_norm_eps", "vocab_size",
)


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
        layers = int(raw["num_hidden_layers"])
        num_target_layers = raw.get("num_target_layers")
        layer_ids = dflash.get("target_layer_ids")
        if layer_ids is None:
            if num_target_layers is None:
                raise CheckpointError(
                    f"{source} has neither dflash_config.target_layer_ids nor num_target_layers, "
                    "so the target layers to read cannot be known. Use a complete DFlash draft checkpoint.")
            layer_ids = default_target_layer_ids(int(num_target_layers), layers)
        heads = int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or raw["hidden_size"] // heads)
        layer_types = tuple(raw.get("layer_types") or ["full_attention"] * layers)
        if len(layer_types) != layers:
            raise CheckpointError(f"{source}: layer_types lists {len(layer_types)} layers but "
                                  f"num_hidden_layers is {layers}.")
        if int(block_size) < 2:
            raise CheckpointError(f"{source}: block_size must be at least 2, got {block_size}.")
        return cls(
            hidden_size=int(raw["hidden_size"]), intermediate_size=int(raw["intermediate_size"]),
            num_attention_heads=heads, num_key_value_heads=int(raw["num_key_value_heads"]),
            head_dim=head_dim, num_hidden_layers=layers, rms_norm_eps=float(raw["rms_norm_eps"]),
            vocab_size=int(raw["vocab_size"]), block_size=int(block_size), mask_token_id=int(mask_id),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            num_target_layers=None if num_target_layers is None else int(num_target_layers),
            layer_types=layer_types, sliding_window=raw.get("sliding_window"),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)), raw=dict(raw))

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
