"""The target side of DFlash around a Hugging Face causal LM: one forward that returns logits and the
outputs of just the chosen layers (forward hooks, never all hidden states), and rolling every cache
back to the accepted prefix.

Rollback by layer kind: full attention crops its keys and values; sliding-window attention and the
DeltaNet convolution window record their history until the next crop (transformers' past recording),
so a crop is exact even once the window is full; DeltaNet recurrent state is replayed (hybrid.py).
After every forward the cache is cropped, to the accepted length or by nothing, which also drops
the recorded history that is no longer needed."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from ...errors import CheckpointError, PairMismatchError
from ...weights import check_target
from . import quantized
from .hybrid import DeltaNetRollback


class TargetModel:
    def __init__(self, model: nn.Module, capture_layers: Sequence[int] = ()):
        self.model = model.eval()
        self.decoder = model.get_decoder()   # the text decoder, also inside multimodal models
        layers = getattr(self.decoder, "layers", None)
        self.embedding = model.get_input_embeddings()
        self.head = model.get_output_embeddings()
        if layers is None or self.embedding is None or self.head is None:
            raise CheckpointError(
                f"{type(model).__name__} has no decoder layers, input embedding or LM head that DFlash can "
                "find; only decoder-only causal LMs (Qwen3, Llama and similar) are supported as targets.")
        self.layers = layers
        cfg = model.config.get_text_config()
        self.num_layers = len(layers)
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_rows = int(self.embedding.weight.shape[0])
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        # Gemma-style tanh capping happens in the model's forward, not in its output embedding
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.device = self.embedding.weight.device
        self.deltanet = DeltaNetRollback.attach(model)
        self.quantization: str | None = None   # "int8" or "nf4" when from_pretrained loaded it quantized
        self.cache = None
        self._verify_start = 0
        self._captured: list[torch.Tensor | None] = []
        self._hooks = []
        self.capture(capture_layers)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
                        capture_layers: Sequence[int] = (), available_bytes: int | None = None,
                        quantize: str | None = None) -> "TargetModel":
        """Load with transformers' own classes, never with code from the folder; the config is checked
        against the weights' headers and the size against available_bytes first (engine/weights.py).
        quantize "int8" or "nf4" quantizes the decoder's linear layers while loading (quantized.py); a
        pre-quantized bitsandbytes folder loads quantized whatever quantize says."""
        from transformers import AutoModelForCausalLM
        path = Path(path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"No config.json in target folder {path}. Point to a downloaded model folder.")
        check_target(path, dtype.itemsize, available_bytes, quantized.QUANTIZED.get(quantize))
        bnb = quantize or quantized.prequantized(path)
        extra = {}
        if bnb:      # bitsandbytes places the weights itself while quantizing: they cannot be moved after
            quantized.require(torch.device(device), f"A target quantized to {bnb}")
            extra["device_map"] = {"": str(device)}
            if quantize:
                extra["quantization_config"] = quantized.loading_config(quantize, dtype)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True,
                                                         trust_remote_code=False, **extra)
        except Exception as exc:  # loaders raise many types (safetensors, config, OS); all mean "unusable"
            raise CheckpointError(f"Target model in {path} could not be loaded ({type(exc).__name__}: {exc}). "
                                  "The files may be corrupt or of an unsupported architecture.") from exc
        target = cls(model if bnb else model.to(device), capture_layers)
        target.quantization = bnb
        return target

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
        self.capture_ids = list(layer_ids)
        for slot, idx in enumerate(layer_ids):
            self._hooks.append(self.layers[idx].register_forward_hook(self._recorder(slot)))

    def _recorder(self, slot: int):
        def hook(_module, _inputs, output):
            self._captured[slot] = output[0] if isinstance(output, tuple) else output
        return hook

    # ---- running -----------------------------------------------------------------------------

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cache.activate_past_recording()

    @property
    def cached_length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def rollback(self, length: int) -> None:
        """Keep cached positions < length in every layer and forget the rest (rejected draft tokens).
        Called after every forward, also when nothing is rejected."""
        extra = self.cached_length - length
        if extra < 0:
            raise ValueError(f"cannot roll forward: {self.cached_length} positions cached, {length} asked for")
        if self.deltanet is not None:
            self.deltanet.commit(self.cache, length - self._verify_start)
        self.cache.crop(-extra)  # transformers 5.x: a negative count removes that many tokens

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        return logits if not self.softcap else torch.tanh(logits / self.softcap) * self.softcap

    def forward(self, ids: torch.Tensor, last_only: bool = False, features: bool = True):
        """Run ids [1, n] after the cached positions. Returns (logits [n or 1, V] float32,
        features [n, k*H] of the captured layers, or None when not asked for or none are captured)."""
        if self.cache is None:
            self.reset()
        start = self._verify_start = self.cached_length
        pos = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
        recording = self.deltanet.verify() if self.deltanet is not None and start else nullcontext()
        with recording:
            out = self.decoder(input_ids=ids, position_ids=pos, past_key_values=self.cache, use_cache=True)
        hidden = out.last_hidden_state[0]
        logits = self.logits(hidden[-1:] if last_only else hidden)
        feats = self.captured_features()[0] if features and self._captured else None
        return logits, feats

    def captured_features(self) -> torch.Tensor:
        """The last forward's captured layer outputs, concatenated: [batch, n, k*H]."""
        return torch.cat(self._captured, dim=-1)
