"""The DFlash2 drafter in MLX: the DFlash drafter (drafter.py) with a grouped dynamic convolution around each
sublayer and a candidate selector that picks one path through every block row's top-k tokens. The same
maths as the torch engine's drafter2.py and draft2_runner.py (tests/test_mlx_dflash2.py holds them
together); weights load by the public names, nothing from the checkpoint is executed."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ...config import DFlash2Config, DraftConfig
from ...limits import GenerationSettings
from ...selector import greedy_path, sampled_path
from .drafter import DraftLayer, MlxDrafter
from .dspark import MlxDSpark
from .eagle3 import MlxEagle3


def grouped_causal_conv(x: mx.array, base: mx.array, taps: mx.array, group: int) -> mx.array:
    """out[t, c] = sum_k (base[k, c] + taps[t, k, c // group]) * x[t - k, c], with x zero before row 0.
    x [..., n, H], base [K, H], taps [..., n, K, H // group] (channels grouped contiguously)."""
    n, hidden = x.shape[-2], x.shape[-1]
    grouped = x.reshape(*x.shape[:-1], hidden // group, group)
    before = [(0, 0)] * (grouped.ndim - 3)
    out = None
    for k in range(base.shape[0]):
        earlier = grouped if k == 0 else mx.pad(grouped, [*before, (k, 0), (0, 0), (0, 0)])[..., :n, :, :]
        term = (base[k].reshape(hidden // group, group) + taps[..., k, :, None]) * earlier
        out = term if out is None else out + term
    return out.reshape(x.shape)


class DynamicConv(nn.Module):
    """`base_kernel` [2, K, H]: static taps of the half before (0) and after (1) the sublayer;
    `kernel_projection` turns the sublayer's input into per-row, per-group dynamic taps for both."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        self.base_kernel = mx.zeros((2, kernel, hidden))
        self.base_kernel[:, 0] = 1.0     # a new convolution is the identity (its projection's taps are random here)
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)

    def prepare(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """The sublayer's input convolved, and the dynamic taps `finish` uses."""
        taps = self.kernel_projection(x).reshape(*x.shape[:-1], 2, self.kernel, -1)
        return grouped_causal_conv(x, self.base_kernel[0], taps[..., 0, :, :], self.group), taps[..., 1, :, :]

    def finish(self, y: mx.array, taps: mx.array) -> mx.array:
        return grouped_causal_conv(y, self.base_kernel[1], taps, self.group)


class Draft2Layer(DraftLayer):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        conv = cfg.dflash2
        self.attention_conv = DynamicConv(cfg.hidden_size, conv.conv_kernel_size, conv.conv_group_size)
        self.mlp_conv = DynamicConv(cfg.hidden_size, conv.conv_kernel_size, conv.conv_group_size)


class CandidateSelector(nn.Module):
    """Scores candidate b after token a at block row t as unary_t(b) + sum_r P[a, r] g_t[r] Q[b, r]: g_t projects
    the drafter's hidden state, P and Q are per-token codebooks (stored without `.weight`)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        rank = cfg.dflash2.selector_rank
        self.hidden_projection = nn.Linear(cfg.hidden_size, rank, bias=False)
        self.predecessor_codebook = mx.zeros((cfg.vocab_size, rank))
        self.successor_codebook = mx.zeros((cfg.vocab_size, rank))


class MlxDrafter2(MlxDrafter):
    generation = 2
    layer_class = Draft2Layer

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        self.candidate_selector = CandidateSelector(cfg)

    def _layer(self, layer: Draft2Layer, x: mx.array, ctx: mx.array, cache: KVCache, mask) -> mx.array:
        h, taps = layer.attention_conv.prepare(layer.input_layernorm(x))
        x = x + layer.attention_conv.finish(layer.self_attn(h, ctx, cache, self._rope, mask), taps)
        h, taps = layer.mlp_conv.prepare(layer.post_attention_layernorm(x))
        return x + layer.mlp_conv.finish(layer.mlp(h), taps)

    def propose(self, hidden: mx.array, logits: mx.array, anchor: int, settings: GenerationSettings, keys
                ) -> tuple[mx.array, mx.array, mx.array]:
        """From the final hidden states of block rows 1.. and the target head's logits for them: the drafts (one
        path through each row's top-k), each row's candidates [L, k], and each row's selector distribution over
        them given the chosen predecessor [L, k] (temperature 1 when greedy)."""
        cfg = self.config.dflash2
        top_k = min(cfg.selector_top_k, logits.shape[-1])
        shaped = shaped_logits(logits, cfg)
        candidates = mx.argpartition(-shaped, kth=top_k - 1, axis=-1)[:, :top_k]
        unary = mx.take_along_axis(shaped, candidates, axis=-1)
        order = mx.argsort(-unary, axis=-1)             # best first, as torch's topk returns them
        candidates, unary = mx.take_along_axis(candidates, order, -1), mx.take_along_axis(unary, order, -1)
        scores = lattice(unary, candidates, anchor, self.candidate_selector.hidden_projection(hidden),
                         self.candidate_selector.predecessor_codebook, self.candidate_selector.successor_codebook)
        probs = mx.softmax(scores / (1.0 if settings.greedy else settings.temperature), axis=-1, precise=True)
        if settings.greedy:
            path = greedy_path(scores.tolist())
        else:
            draws = mx.random.uniform(shape=(scores.shape[0],), key=keys.next())
            path = sampled_path(mx.cumsum(probs, axis=-1).tolist(), draws.tolist())
        rows = mx.arange(scores.shape[0])
        picked = mx.array(path)
        rows_q = probs[rows, mx.array([0, *path[:-1]])]
        return candidates[rows, picked], candidates, rows_q


def shaped_logits(logits: mx.array, cfg: DFlash2Config) -> mx.array:
    """The drafter's logits as the selector reads them: scaled, then tanh-capped when the config says so."""
    logits = logits.astype(mx.float32) * cfg.output_multiplier
    cap = cfg.final_logit_softcapping
    return logits if cap is None else mx.tanh(logits / cap) * cap


def lattice(unary: mx.array, candidates: mx.array, anchor: int, g: mx.array, predecessor: mx.array,
            successor: mx.array) -> mx.array:
    """scores [L, k, k]: [t, p, c] scores candidate c of row t after candidate p of row t-1 (row 0 follows the
    anchor). unary, candidates [L, k]; g [L, R]; codebooks [V, R]."""
    before = mx.concatenate([mx.full((1, candidates.shape[1]), anchor, dtype=candidates.dtype), candidates[:-1]])
    left = predecessor[before].astype(mx.float32) * g.astype(mx.float32)[:, None, :]
    return unary[:, None, :] + left @ successor[candidates].astype(mx.float32).transpose(0, 2, 1)


# drafter generation (engine/config.py) -> the MLX class that loads it
DRAFTERS = {1: MlxDrafter, 2: MlxDrafter2, 3: MlxDSpark, 4: MlxEagle3}
