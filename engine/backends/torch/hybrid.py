"""Exact rollback for Gated DeltaNet layers (Qwen3.5 / Qwen3.6 hybrid targets).

A verify pass runs B tokens through every layer, but only the accepted prefix may stay in the layers'
state. transformers' cache crops attention keys and values and (while recording) the convolution
window, but a DeltaNet layer's recurrent state is one matrix per head updated in place: it cannot be
cropped. So during a verify each DeltaNet layer computes its output from the state before the block
and keeps the block's gated delta inputs (the "tape": queries, keys, values, decays, betas; a few
kilobytes) instead of writing its new state; commit then replays the tape of the accepted tokens
only, from the untouched state, in one chunk. docs/BENCHMARKS.md ("Hybrid rollback") compares this
with keeping every per-token state during the verify.

The layers are switched per model instance (their forward is wrapped on the instance, not the class),
so two loaded pairs never share state. Prefills run transformers' own code. Every step after the prompt
(single tokens, verifies, commits) runs the delta rule's reference functions (`reference`), never
flash-linear-attention's kernels, which transformers calls when that package is installed: their chunked
and recurrent forms round differently in bfloat16, so a verify and a plain step would part (measured on
an H100: docs/BENCHMARKS.md). Shared by DFlash and plain decoding, the prefill may use them.
"""
from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


def is_deltanet(module: nn.Module) -> bool:
    return type(module).__name__.endswith("GatedDeltaNet")


class DeltaNetRollback:
    """The DeltaNet layers of one target and the tapes of its current verify."""

    def __init__(self, layers: list[nn.Module]):
        self.layers = {layer.layer_idx: layer for layer in layers}
        self.tapes: dict[int, tuple] = {}      # layer_idx -> (q, k, v, g, beta) of the last verify
        self.verifying = False
        for layer in layers:
            layer.forward = self._wrap(layer, layer.forward)

    @classmethod
    def attach(cls, model: nn.Module) -> "DeltaNetRollback | None":
        layers = [m for m in model.modules() if is_deltanet(m)]
        return cls(layers) if layers else None

    @contextmanager
    def verify(self):
        """Multi-token forwards inside this block keep tapes instead of writing recurrent states."""
        self.verifying, self.tapes = True, {}
        try:
            yield
        finally:
            self.verifying = False

    def commit(self, cache, keep: int) -> None:
        """Advance every DeltaNet layer's recurrent state by the first `keep` tokens of the last verify."""
        for idx, tape in self.tapes.items():
            q, k, v, g, beta = (t[:, :keep] for t in tape)
            rule = reference(self.layers[idx], "torch_chunk_gated_delta_rule")
            _, state = rule(q, k, v, g=g, beta=beta, chunk_size=keep, initial_state=cache.get_recurrent_state(idx),
                            output_final_state=True, use_qk_l2norm_in_kernel=True)
            cache.update_recurrent_state(state, idx)
        self.tapes = {}

    def _wrap(self, layer: nn.Module, original):
        def forward(hidden_states, cache_params=None, attention_mask=None, **kwargs):
            own = getattr(cache_params, "deltanet_forward", None)
            if own is not None:       # a cache that keeps DeltaNet state itself (cuda_hybrid.py)
                return own(layer, hidden_states)
            if cache_params is None or (not self.verifying and hidden_states.shape[1] > 1):   # a prefill
                return original(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
            if hidden_states.shape[1] == 1:
                return self._step_forward(layer, hidden_states, cache_params)
            return self._verify_forward(layer, hidden_states, cache_params)
        return forward

    def _step_forward(self, layer: nn.Module, x: torch.Tensor, cache) -> torch.Tensor:
        """transformers' DeltaNet forward for one cached token, through the reference recurrent rule."""
        idx = layer.layer_idx
        mixed, z, beta, g = projections(layer, x)
        window = cache.update_conv_state(mixed, idx, conv_kernel_size=layer.conv_kernel_size)
        q, k, v = convolve(layer, window, 1)
        out, state = reference(layer, "torch_recurrent_gated_delta_rule")(
            q, k, v, g=g, beta=beta, initial_state=cache.get_recurrent_state(idx), output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        cache.update_recurrent_state(state, idx)
        return output(layer, out, z)

    def _verify_forward(self, layer: nn.Module, x: torch.Tensor, cache) -> torch.Tensor:
        """transformers' DeltaNet forward for a cached multi-token call, except that the recurrent state is
        read but not written, and the rule's inputs are kept for commit()."""
        idx, n = layer.layer_idx, x.shape[1]
        mixed, z, beta, g = projections(layer, x)
        # the cache records the convolution window's history until the next crop, so it rolls back exactly
        window = cache.update_conv_state(mixed, idx, conv_kernel_size=layer.conv_kernel_size)
        q, k, v = convolve(layer, window, n)
        out, _ = reference(layer, "torch_chunk_gated_delta_rule")(
            q, k, v, g=g, beta=beta, chunk_size=n, initial_state=cache.get_recurrent_state(idx),
            output_final_state=False, use_qk_l2norm_in_kernel=True)
        self.tapes[idx] = (q, k, v, g, beta)
        return output(layer, out, z)


def projections(layer: nn.Module, x: torch.Tensor):
    """The first half of transformers' DeltaNet forward: convolution input [b, C, n], gate z, beta, g."""
    b, n, _ = x.shape
    mixed = layer.in_proj_qkv(x).transpose(1, 2)
    z = layer.in_proj_z(x).reshape(b, n, -1, layer.head_v_dim)
    beta = layer.in_proj_b(x).sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(layer.in_proj_a(x).float() + layer.dt_bias)
    return mixed, z, beta, g


def convolve(layer: nn.Module, window: torch.Tensor, n: int):
    """Queries, keys and values of the last n positions of a convolution window [b, C, history + n]."""
    b = window.shape[0]
    mixed = _helpers(layer).causal_conv1d_fn(window, layer.conv1d.weight.squeeze(1), layer.conv1d.bias,
                                             activation=layer.activation)[:, :, -n:].transpose(1, 2)
    q, k, v = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    return (q.reshape(b, n, -1, layer.head_k_dim), k.reshape(b, n, -1, layer.head_k_dim),
            v.reshape(b, n, -1, layer.head_v_dim))


def output(layer: nn.Module, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The second half: the gated norm of the delta rule's output and the output projection."""
    b, n = z.shape[:2]
    out = layer.norm(core.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return layer.out_proj(out.reshape(b, n, -1))


def _helpers(layer: nn.Module):
    """The modeling module that defines this layer (its conv and delta-rule functions)."""
    return sys.modules[type(layer).__module__]


def reference(layer: nn.Module, name: str):
    """The modeling module's own torch function `name`, past the wrapper that swaps in
    flash-linear-attention's kernel when that package is installed."""
    return _unwrapped(type(layer).__module__, name)


@lru_cache(maxsize=None)
def _unwrapped(module: str, name: str):
    return inspect.unwrap(getattr(sys.modules[module], name))
