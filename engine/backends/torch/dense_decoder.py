"""A dense target's decoder run straight from its weights, for the CUDA path's steps.

transformers' layers spend a CUDA graph's replay on many small kernels and, whenever a mask comes with
grouped heads, copy every key/value head out to the query heads. Here each layer is a few large
products over packed weights (Q, K and V in one matrix, gate and up in another, as DraftRunner packs the
drafter's), rotary angles come from a table made once by the model's own rotary module, keys and values
go to the StaticKV at explicit positions, and attention reads the grouped cache directly: the Triton
kernel (kernels.cached_attention) on CUDA, torch's SDPA over the cache rows on a CPU.

Dense full-attention Qwen3 and Llama layers only (`fits`); anything else (hybrids, sliding windows,
quantized weights, other activations, rotary angles that follow the sequence length) keeps transformers'
layers over the same StaticKV."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .draft_runner import block_attention
from .drafter import rope


# Rotary kinds whose angle at a position does not depend on how long the sequence is (dynamic NTK and
# longrope rescale with the length seen, which a table made once cannot follow)
FIXED_ROPE = ("default", "linear", "llama3", "yarn")


def fits(target) -> bool:
    """Whether every layer has the plain dense shape this runner computes."""
    cfg = target.model.config.get_text_config()
    if target.deltanet is not None or target.quantization or getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if getattr(getattr(target.decoder, "rotary_emb", None), "rope_type", None) not in FIXED_ROPE:
        return False
    if any(kind != "full_attention" for kind in getattr(cfg, "layer_types", None) or ()):
        return False
    if getattr(cfg, "use_sliding_window", False):
        return False
    for layer in target.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        parts = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        parts += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(p, torch.nn.Linear) and p.weight.dtype.is_floating_point for p in parts):
            return False
    return True


def _joined(*linears):
    """One weight (and bias, or None) for several linear layers applied to the same input. The layers'
    own parameters become views into it, so the joined copy costs no memory (an 8B model's would be GBs);
    layers already joined so (a second decoder over the same model) are joined again without a copy."""
    weight = _one_block([m.weight for m in linears])
    if weight is None:
        weight = torch.cat([m.weight.detach() for m in linears])
        _view_into(weight, [m.weight for m in linears], linears)
    bias = None
    if any(m.bias is not None for m in linears):
        biases = [m.bias for m in linears]
        bias = _one_block(biases) if all(b is not None for b in biases) else None
        if bias is None:
            bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                              for m in linears])
            _view_into(bias, biases, linears)
    return weight, bias


def _view_into(joined: torch.Tensor, params, linears) -> None:
    """Point each parameter (None: a layer without that bias) at its rows of the joined tensor."""
    at = 0
    for param, m in zip(params, linears):
        if param is not None:
            param.data = joined[at:at + m.out_features]
        at += m.out_features


def _one_block(tensors) -> torch.Tensor | None:
    """The tensors as one, when they already lie one after another in one storage; else None."""
    first = tensors[0]
    at = first.storage_offset()
    for t in tensors:
        if (not t.is_contiguous() or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or t.storage_offset() != at or t.shape[1:] != first.shape[1:]):
            return None
        at += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.detach().new_empty(0).set_(first.untyped_storage(), first.storage_offset(),
                                            (rows, *first.shape[1:]))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm rounded where transformers' Qwen3/Llama norms round (to x's dtype before the weight), so
    bfloat16 answers match theirs, not only our own plain decoding."""
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def _norm(module):
    return (module.weight, module.variance_epsilon) if module is not None else (None, 0.0)


class _Layer:
    """One layer's tensors, in the two groups the two halves of a layer take (plain tuples of tensors,
    so a compiled half serves every layer)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        (norm, eps), (q_norm, q_eps), (k_norm, k_eps) = (
            _norm(layer.input_layernorm), _norm(getattr(attn, "q_norm", None)), _norm(getattr(attn, "k_norm", None)))
        self.before = (norm, *_joined(attn.q_proj, attn.k_proj, attn.v_proj), q_norm, k_norm)   # Qwen3's q/k norms
        self.eps = (eps, q_eps, k_eps)
        post, self.post_eps = _norm(layer.post_attention_layernorm)
        self.after = (attn.o_proj.weight, attn.o_proj.bias, post, *_joined(mlp.gate_proj, mlp.up_proj),
                      mlp.down_proj.weight, mlp.down_proj.bias)


def before_attention(x, weights, eps, cos, sin, heads: int, kv_heads: int, d: int):
    """x [n, H] -> the layer's queries [heads, n, d], keys and values [1, kv_heads, n, d], roped."""
    norm, qkv_w, qkv_b, q_norm, k_norm = weights
    n = x.shape[0]
    qkv = F.linear(_rms(x, norm, eps[0]), qkv_w, qkv_b)
    q = qkv[:, :heads * d].view(n, heads, d)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(n, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].view(n, kv_heads, d)
    if q_norm is not None:
        q, k = _rms(q, q_norm, eps[1]), _rms(k, k_norm, eps[2])
    q = rope(q, cos, sin).transpose(0, 1).contiguous()
    return q, rope(k, cos, sin).transpose(0, 1)[None], v.transpose(0, 1)[None]


def after_attention(x, attended, weights, eps: float):
    """The residual stream after the attention output's projection and the MLP."""
    o_w, o_b, post, gate_up_w, gate_up_b, down_w, down_b = weights
    x = x + F.linear(attended, o_w, o_b)
    gate, up = F.linear(_rms(x, post, eps), gate_up_w, gate_up_b).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_w, down_b)


