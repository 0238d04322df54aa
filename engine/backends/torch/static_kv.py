"""The CUDA engine's key/value cache: one preallocated buffer per attention layer, written at positions held in
a device tensor, so every step has a fixed shape that a CUDA graph can capture (cuda.py)."""
from __future__ import annotations

import torch


class StaticKV:
    """Keys and values of every attention layer in buffers [1, kv_heads, size, d], written at `start`
    (a device tensor) on each forward. What transformers' attention layers call: update()."""

    def __init__(self, size: int, device: torch.device):
        self.size = size
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        self.offsets = torch.arange(size, device=device)
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rows = size           # the rows the attention of the forward being run reads (fixed per graph)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx not in self.layers:   # the first (prefill) forward allocates, never a captured one
            self.layers[layer_idx] = tuple(x.new_zeros(*x.shape[:2], self.size, x.shape[-1]) for x in (keys, values))
        k_all, v_all = self.layers[layer_idx]
        where = self.start + self.offsets[: keys.shape[2]]
        k_all.index_copy_(2, where, keys)
        v_all.index_copy_(2, where, values)
        return k_all[:, :, :self.rows], v_all[:, :, :self.rows]
