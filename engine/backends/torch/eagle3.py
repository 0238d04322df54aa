"""Our own EAGLE-3 drafter, in SpecForge's layout: one Llama decoder layer (`midlayer`) whose attention reads the
token's embedding and a hidden state side by side, `fc` projecting three target layers to that hidden state, and
a head over the drafter's own vocabulary (`d2t` maps its row i to target token i + d2t[i]).

Unlike DFlash it drafts one token per pass. Drafter position P reads the token at P+1 with the target's features
at P (llama.cpp's convention); a draft then feeds its own pre-norm output back as the next position's hidden state,
with the token it just drafted. Keys and values of committed positions stay cached; a chain's are written after
them and overwritten by the next step's, which is the rollback. Weights load by name; nothing from the checkpoint
is executed."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as RMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from ...config import DraftConfig
from ... import eagle3_config
from ...limits import GenerationSettings
from .draft_runner import DraftRunner, _rms, block_attention
from .drafter import DFlashDrafter, DraftMLP, rope, rope_config
from .packed import product_by
from .sampling import chain


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = DraftMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)    # on the token's embedding
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)        # on the hidden state beside it
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Eagle3Drafter(eagle3_config.Loading, DFlashDrafter):
    generation = 4
    unread = eagle3_config.UNREAD

    def __init__(self, cfg: DraftConfig, own_head: bool = True, own_embedding: bool = False,
                 mapped: bool = False):
        nn.Module.__init__(self)
        self.config = cfg
        e, h, vocab = cfg.eagle3, cfg.hidden_size, cfg.eagle3.draft_vocab_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        if e.norm_before_fc:
            self.input_norm = RMSNorm(3 * h, cfg.rms_norm_eps)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        if own_head:
            self.lm_head = nn.Linear(h, vocab, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        if mapped or cfg.own_head_size:
            self.register_buffer("d2t", torch.zeros(vocab, dtype=torch.long))
        self.rotary = Qwen3RotaryEmbedding(rope_config(cfg))

    def target_ids(self) -> torch.Tensor | None:
        """The target token each head row stands for (None: row i is token i), checked (eagle3_config)."""
        if not hasattr(self, "d2t"):
            return None
        ids = torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t
        return ids if eagle3_config.checked_targets(ids.tolist(), self.config.vocab_size) else None


class Eagle3Runner(DraftRunner):
    """One answer's EAGLE-3 drafter state: reset() for a new prompt, then propose() once per step."""

    def __init__(self, drafter: Eagle3Drafter, head_weight: torch.Tensor, dtype: torch.dtype | None = None,
                 vocab=None):
        cfg = self.config = drafter.config
        self.dtype = dtype or drafter.fc.weight.dtype
        self.device = drafter.fc.weight.device
        self.vocab = None        # its own head is its draft vocabulary
        layer, attn = drafter.midlayer, drafter.midlayer.self_attn
        self.qkv = product_by(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).to(self.dtype))
        self.o = product_by(attn.o_proj.weight.to(self.dtype))
        self.gate_up = product_by(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).to(self.dtype))
        self.down = product_by(layer.mlp.down_proj.weight.to(self.dtype))
        self.fc = product_by(drafter.fc.weight.to(self.dtype))

        def norm(n):
            return n.weight.to(self.dtype), n.variance_epsilon
        self.embed_norm, self.hidden_norm = norm(layer.input_layernorm), norm(layer.hidden_norm)
        self.post_norm, self.final_norm = norm(layer.post_attention_layernorm), norm(drafter.norm)
        self.input_norm = norm(drafter.input_norm) if hasattr(drafter, "input_norm") else None
        self.normed_residual = cfg.eagle3.norm_before_residual
        self.own_embedding = drafter.embed_tokens if hasattr(drafter, "embed_tokens") else None
        head = drafter.lm_head.weight if hasattr(drafter, "lm_head") else head_weight
        self._whole = (drafter.target_ids(), product_by(head.to(self.dtype)))
        self.ids, self.head = self._whole
        # what DraftRunner's buffers and rotary table need of the one layer
        self.layers = [SimpleNamespace(kv_heads=attn.kv_heads, head_dim=attn.head_dim, heads=attn.heads)]
        self._rotary = drafter.rotary
        self._cos = self._sin = torch.empty(0)
        self.keys, self.values, self.length = [], [], 0

    def propose(self, ctx_features: torch.Tensor, next_tokens: list[int],
                embed: Callable[[torch.Tensor], torch.Tensor], count: int, settings: GenerationSettings,
                gen: torch.Generator | None):
        """count drafts after the committed positions whose target features ctx_features [c, 3H] hold (appended
        to the cache), next_tokens being the token after each of them (the last is the newest token). embed is
        the target's embedding. Returns the drafts [count], q (None when greedy) and their logits."""
        c = ctx_features.shape[0]
        start = self.length
        self._reserve(start + c + count)
        embed = self.own_embedding or embed
        feats = ctx_features.to(self.dtype)
        if self.input_norm is not None:
            feats = _rms(feats, *self.input_norm)
        hidden = self.fc(feats)
        tokens = torch.tensor(next_tokens, device=self.device)
        state = {"pos": start, "rows": c, "hidden": hidden, "tokens": embed(tokens).to(self.dtype)}
        self.length += c

        def row_after(previous: torch.Tensor | None) -> torch.Tensor:
            if previous is not None:    # the last draft, with the drafter's own output, one position on
                state.update(pos=state["pos"] + state["rows"], rows=1, tokens=embed(previous).to(self.dtype))
            out = self._step(state["tokens"], state["hidden"], state["pos"])
            state["hidden"] = out
            return self.head(_rms(out, *self.final_norm))[0]
        return chain(count, row_after, None, settings, gen, self.ids)

    def _step(self, embeds: torch.Tensor, hidden: torch.Tensor, start: int) -> torch.Tensor:
        """The layer over n new positions from start (their keys and values cached), computed on to the output
        for the last of them only: the one a draft is read from. Returns its pre-norm output [1, H]."""
        n, attn = embeds.shape[0], self.layers[0]
        d, qh, kvh = attn.head_dim, attn.heads * attn.head_dim, attn.kv_heads * attn.head_dim
        normed = _rms(hidden, *self.hidden_norm)
        qkv = self.qkv(torch.cat([_rms(embeds, *self.embed_norm), normed], dim=-1))
        cos, sin = self._cos[start:start + n], self._sin[start:start + n]
        k = qkv[:, qh:qh + kvh].view(n, attn.kv_heads, d)
        self.keys[0][:, start:start + n] = rope(k, cos, sin).transpose(0, 1)
        self.values[0][:, start:start + n] = qkv[:, qh + kvh:].view(n, attn.kv_heads, d).transpose(0, 1)
        q = rope(qkv[-1:, :qh].view(1, attn.heads, d), cos[-1:], sin[-1:]).transpose(0, 1)
        out = block_attention(q, self.keys[0], self.values[0], start + n, None)
        x = (normed if self.normed_residual else hidden)[-1:] + self.o(out.transpose(0, 1).reshape(1, qh))
        gate, up = self.gate_up(_rms(x, *self.post_norm)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)
