"""Loading a target with mlx-lm's own model classes, from an MLX repo (bf16, or quantized: mlx-community
`-4bit` / `-8bit`) or a Hugging Face folder mlx-lm can read.

Before mlx-lm builds anything: the architecture is one this engine rolls back exactly (the class comes
from our table, never from a name in the folder), the folder asks for none of its own code (mlx-lm's
`model_file`), its config agrees with the safetensors headers and fits in memory (engine/weights.py),
and where mlx-lm ignores a config key the folder relies on, the load is refused rather than run wrong.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from ...errors import CheckpointError
from ...weights import check_target

# our family name -> mlx-lm's module of that architecture
MODULES = {"qwen3": "qwen3", "llama": "llama", "qwen3_moe": "qwen3_moe", "qwen3_5": "qwen3_5",
           "qwen3_5_moe": "qwen3_5_moe", "gpt_oss": "gpt_oss"}


def load_target(folder: Path, family: str, config: dict, dtype: mx.Dtype, available: int | None) -> nn.Module:
    """The target model with its unquantized weights in dtype (quantized ones stay packed)."""
    from mlx_lm.utils import load_model
    if "model_file" in config:
        raise CheckpointError(f"{folder / 'config.json'} asks to build the model with code from the folder "
                              f"({config['model_file']!r}); the app never runs a model folder's code. Use a model "
                              "that mlx-lm's own classes can load.")
    check_target(folder, dtype.size, available)
    if not list(folder.glob("model*.safetensors")):
        raise CheckpointError(f"{folder} holds no model*.safetensors files, the names mlx-lm reads. "
                              "Re-download the model or convert it with mlx_lm.convert.")
    overrides = config_overrides(family, config, folder)
    module = importlib.import_module(f"mlx_lm.models.{MODULES[family]}")
    try:
        model, _ = load_model(folder, lazy=True, strict=True, model_config=overrides,
                              get_model_classes=lambda config: (module.Model, module.ModelArgs), trust_remote_code=False)
    except Exception as exc:  # mlx-lm raises ValueError, KeyError, TypeError, RuntimeError for unusable folders
        raise CheckpointError(f"Target model in {folder} could not be loaded by mlx-lm ({type(exc).__name__}: {exc}). "
                              "The files may be corrupt or of an unsupported variant.") from exc
    cast(model, dtype)
    mx.eval(model.parameters())
    return model


def cast(model: nn.Module, dtype: mx.Dtype) -> None:
    """Floating weights to dtype, except those the architecture keeps in full precision (its cast_predicate,
    e.g. Qwen3.5's A_log)."""
    castable = getattr(model, "cast_predicate", None) or (lambda _: True)
    model.update(tree_map_with_path(
        lambda path, v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and castable(path) else v,
        model.parameters()))


def config_overrides(family: str, config: dict, folder: Path) -> dict:
    """Keys mlx-lm's classes read in an older spelling than the folder's config.json uses; without them
    the model would load and silently run as another model.

    - transformers 5 writes rope_theta and rope_scaling inside rope_parameters; mlx-lm's Llama, Qwen3-MoE
      and gpt-oss classes read them at the top level only.
    - mlx-lm's Qwen3.5 places its DeltaNet layers by full_attention_interval (default 4) and ignores
      layer_types, which transformers 5 writes alone."""
    out = {}
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" not in config and "rope_theta" in rope:
            out["rope_theta"] = rope["rope_theta"]
        if "rope_scaling" not in config and rope.get("rope_type", "default") != "default":
            out["rope_scaling"] = rope
    if family in ("qwen3_5", "qwen3_5_moe"):
        nested = isinstance(config.get("text_config"), dict)
        text = config["text_config"] if nested else config
        interval = deltanet_interval(text, folder)
        if interval is not None and interval != text.get("full_attention_interval", 4):
            out.update({"text_config": {**text, "full_attention_interval": interval}} if nested
                       else {"full_attention_interval": interval})
    return out


def deltanet_interval(text: dict, folder: Path) -> int | None:
    """The full_attention_interval that lays out layer_types (None without layer_types); a layout no
    interval makes is refused."""
    types = text.get("layer_types")
    if types is None:
        return None
    for interval in range(1, len(types) + 1):
        if list(types) == ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(len(types))]:
            return interval
    raise CheckpointError(f"{folder / 'config.json'}: layer_types is not one full-attention layer after every k "
                          "DeltaNet layers, the only layout mlx-lm builds. This checkpoint cannot run on the mlx "
                          "engine; use the torch engine.", code="unsupported_architecture")
