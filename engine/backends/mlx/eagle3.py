"""The EAGLE-3 drafter in MLX, SpecForge's layout: one Llama decoder layer (`midlayer`) over a token's embedding and a
hidden state side by side, `fc` from three target layers, its own head over `draft_vocab_size` tokens (`d2t`). The
same maths as the torch engine's eagle3.py (tests/test_mlx_eagle3.py holds them together; the reasons are written
there and in docs/DRAFTERS.md, "EAGLE-3 drafters"): drafter position P reads the token at P+1 beside the target's
features at P, and a chain feeds each draft's pre-norm output back with the draft. Committed positions' keys and
values stay cached; a chain's are trimmed after it. Weights load by name; nothing from the checkpoint is executed."""
from __future__ import annotations

from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ...config import DraftConfig
from ... import eagle3_config
from ...limits import GenerationSettings
from .drafter import DraftMLP, MlxDrafter, drafter_rope
from .sampling import Keys, chain


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.scale = d ** -0.5
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = DraftMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class MlxEagle3(eagle3_config.Loading, MlxDrafter):
    generation = 4
    unread = eagle3_config.UNREAD

    def __init__(self, cfg: DraftConfig, own_head: bool = True, own_embedding: bool = False,
                 mapped: bool = False):
        nn.Module.__init__(self)
        self.config = cfg
        e, h, rows = cfg.eagle3, cfg.hidden_size, cfg.eagle3.draft_vocab_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        if e.norm_before_fc:
            self.input_norm = nn.RMSNorm(3 * h, eps=cfg.rms_norm_eps)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        if own_head:
            self.lm_head = nn.Linear(h, rows, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        if mapped or cfg.own_head_size:
            self.d2t = mx.zeros((rows,), dtype=mx.int64)
        self._rope = drafter_rope(cfg)
        self._cache = KVCache()
        self._ids: tuple[mx.array | None] | None = None

    def target_ids(self) -> mx.array | None:
        """The target token each head row stands for (None: row i is token i), checked (eagle3_config)."""
        if "d2t" not in self:
            return None
        if self._ids is None:      # checked once: (the ids, or None for a map that changes nothing)
            ids = mx.arange(self.d2t.shape[0]) + self.d2t
            self._ids = (ids if eagle3_config.checked_targets(ids.tolist(), self.config.vocab_size) else None,)
        return self._ids[0]

    def reset(self) -> None:
        self._cache = KVCache()

    @property
    def length(self) -> int:
        return self._cache.offset

    def propose(self, ctx_features: mx.array, next_tokens: list[int], embed: Callable[[mx.array], mx.array],
                head: Callable[[mx.array], mx.array], count: int, settings: GenerationSettings, keys: Keys,
                vocab: int) -> tuple[mx.array, mx.array | None, mx.array]:
        """count drafts after the committed positions whose target features ctx_features [c, 3H] hold (kept in the
        cache), next_tokens the token after each of them. embed and head are the target's (used where the drafter
        has none of its own). Returns the drafts (token ids), q spread over the `vocab` tokens (None when greedy)
        and their logits."""
        embed = self.embed_tokens if "embed_tokens" in self else embed
        head = self.lm_head if "lm_head" in self else head
        feats = ctx_features if "input_norm" not in self else self.input_norm(ctx_features)
        state = {"tokens": embed(mx.array(next_tokens)), "hidden": self.fc(feats), "chain": 0}

        def row_after(previous: int | None) -> mx.array:
            if previous is not None:
                state["tokens"], state["chain"] = embed(mx.array([previous])), state["chain"] + 1
            out = self._step(state["tokens"], state["hidden"])
            state["hidden"] = out
            return head(self.norm(out))[0]
        drafts = chain(count, row_after, None, settings, keys, self.target_ids(), vocab)
        self._cache.trim(state["chain"])     # the chain's positions: overwritten by the next step's committed ones
        return drafts

    def _step(self, embeds: mx.array, hidden: mx.array) -> mx.array:
        """The layer over n new positions (their keys and values cached), computed on to the output for the last
        of them only. Returns its pre-norm output [1, H]."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        n, start = embeds.shape[0], self._cache.offset
        normed = layer.hidden_norm(hidden)
        x = mx.concatenate([layer.input_layernorm(embeds), normed], axis=-1)[None]
        q = attn.q_proj(x[:, -1:]).reshape(1, 1, attn.heads, -1).transpose(0, 2, 1, 3)
        k = attn.k_proj(x).reshape(1, n, attn.kv_heads, -1).transpose(0, 2, 1, 3)
        v = attn.v_proj(x).reshape(1, n, attn.kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = self._rope(q, offset=start + n - 1), self._rope(k, offset=start)
        keys, values = self._cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn.scale, mask=None)
        residual = normed if self.config.eagle3.norm_before_residual else hidden
        h = residual[-1:] + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))
