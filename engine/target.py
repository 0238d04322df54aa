"""The target side of DFlash around a Hugging Face causal LM: one forward that returns logits and the
outputs of just the chosen layers (forward hooks, never all hidden states), and KV-cache truncation."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .errors import CheckpointError, PairMismatchError
from .packed import pack_linears

GROUPED_SDPA = "grouped_sdpa"  # no "flash" in the name: transformers would take it for a flash kernel


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention copies every key/value head out to the query heads whenever several
    tokens come with a mask, which is every verify of a draft block; torch's CPU kernels take grouped
    heads and a mask together (a 2- to 16-token verify of the demo target costs 5-8% less:
    docs/BENCHMARKS.md, "Step costs"). Single tokens keep transformers' own path, so plain decoding is untouched."""
    if query.shape[2] == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal = attention_mask is None and query.shape[2] == key.shape[2]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                         is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model: nn.Module) -> None:
    """Switch a CPU model on transformers' SDPA attention to grouped_sdpa (other setups keep theirs)."""
    if model.config._attn_implementation != "sdpa" or model.device.type != "cpu":
        return
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    model.set_attn_implementation(GROUPED_SDPA)


class TargetModel:
    def __init__(self, model: nn.Module, capture_layers: Sequence[int] = ()):
        use_grouped_sdpa(model)
        pack_linears(model)
        self.model = model.eval()
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        layers = getattr(self.decoder, "layers", None)
        self.embedding = model.get_input_embeddings()
        self.head = model.get_output_embeddings()
        if layers is None or self.embedding is None or self.head is None:
            raise CheckpointError(
                f"{type(model).__name__} has no decoder layers, input embedding or LM head that DFlash can "
                "find; only decoder-only causal LMs (Qwen3, Llama and similar) are supported as targets.")
        self.layers = layers
        cfg = model.config
        self.num_layers = len(layers)
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_rows = int(self.embedding.weight.shape[0])
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self.device = self.embedding.weight.device
        self.cache = None
        self._captured: list[torch.Tensor | None] = []
        self._hooks = []
        self.capture(capture_layers)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: str = "cpu", capture_layers: Sequence[int] = ()) -> "TargetModel":
        from transformers import AutoModelForCausalLM
        path = Path(path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"No config.json in target folder {path}. Point to a downloaded model folder.")
        if not any(path.glob("*.safetensors")):
            raise CheckpointError(f"No *.safetensors weights in target folder {path}. Re-download the model.")
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True)
        except Exception as exc:  # loaders raise many types (safetensors, config, OS); all mean "unusable"
            raise CheckpointError(f"Target model in {path} could not be loaded ({type(exc).__name__}: {exc}). "
                                  "The files may be corrupt or of an unsupported architecture.") from exc
        return cls(model.to(device), capture_layers)

    def capture(self, layer_ids: Sequence[int]) -> None:
        """Record the outputs of exactly these decoder layers (0-based) on every forward."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise PairMismatchError(
                f"The drafter reads target layers {list(layer_ids)}, but the target has only "
                f"{self.num_layers} layers (0..{self.num_layers - 1}): this drafter belongs to a deeper model.")
        self._captured = [None] * len(layer_ids)
        for slot, idx in enumerate(layer_ids):
            self._hooks.append(self.layers[idx].register_forward_hook(self._recorder(slot)))

    def _recorder(self, slot: int):
        def hook(_module, _inputs, output):
            self._captured[slot] = output[0] if isinstance(output, tuple) else output
        return hook

    # ---- running -----------------------------------------------------------------------------

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    @property
    def cached_length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Forget cached positions >= length (rejected draft tokens)."""
        extra = self.cached_length - length
        if extra > 0:
            self.cache.crop(-extra)  # transformers 5.x: a negative count removes that many tokens

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden).float()

    def forward(self, ids: torch.Tensor, last_only: bool = False, features: bool = True):
        """Run ids [1, n] after the cached positions. Returns (logits [n or 1, V] float32,
        features [n, k*H] of the captured layers, or None when not asked for or none are captured)."""
        if self.cache is None:
            self.reset()
        start = self.cached_length
        pos = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
        out = self.decoder(input_ids=ids, position_ids=pos, past_key_values=self.cache, use_cache=True)
        hidden = out.last_hidden_state[0]
        logits = self.logits(hidden[-1:] if last_only else hidden)
        feats = self.captured_features()[0] if features and self._captured else None
        return logits, feats

    def captured_features(self) -> torch.Tensor:
        """The last forward's captured layer outputs, concatenated: [batch, n, k*H]."""
        return torch.cat(self._captured, dim=-1)

