"""Our DFlash drafter in MLX: Qwen3-style layers whose keys and values are prefixed with projected target
features, non-causal over the block (sliding layers: causal inside it), no embedding and no LM head
(both are the target's). The same maths as the torch engine's drafter.py / draft_runner.py; DFlash2's
additions are in drafter2.py.

Weights load by tensor name from a z-lab draft folder, whose config is checked against the files'
headers before anything is allocated; nothing from the checkpoint is executed and nothing is unpickled.
"""
from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from ...config import GENERATION_LABELS, GENERATIONS, DraftConfig
from ...errors import CheckpointError
from ...weights import ByName, bytes_as, check_fits, folder_tensors

# Drafter quantization (an option: DFLASH_MLX_DRAFT_BITS): linear layers whose input width divides by it
QUANT_GROUP = 64


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.scale = d ** -0.5
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, ctx: mx.array, cache: KVCache, rope, mask) -> mx.array:
        """x [1, n, H] the normed block, ctx [1, c, H] the new context rows (positions cache.offset..),
        the block right after them. The context's keys and values stay in the cache; the block's do not."""
        _, n, _ = x.shape
        c = ctx.shape[1]
        rows = mx.concatenate([ctx, x], axis=1)
        q = self.q_norm(self.q_proj(x).reshape(1, n, self.heads, -1)).transpose(0, 2, 1, 3)
        k = self.k_norm(self.k_proj(rows).reshape(1, c + n, self.kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(rows).reshape(1, c + n, self.kv_heads, -1).transpose(0, 2, 1, 3)
        start = cache.offset
        q, k = rope(q, offset=start + c), rope(k, offset=start)
        keys, values = cache.update_and_fetch(k, v)
        cache.trim(n)   # the block's keys are overwritten by the next step's context
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(1, n, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


def block_mask(end: int, n: int, window: int | None, causal: bool) -> mx.array | None:
    """Which of `end` keys the last n (block) queries see: a window of W keeps keys less than W positions away
    (on both sides unless causal), causal keeps keys at or before the query; None: every key."""
    if window is None and not causal:
        return None
    key = mx.arange(end)[None]
    query = mx.arange(end - n, end)[:, None]
    visible = (key <= query) if causal else mx.ones((n, end), dtype=mx.bool_)
    if window is not None:
        visible = visible & (query - key < window) & (key - query < window)
    return visible


def drafter_rope(cfg: DraftConfig):
    """The drafter's rotary embedding, from its config's rope_theta and scaling (either spelling)."""
    raw = cfg.raw
    scaling = raw.get("rope_scaling") or (raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict)
                                          and raw["rope_parameters"].get("rope_type", "default") != "default" else None)
    theta = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    return initialize_rope(cfg.head_dim, base=float(theta), traditional=False, scaling_config=scaling,
                           max_position_embeddings=cfg.max_position_embeddings)


class MlxDrafter(ByName, nn.Module):
    """The drafter's weights (z-lab names) and one generation's context cache."""
    generation = 1
    layer_class = DraftLayer
    unread: tuple[str, ...] = ()    # name prefixes of tensors a checkpoint may carry that decoding does not read

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [self.layer_class(cfg) for _ in range(cfg.num_hidden_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self._rope = drafter_rope(cfg)
        # each layer's mask: its window (None: every position) and whether block rows see only earlier rows
        self._masks = [(cfg.sliding_window if t == "sliding_attention" else None, causal)
                       for t, causal in zip(cfg.layer_types, cfg.causal)]
        self._caches: list[KVCache] = []

    def reset(self) -> None:
        self._caches = [KVCache() for _ in self.layers]

    @property
    def length(self) -> int:
        """Context positions cached so far."""
        return self._caches[0].offset if self._caches else 0

    def hidden(self, block_embeds: mx.array, ctx_features: mx.array) -> mx.array:
        """block_embeds [n, H] at the positions right after the context; ctx_features [c, k*H], the target's
        captured layers at the next c context positions (kept in the cache). Returns final hidden [n, H]."""
        if not self._caches:
            self.reset()
        n = block_embeds.shape[0]
        ctx = self.hidden_norm(self.fc(ctx_features[None]))
        end = self.length + ctx.shape[1] + n
        masks = {kind: block_mask(end, n, *kind) for kind in set(self._masks)}
        x = block_embeds[None]
        for layer, cache, kind in zip(self.layers, self._caches, self._masks):
            x = self._layer(layer, x, ctx, cache, masks[kind])
        return self.norm(x)[0]

    def _layer(self, layer: DraftLayer, x: mx.array, ctx: mx.array, cache: KVCache, mask) -> mx.array:
        x = x + layer.self_attn(layer.input_layernorm(x), ctx, cache, self._rope, mask)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    # ---- checkpoint I/O in the z-lab format -------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: mx.Dtype = mx.float32, available_bytes: int | None = None,
                        bits: int | None = None) -> "MlxDrafter":
        """Load by tensor name; bits (4 or 8) quantizes the linear layers after loading. The config is
        checked against the files' headers, and the size against available_bytes, before any tensor is read."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"Drafter folder {path} does not exist. Check the path or download the pair again.")
        cfg = DraftConfig.from_file(path / "config.json")
        if cfg.generation != cls.generation:     # drafter2.DRAFTERS: the class of each generation
            raise CheckpointError(f"{path} holds a generation {cfg.generation} drafter, which {cls.__name__} does "
                                  "not load.", code="unsupported_architecture")
        header = {cls.renamed(k): v for k, v in folder_tensors(path).items() if not k.startswith(cls.unread)}
        if cls.layers_in(header) != cfg.num_hidden_layers:
            raise CheckpointError(
                f"{path / 'config.json'}: num_hidden_layers is {cfg.num_hidden_layers} but the weights hold "
                f"{cls.layers_in(header)} layers: config and weights do not belong together. Re-download the drafter.")
        check_fits(bytes_as(header, dtype.size), available_bytes, "The drafter")
        model = cls.shaped(cfg, header)
        shapes = {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}
        missing, unexpected = sorted(shapes.keys() - header.keys()), sorted(header.keys() - shapes.keys())
        if missing:
            raise CheckpointError(
                f"Drafter weights in {path} lack {len(missing)} tensors (first: {', '.join(missing[:3])}). "
                f"The checkpoint is incomplete or not a {GENERATION_LABELS[cls.generation]} drafter: re-download it.")
        if unexpected:
            raise CheckpointError(
                f"Drafter weights in {path} hold {len(unexpected)} unknown tensors (first: "
                f"{', '.join(unexpected[:3])}); this drafter architecture is not supported.")
        for name, tensor in header.items():
            if tensor.shape != shapes[name]:
                raise CheckpointError(
                    f"Drafter tensor {name} in {path / tensor.file} has shape {tensor.shape} but config.json "
                    f"implies {shapes[name]}: config and weights do not belong together.")
        weights = {}
        for f in sorted(path.glob("*.safetensors")):
            try:
                weights.update(mx.load(str(f)))
            except (RuntimeError, ValueError, OSError) as exc:
                raise CheckpointError(f"Weights file {f} is truncated or corrupt ({exc}). "
                                      "Delete it and download it again.") from exc
        model.load_weights([(cls.renamed(k), v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v)
                            for k, v in weights.items() if not k.startswith(cls.unread)], strict=True)
        if bits:
            quantize(model, bits)
        mx.eval(model.parameters())
        model.eval()
        return model


def quantize(drafter: MlxDrafter, bits: int) -> None:
    """Quantize the drafter's linear layers (affine, groups of QUANT_GROUP) to 4 or 8 bits. The drafter only
    proposes, so this never changes the output, only how often drafts are accepted."""
    if bits not in (4, 8):
        raise CheckpointError(f"Drafter quantization must be 4 or 8 bits, got {bits}.", code="bad_settings")
    nn.quantize(drafter, group_size=QUANT_GROUP, bits=bits,
                class_predicate=lambda _, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % QUANT_GROUP == 0)


def save_drafter(drafter: MlxDrafter, path: str | Path, dtype: mx.Dtype = mx.bfloat16) -> None:
    """Write the drafter in the z-lab layout (config.json, model.safetensors), for tests and benchmarks."""
    import json
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"),
                        {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
                         for k, v in tree_flatten(drafter.parameters())}, metadata={"format": "mlx"})
    raw = dict(drafter.config.raw)
    raw.setdefault("architectures", [next(n for n, g in GENERATIONS.items() if g == drafter.generation)])
    raw.setdefault("model_type", "qwen3")
    (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
