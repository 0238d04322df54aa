"""Small randomly initialised targets (mlx-lm's own model classes) and drafters, built in memory or on
disk, for tests and benchmarks. No download: the weights are random, so only speed and exactness can
be judged."""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_map_with_path

from engine.config import DraftConfig
from engine.backends.mlx.drafter import MlxDrafter
from engine.backends.mlx.loading import MODULES, cast
from engine.backends.mlx.target import MlxTarget

# One stand-in per architecture the engine claims; each mixes the kinds of layer its family does.
VARIANTS = tuple(MODULES)


def target_config(arch: str = "qwen3", vocab: int = 256, hidden: int = 64, layers: int = 6, heads: int = 4,
                  kv_heads: int = 2, max_positions: int = 512, window: int = 16) -> dict:
    """A config.json (mlx-lm / Hugging Face keys) of a small model of this architecture."""
    head_dim = hidden // heads
    common = dict(model_type=arch, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  intermediate_size=3 * hidden, max_position_embeddings=max_positions, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=False)
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=hidden // 2, decoder_sparse_step=1,
               mlp_only_layers=[], norm_topk_prob=True)
    if arch in ("qwen3", "llama"):
        return common
    if arch == "qwen3_moe":
        return {**common, **moe}
    if arch in ("qwen3_5", "qwen3_5_moe"):
        hybrid = dict(head_dim=2 * head_dim, linear_conv_kernel_dim=4, linear_key_head_dim=head_dim,
                      linear_value_head_dim=head_dim, linear_num_key_heads=kv_heads, linear_num_value_heads=heads,
                      full_attention_interval=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                       "mrope_section": [2, 1, 1]})
        extra = {**moe, "shared_expert_intermediate_size": hidden // 2} if arch == "qwen3_5_moe" else {}
        return {**common, **hybrid, **extra}
    if arch == "gpt_oss":
        rope = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": max_positions // 4}
        return {**common, "rope_theta": 150000.0, "rope_scaling": rope, "sliding_window": window,
                "intermediate_size": hidden, "num_local_experts": 8, "num_experts_per_tok": 2,
                "layer_types": [["sliding_attention", "full_attention"][i % 2] for i in range(layers)]}
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(VARIANTS)}")


def random_model(config: dict, seed: int = 0, dtype: mx.Dtype = mx.float32) -> nn.Module:
    """mlx-lm's model for the config, with random weights of a scale that makes logits differ."""
    import importlib
    module = importlib.import_module(f"mlx_lm.models.{MODULES[config['model_type']]}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(dict(config)))
    model.update(tree_map_with_path(_random_weight, model.parameters()))
    cast(model, dtype)
    mx.eval(model.parameters())
    return model


def _random_weight(path: str, p: mx.array) -> mx.array:
    """Unit-variance embeddings (so that tokens differ clearly) and matrices scaled by their input width."""
    if p.ndim < 2:
        return p
    return mx.random.normal(p.shape) * (1.0 if path.endswith("embed_tokens.weight") else 0.5 / p.shape[-1] ** 0.5)


def random_target(arch: str = "qwen3", seed: int = 0, **sizes) -> MlxTarget:
    config = target_config(arch, **sizes)
    return MlxTarget(random_model(config, seed), config, mx.cpu)


def draft_config_dict(target: MlxTarget, layers: int = 1, block_size: int = 16, mask_token_id: int | None = None,
                      target_layer_ids=None) -> dict:
    """A z-lab style drafter config for this target."""
    n = target.num_layers
    if target_layer_ids is None:
        target_layer_ids = sorted({min(i, n - 1) for i in (1, n // 2, n - 2)})
    h = target.hidden_size
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h,
            "intermediate_size": 3 * h, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": h // 4,
            "num_hidden_layers": layers, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
            "rope_theta": 10000.0, "max_position_embeddings": target.max_positions, "vocab_size": target.vocab_rows,
            "num_target_layers": n, "dflash_config": {
                "mask_token_id": target.vocab_rows - 1 if mask_token_id is None else mask_token_id,
                "target_layer_ids": list(target_layer_ids), "block_size": block_size}}


def random_drafter(target: MlxTarget, seed: int = 1, **kwargs) -> MlxDrafter:
    cfg = DraftConfig.from_dict(draft_config_dict(target, **kwargs))
    mx.random.seed(seed)
    drafter = MlxDrafter(cfg)
    drafter.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else p,
                            drafter.parameters()))
    drafter.set_dtype(target.dtype)
    mx.eval(drafter.parameters())
    target.capture(cfg.target_layer_ids)
    return drafter


def random_pair(arch: str = "qwen3", seed: int = 0, eos_ids=(), draft_layers: int = 1, block_size: int = 16,
                head_scale: float = 1.0, draft_vocab=None, **sizes):
    """A loaded pair (as the engine hands it to the loop) of a random target and drafter, no tokenizer.
    head_scale > 1 sharpens the target's distributions."""
    from engine.backends.mlx.engine import MlxPair
    target = random_target(arch, seed=seed, **sizes)
    head = target.text["lm_head"]
    head.weight = head.weight * head_scale
    drafter = random_drafter(target, seed=seed + 1, layers=draft_layers, block_size=block_size)
    pair = MlxPair(target, drafter, None, name=f"random-{arch}", family=arch, vocab=draft_vocab)
    pair.eos_ids = tuple(eos_ids)
    return pair


def save_model(model: nn.Module, config: dict, path: Path, quantize_bits: int | None = None,
               group_size: int = 32) -> None:
    """Write an MLX model folder as mlx-lm writes one (config.json, model.safetensors), optionally quantized
    the way mlx-community's -4bit / -8bit repos are."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = dict(config)
    if quantize_bits:
        nn.quantize(model, group_size=group_size, bits=quantize_bits)
        config["quantization"] = {"group_size": group_size, "bits": quantize_bits, "mode": "affine"}
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
