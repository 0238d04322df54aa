"""The target side of DFlash around an mlx-lm model: one forward that returns logits and the outputs of
just the chosen decoder layers, and rolling every cache back to the accepted prefix.

The chosen layers are recorded by putting each inside a LayerTap in this model instance's own layer
list (mlx-lm's classes are never patched), so two loaded pairs never share a capture. Rollback by layer
kind is in caches.py (attention, sliding windows) and hybrid.py (Gated DeltaNet)."""
from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import mlx.nn as nn

from ...errors import CheckpointError, PairMismatchError
from .caches import cached_length, commit_caches, make_caches
from .hybrid import DeltaNetRollback


class LayerTap(nn.Module):
    """A decoder layer whose output its target records; every other attribute is the layer's own."""

    def __init__(self, layer: nn.Module, target: "MlxTarget", slot: int):
        super().__init__()
        self.layer = layer
        self._target, self._slot = target, slot

    def __call__(self, x, *args, **kwargs):
        out = self.layer(x, *args, **kwargs)
        self._target.captured[self._slot] = out
        return out

    def __getattr__(self, key: str):
        if key in self:
            return self[key]
        if "layer" not in self:
            raise AttributeError(key)
        return getattr(self["layer"], key)


class MlxTarget:
    def __init__(self, model: nn.Module, config: dict, device: mx.Device):
        self.model = model
        self.device = device
        self.text = model.get("language_model", model)     # multimodal Qwen3.5 wraps its text model
        self.decoder = self.text.get("model")
        layers = self.decoder.get("layers") if self.decoder is not None else None
        self.embedding = self.decoder.get("embed_tokens") if self.decoder is not None else None
        if not isinstance(layers, list) or self.embedding is None:
            raise CheckpointError(f"{type(model).__name__} has no decoder layers or input embedding that DFlash can "
                                  "find; only decoder-only causal LMs are supported as targets.")
        self.layers = layers
        lm_head = self.text.get("lm_head")
        self.head = lm_head if lm_head is not None else self.embedding.as_linear   # tied embeddings
        text_cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        self.num_layers = len(layers)
        self.hidden_size = int(text_cfg["hidden_size"])
        self.vocab_rows = int(self.embedding.weight.shape[0])
        self.max_positions = int(text_cfg.get("max_position_embeddings") or 1 << 30)
        self.dtype = self.decoder["norm"].weight.dtype     # what unquantized weights and activations run in
        self.deltanet, deltanet_layers = DeltaNetRollback.attach(layers, device)
        self._deltanet_layers = deltanet_layers
        self.caches: list = []
        self.captured: list = []
        self._taps: list[tuple[int, nn.Module]] = []
        self._verify_start = 0

    def capture(self, layer_ids: Sequence[int]) -> None:
        """Record the outputs of exactly these decoder layers (0-based) on every forward."""
        for idx, original in self._taps:
            self.layers[idx] = original
        self._taps = []
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise PairMismatchError(
                f"The drafter reads target layers {list(layer_ids)}, but the target has only "
                f"{self.num_layers} layers (0..{self.num_layers - 1}): this drafter belongs to a deeper model.")
        self.captured = [None] * len(layer_ids)
        for slot, idx in enumerate(layer_ids):
            self._taps.append((idx, self.layers[idx]))
            self.layers[idx] = LayerTap(self.layers[idx], self, slot)

    # ---- running -----------------------------------------------------------------------------

    def reset(self) -> None:
        self.caches = make_caches(self.text, self._deltanet_layers)

    @property
    def cached_length(self) -> int:
        return cached_length(self.caches)

    def rollback(self, length: int) -> None:
        """Keep cached positions < length in every layer and forget the rest (rejected draft tokens).
        Called after every forward, also when nothing is rejected."""
        if length > self.cached_length:
            raise ValueError(f"cannot roll forward: {self.cached_length} positions cached, {length} asked for")
        if self.deltanet is not None and self.deltanet.verifying:
            self.deltanet.commit(length - self._verify_start)
        commit_caches(self.caches, length)

    def embed(self, ids: mx.array) -> mx.array:
        return self.embedding(ids)

    def forward(self, ids: list[int], last_only: bool = False, features: bool = True):
        """Run ids after the cached positions. Returns (logits [n or 1, V] float32, features [n, k*H] of the
        captured layers, or None when not asked for or none are captured)."""
        if not self.caches:
            self.reset()
        start = self._verify_start = self.cached_length
        if self.deltanet is not None and start:
            self.deltanet.begin()
        hidden = self.decoder(mx.array([ids]), cache=self.caches)[0]
        logits = self.head(hidden[-1:] if last_only else hidden).astype(mx.float32)
        feats = mx.concatenate(self.captured, axis=-1)[0] if features and self.captured else None
        return logits, feats
