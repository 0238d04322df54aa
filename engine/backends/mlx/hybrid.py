"""Exact rollback for Gated DeltaNet layers (Qwen3.5 / Qwen3.6 hybrid targets) under mlx-lm.

mlx-lm's GatedDeltaNet writes its convolution window and recurrent state into an ArraysCache, which
cannot be trimmed (mlx-lm's trim_prompt_cache silently does nothing on it). So during a verify each
DeltaNet layer reads the cached state without writing it and keeps the block's delta-rule inputs (the
"tape": the convolution input, normalised keys, values, and the gate inputs a and b); commit then sets
the convolution window to the one after the accepted tokens and replays only their delta-rule steps
(kernels.py), or takes the verify's final state when every token was accepted.

The layers are switched per model instance: each DeltaNet module is put inside a VerifyingDeltaNet on
its own decoder layer, never by patching mlx-lm's class, so two loaded pairs never share state.
Prefills and single tokens run mlx-lm's own forward, which writes the state as usual.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import compute_g, gated_delta_update, normalize_qk

from .kernels import replay


@dataclass
class Tape:
    cache: object            # the layer's ArraysCache: [convolution window, recurrent state]
    layer: nn.Module         # mlx-lm's GatedDeltaNet
    conv_input: mx.array     # [B, K-1+S, C]: the window before the verify, then the block's projections
    k: mx.array              # [B, S, Hk, Dk], normalised
    v: mx.array              # [B, S, Hv, Dv]
    a: mx.array              # [B, S, Hv], gate inputs of the decay g and the write strength beta
    b: mx.array
    final: mx.array          # the state after all S tokens (kept when all are accepted)


class DeltaNetRollback:
    """The DeltaNet layers of one target and the tapes of its current verify."""

    def __init__(self, device: mx.Device):
        self.device = device
        self.verifying = False
        self.tapes: list[Tape] = []

    @classmethod
    def attach(cls, layers: list, device: mx.Device) -> tuple["DeltaNetRollback | None", set[int]]:
        """Wrap the DeltaNet module of every decoder layer that has one; returns the rollback (None when
        the model has no DeltaNet layer) and the indices of those layers."""
        found = {i for i, layer in enumerate(layers) if type(layer.get("linear_attn")).__name__ == "GatedDeltaNet"}
        if not found:
            return None, found
        rollback = cls(device)
        for i in found:
            layers[i].linear_attn = VerifyingDeltaNet(layers[i].linear_attn, rollback)
        return rollback, found

    def begin(self) -> None:
        """Multi-token forwards from here keep tapes instead of writing recurrent states."""
        self.verifying, self.tapes = True, []

    def commit(self, keep: int) -> None:
        """Advance every DeltaNet layer's caches by the first `keep` tokens of the last verify."""
        for tape in self.tapes:
            layer, total = tape.layer, tape.k.shape[1]
            window = layer.conv_kernel_size - 1
            tape.cache[0] = mx.contiguous(tape.conv_input[:, keep:keep + window, :])
            if keep == total:
                tape.cache[1] = tape.final
            elif keep:
                g = compute_g(layer.A_log, tape.a[:, :keep], layer.dt_bias)
                beta = mx.sigmoid(tape.b[:, :keep])
                tape.cache[1] = replay(tape.k[:, :keep], tape.v[:, :keep], g, beta, tape.cache[1], self.device)
        self.verifying, self.tapes = False, []

    def verify_forward(self, m: nn.Module, x: mx.array, cache) -> mx.array:
        """mlx-lm's GatedDeltaNet forward for a cached multi-token call, except that the cache is read but
        not written, and the rule's inputs are kept for commit()."""
        batch, n, _ = x.shape
        qkv = m.in_proj_qkv(x)
        z = m.in_proj_z(x).reshape(batch, n, m.num_v_heads, m.head_v_dim)
        a, b = m.in_proj_a(x), m.in_proj_b(x)
        conv_input = mx.concatenate([cache[0], qkv], axis=1)
        conv_out = nn.silu(m.conv1d(conv_input))
        q, k, v = mx.split(conv_out, [m.key_dim, 2 * m.key_dim], axis=-1)
        q = q.reshape(batch, n, m.num_k_heads, m.head_k_dim)
        k = k.reshape(batch, n, m.num_k_heads, m.head_k_dim)
        v = v.reshape(batch, n, m.num_v_heads, m.head_v_dim)
        q, k = normalize_qk(q, k, inv_scale=m.head_k_dim ** -0.5, eps=1e-6)
        out, final = gated_delta_update(q, k, v, a, b, m.A_log, m.dt_bias, cache[1], None, use_kernel=not m.training)
        self.tapes.append(Tape(cache, m, conv_input, k, v, a, b, final))
        return m.out_proj(m.norm(out, z).reshape(batch, n, -1))


class VerifyingDeltaNet(nn.Module):
    """One decoder layer's GatedDeltaNet, switched to read-not-write while its model verifies."""

    def __init__(self, inner: nn.Module, rollback: DeltaNetRollback):
        super().__init__()
        self.inner = inner
        self._rollback = rollback

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        if not self._rollback.verifying or cache is None or cache[0] is None or x.shape[1] == 1:
            return self.inner(x, mask, cache)
        return self._rollback.verify_forward(self.inner, x, cache)
