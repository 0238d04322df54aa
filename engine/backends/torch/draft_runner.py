"""The drafter at inference time. DFlashDrafter is written for training (batched, masked, one
projection per checkpoint weight); a draft pass through it is many small ops, and on a CPU each op
costs microseconds whatever its size. DraftRunner packs the same weights (Q, K and V in one matrix,
gate and up in another), looks rotary angles up in a table, writes context keys and values in place
into a growing buffer, and projects context and block rows together: fewer ops, the same numbers
(tests/test_engine_draft_runner.py). Its matrix products run on oneDNN-packed weights where the CPU
allows (packed.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...draft_vocab import DraftVocab
from .drafter import DFlashDrafter, rope
from .packed import product_by


class _Layer:
    def __init__(self, layer, dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.qkv = product_by(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).to(dtype))
        self.o = product_by(attn.o_proj.weight.to(dtype))
        self.gate_up = product_by(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).to(dtype))
        self.down = product_by(mlp.down_proj.weight.to(dtype))
        self.norms = [(n.weight.to(dtype), n.variance_epsilon) for n in
                      (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)]


class DraftRunner:
    """One generation's drafter state: call reset() for a new prompt, then logits() once per step."""

    def __init__(self, drafter: DFlashDrafter, head_weight: torch.Tensor, dtype: torch.dtype | None = None,
                 vocab: DraftVocab | None = None):
        cfg = drafter.config
        self.config = cfg
        self.dtype = dtype or drafter.fc.weight.dtype
        self.device = drafter.fc.weight.device
        self.vocab = vocab                 # the drafter's frequency ranking (engine/draft_vocab.py), if it has one
        self._head_weight = head_weight    # the target's LM head, shared
        self._whole = (None, product_by(head_weight.to(self.dtype)))
        self._subset: tuple[torch.Tensor, object] | None = None    # (ids, their rows packed): the last size asked
        self.ids, self.head = self._whole
        self.fc = product_by(drafter.fc.weight.to(self.dtype))
        self.hidden_norm = (drafter.hidden_norm.weight.to(self.dtype), drafter.hidden_norm.variance_epsilon)
        self.final_norm = (drafter.norm.weight.to(self.dtype), drafter.norm.variance_epsilon)
        self.layers = [_Layer(layer, self.dtype) for layer in drafter.layers]
        # what each layer's mask needs: its window (None: sees every position) and whether it is causal
        self.mask_kinds = [(cfg.sliding_window if t == "sliding_attention" else None, causal)
                           for t, causal in zip(cfg.layer_types, cfg.causal)]
        self._rotary = drafter.rotary
        self._cos = self._sin = torch.empty(0)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0          # context positions cached so far

    def reset(self) -> None:
        self.length = 0
        self.keys, self.values = [], []

    def use_vocabulary(self, setting: int | None, on_cpu: bool) -> int | None:
        """Draft over the ranking's tokens the setting chooses (DraftVocab.chosen; no ranking: every token). Sets
        `ids` (the token each logit column stands for; None: column = token) and the head; returns the size
        used (None: the whole vocabulary). The whole head and the last subset's rows are kept packed."""
        ids = self.vocab.chosen(setting, on_cpu) if self.vocab is not None else None
        if ids is None:
            self.ids, self.head = self._whole
            return None
        if self._subset is None or len(self._subset[0]) != len(ids):
            index = torch.tensor(ids, device=self.device)
            self._subset = (index, product_by(self._head_weight[index].to(self.dtype)))
        self.ids, self.head = self._subset
        return len(ids)

    def logits(self, block_embeds: torch.Tensor, ctx_features: torch.Tensor) -> torch.Tensor:
        """The drafter's float32 logits for block slots 1.. (slot 0 holds the last committed token), over the
        draft vocabulary (column j is token ids[j])."""
        return self.head(self.hidden(block_embeds, ctx_features)[1:]).float()

    def hidden(self, block_embeds: torch.Tensor, ctx_features: torch.Tensor) -> torch.Tensor:
        """block_embeds [n, H] at the positions right after the context; ctx_features [c, k*H], the
        target's captured layers at the next c context positions (appended to the cache).
        Returns the drafter's final hidden states [n, H]."""
        c, n = ctx_features.shape[0], block_embeds.shape[0]
        start, end = self.length, self.length + c + n
        self._reserve(end)
        cos, sin = self._cos[start:end], self._sin[start:end]
        ctx = _rms(self.fc(ctx_features.to(self.dtype)), *self.hidden_norm)
        x = block_embeds.to(self.dtype)
        masks = {kind: block_mask(end, n, *kind, device=self.device) for kind in set(self.mask_kinds)}
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, ctx, cos, sin, start, masks[self.mask_kinds[i]])
        self.length += c
        return _rms(x, *self.final_norm)

    def _layer(self, i, layer, x, ctx, cos, sin, start, mask):
        x = x + self._attention(i, layer, ctx, _rms(x, *layer.norms[0]), cos, sin, start, mask)
        return x + self._mlp(layer, _rms(x, *layer.norms[1]))

    @staticmethod
    def _mlp(layer, h):
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        return layer.down(F.silu(gate) * up)

    def _attention(self, i, layer, ctx, h, cos, sin, start, mask):
        c, n, d = ctx.shape[0], h.shape[0], layer.head_dim
        qh, kvh = layer.heads * d, layer.kv_heads * d
        # Rows: the new context, then the block. Queries only come from the block.
        qkv = layer.qkv(torch.cat([ctx, h]))
        q = _rms(qkv[c:, :qh].view(n, layer.heads, d), *layer.norms[2])
        k = _rms(qkv[:, qh:qh + kvh].view(c + n, layer.kv_heads, d), *layer.norms[3])
        v = qkv[:, qh + kvh:].view(c + n, layer.kv_heads, d)
        q = rope(q, cos[c:], sin[c:]).transpose(0, 1)
        end = start + c + n
        # Block keys land after the context and are overwritten by the next step's context.
        self.keys[i][:, start:end] = rope(k, cos, sin).transpose(0, 1)
        self.values[i][:, start:end] = v.transpose(0, 1)
        out = block_attention(q, self.keys[i], self.values[i], end, mask)
        return layer.o(out.transpose(0, 1).reshape(n, qh))

    def _reserve(self, end: int) -> None:
        """Grow the rotary table and the K/V buffers (doubling) to hold positions < end."""
        have = self._cos.shape[0]
        if end > have:
            size = max(end, 2 * have, 256)
            pos = torch.arange(size, device=self.device).unsqueeze(0)
            cos, sin = self._rotary(torch.empty(1, dtype=self.dtype, device=self.device), pos)
            self._cos, self._sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        if not self.keys or self.keys[0].shape[1] < end:
            size = max(end, 2 * (self.keys[0].shape[1] if self.keys else 0), 256)
            for store in (self.keys, self.values):
                for i, layer in enumerate(self.layers):
                    grown = torch.zeros(layer.kv_heads, size, layer.head_dim, dtype=self.dtype, device=self.device)
                    if i < len(store):
                        grown[:, : self.length] = store[i][:, : self.length]
                        store[i] = grown
                    else:
                        store.append(grown)


def block_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, end: int,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """The block's queries q [heads, n, d] over the keys and values [kv_heads, >= end, d] at positions < end
    (the context, then the block), with block_mask's mask; grouped heads. Returns [heads, n, d]. The
    CUDA path's Triton kernel (kernels.cached_attention) is tested against this."""
    out = F.scaled_dot_product_attention(q.unsqueeze(0), keys[None, :, :end], values[None, :, :end],
                                         attn_mask=mask, enable_gqa=q.shape[0] != keys.shape[0])
    return out[0]


def block_mask(end: int, n: int, window: int | None, causal: bool, device=None) -> torch.Tensor | None:
    """Which of the keys 0..end-1 each of the last n (the block) sees, as the reference decides: a
    window of W keeps keys less than W positions away (on both sides unless causal); causal keeps keys
    at or before the query. None when the layer sees everything."""
    if window is None and not causal:
        return None
    key = torch.arange(end, device=device)
    query = key[end - n:].unsqueeze(1)
    visible = key <= query if causal else torch.ones(n, end, dtype=torch.bool, device=device)
    if window is not None:
        visible = visible & (query - key < window) & (key - query < window)
    return visible


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)

