"""Our own DFlash drafter: Qwen3-style layers whose keys and values are prefixed with projected target
features, non-causal over the block, no embedding and no LM head (both are the target's).

Weights load by name from a z-lab draft directory; nothing from the checkpoint is executed."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as RMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, rotate_half

from ...config import GENERATION_LABELS, GENERATIONS, DraftConfig
from ...errors import CheckpointError
from ...weights import ByName, bytes_as, check_fits, folder_tensors


def rope_config(cfg: DraftConfig):
    """A transformers Qwen3Config carrying the drafter's rotary settings (rope_scaling or rope_parameters)."""
    from transformers import Qwen3Config
    keep = {k: v for k, v in cfg.raw.items() if k not in ("architectures", "auto_map", "dflash_config")}
    keep.update(head_dim=cfg.head_dim, layer_types=list(cfg.layer_types))
    return Qwen3Config(**keep)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, n, d] with cos/sin [b, n, d]; or x [rows, heads, d] with cos/sin [rows, d]."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _kv(self, x, cos, sin):
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return rope(k, cos, sin), v

    def forward(self, x, ctx, rot_block, rot_ctx, mask):
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)).transpose(1, 2)
        q = rope(q, *rot_block)
        k_blk, v_blk = self._kv(x, *rot_block)
        k_ctx, v_ctx = self._kv(ctx, *rot_ctx)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, ctx, rot_block, rot_ctx, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rot_block, rot_ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(ByName, nn.Module):
    generation = 1        # engine/config.py GENERATIONS
    layer_class = DraftLayer
    unread: tuple[str, ...] = ()    # name prefixes of tensors a checkpoint may carry that decoding does not read

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_class(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(rope_config(cfg))

    def forward(self, block_embeds, block_pos, ctx_features, ctx_pos, masks=None):
        """The training forward (decoding uses DraftRunner, the same maths packed for speed).
        block_embeds [b, n, H] at positions block_pos [b, n]; ctx_features [b, c, k*H] (raw target
        layer outputs) at ctx_pos [b, c]. masks maps layer type -> additive/bool mask over
        (context + block) keys, or None for full attention. Returns normed hidden [b, n, H]."""
        ctx = self.hidden_norm(self.fc(ctx_features))
        rot_block = self.rotary(block_embeds, block_pos)
        rot_ctx = self.rotary(ctx, ctx_pos)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            mask = None if masks is None else masks.get(self.config.layer_types[i])
            x = layer(x, ctx, rot_block, rot_ctx, mask)
        return self.norm(x)

    # ---- checkpoint I/O in the z-lab format -------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", available_bytes: int | None = None) -> "DFlashDrafter":
        """Load by tensor name. The config is checked against the files' headers, and the size against
        available_bytes, before any tensor is allocated or read."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"Drafter folder {path} does not exist. Check the path or download the pair again.")
        cfg = DraftConfig.from_file(path / "config.json")
        if cfg.generation != cls.generation:
            raise CheckpointError(f"{path} holds a generation {cfg.generation} drafter, which {cls.__name__} does "
                                  "not load; load the pair with load_pair, which picks the drafter class.")
        header = {cls.renamed(k): v for k, v in folder_tensors(path).items() if not k.startswith(cls.unread)}
        if cls.layers_in(header) != cfg.num_hidden_layers:
            raise CheckpointError(
                f"{path / 'config.json'}: num_hidden_layers is {cfg.num_hidden_layers} but the weights hold "
                f"{cls.layers_in(header)} layers: config and weights do not belong together. Re-download the drafter.")
        check_fits(bytes_as(header, dtype.itemsize), available_bytes, "The drafter")
        with torch.device("meta"):   # shapes only: nothing is allocated until the names and shapes agree
            shapes = {k: tuple(v.shape) for k, v in cls.shaped(cfg, header).state_dict().items()
                      if not k.startswith("rotary.")}
        missing = sorted(shapes.keys() - header.keys())
        unexpected = sorted(header.keys() - shapes.keys())
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
        model = cls.shaped(cfg, header)
        model.load_state_dict({name: v for k, v in load_safetensors_dir(path).items()
                               if (name := cls.renamed(k)) in shapes}, strict=False)
        return model.placed(device, dtype).eval()

    def placed(self, device, dtype: torch.dtype) -> "DFlashDrafter":
        """The weights in dtype on device, the rotary frequencies kept in float32: Module.to would round
        them to bfloat16 too, and the angles would drift by radians at long positions."""
        self.to(device=device, dtype=dtype)
        self.rotary = Qwen3RotaryEmbedding(rope_config(self.config)).to(device)
        return self

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype if v.is_floating_point() else v.dtype).contiguous().cpu()
                 for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        raw = dict(self.config.raw)
        raw["architectures"] = [next(name for name, gen in GENERATIONS.items() if gen == self.generation)]
        raw.setdefault("model_type", "qwen3")
        raw["torch_dtype"] = str(dtype).removeprefix("torch.")
        (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of every *.safetensors file in a folder (whose headers were checked), with a file that
    fails to read named in the error."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"Weights file {f} is truncated or corrupt ({exc}). "
                                  "Delete it and download it again.") from exc
    return state