class DenseDecoder:
    """run(ids, cache, rows) -> (hidden [n, H], features [n, k*H] or None), the decoder's forward over a
    StaticKV (static_kv.py), with the layers TargetModel.capture chose recorded as its hooks would. compiled:
    each half of a layer through torch.compile, which fuses its small element-wise steps (the products
    and the cache stay as they are; the first call of each shape pays the compilation)."""

    def __init__(self, target, size: int, kernels=None, compiled: bool = False):
        decoder = target.decoder
        self.embedding = target.embedding
        self.layers = [_Layer(layer) for layer in target.layers]
        self.final_norm = _norm(decoder.norm)
        self.capture = list(target.capture_ids)
        self.kernels = kernels
        positions = torch.arange(size, device=target.device)[None]
        probe = torch.empty(1, dtype=self.embedding.weight.dtype, device=target.device)
        cos, sin = decoder.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]
        self.why_not = None          # why compilation was given up, if it was
        self.before, self.after = before_attention, after_attention
        if compiled:
            self.before, self.after = (self._compiled(f) for f in (before_attention, after_attention))

    def _compiled(self, fn):
        """fn through torch.compile, and fn itself for good once compiling fails (the same numbers, slower):
        compilation is only an optimisation, so a machine whose compiler fails still decodes."""
        compiled = torch.compile(fn, fullgraph=True)

        def call(*args):
            if self.why_not is None:
                try:
                    return compiled(*args)
                except Exception as exc:   # noqa: BLE001 (Dynamo, Inductor and Triton raise many types)
                    self.why_not = f"{type(exc).__name__}: {exc}"
            return fn(*args)
        return call

    def run(self, ids: torch.Tensor, cache, rows: int):
        n = ids.shape[1]
        where = cache.start + cache.offsets[:n]
        end = where[-1:] + 1
        cos, sin = self.cos[where], self.sin[where]
        mask = None if self.kernels is not None else cache.offsets[None, :rows] <= where[:, None]
        x = self.embedding(ids[0])
        captured = {}
        for i, layer in enumerate(self.layers):
            q, k, v = self.before(x, layer.before, layer.eps, cos, sin, layer.heads, layer.kv_heads, layer.head_dim)
            keys, values = cache.update(k, v, i)
            if self.kernels is not None:
                out = self.kernels.cached_attention(q, keys[0], values[0], end, causal=True, rows=rows)
            else:
                out = block_attention(q, keys[0], values[0], rows, mask)
            x = self.after(x, out.transpose(0, 1).reshape(n, -1), layer.after, layer.post_eps)
            if i in self.capture:
                captured[i] = x
        feats = torch.cat([captured[i] for i in self.capture], -1) if self.capture else None
        return _rms(x, *self.final_norm), feats
