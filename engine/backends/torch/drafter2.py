"""Our own DFlash2 drafter: the DFlash drafter (drafter.py) with a grouped dynamic convolution around
each sublayer and a candidate selector that picks one coherent path through the top-k tokens of
every block slot. Weights load by their public names (the codebooks have no `.weight`); nothing from
the checkpoint is executed.

Order of operations in a layer (the reference's): norm -> convolution -> attention -> convolution ->
residual add, then the same around the MLP. Both halves of a convolution take their dynamic taps from
the sublayer's input. The convolution runs along the block only: row 0 (the last committed token)
sees zeros before it, and nothing carries over between draft passes."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import DFlash2Config, DraftConfig
from ...limits import GenerationSettings
from ...selector import greedy_path, sampled_path
from .drafter import DFlashDrafter, DraftLayer


def grouped_causal_conv(x: torch.Tensor, base: torch.Tensor, taps: torch.Tensor, group: int) -> torch.Tensor:
    """out[t, c] = sum_k (base[k, c] + taps[t, k, c // group]) * x[t - k, c], with x zero before row 0.
    x [..., n, H], base [K, H], taps [..., n, K, H // group] (channels are grouped contiguously)."""
    n, hidden = x.shape[-2], x.shape[-1]
    grouped = x.unflatten(-1, (hidden // group, group))
    out = None
    for k in range(base.shape[0]):
        earlier = grouped if k == 0 else F.pad(grouped, (0, 0, 0, 0, k, 0))[..., :n, :, :]
        term = (base[k].view(hidden // group, group) + taps[..., k, :, None]) * earlier
        out = term if out is None else out + term
    return out.flatten(-2)


class DynamicConv(nn.Module):
    """`base_kernel` [2, K, H] holds the static taps of the half before (0) and after (1) the sublayer;
    `kernel_projection` turns the sublayer's input into per-row, per-group dynamic taps for both."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)
        with torch.no_grad():   # a new convolution is the identity, so a fresh drafter computes what DFlash does
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's input convolved, and the dynamic taps `finish` uses."""
        taps = self.kernel_projection(x).unflatten(-1, (2, self.kernel, -1))
        return grouped_causal_conv(x, self.base_kernel[0], taps[..., 0, :, :], self.group), taps[..., 1, :, :]

    def finish(self, y: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        return grouped_causal_conv(y, self.base_kernel[1], taps, self.group)


class Draft2Layer(DraftLayer):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        conv = cfg.dflash2
        self.attention_conv = DynamicConv(cfg.hidden_size, conv.conv_kernel_size, conv.conv_group_size)
        self.mlp_conv = DynamicConv(cfg.hidden_size, conv.conv_kernel_size, conv.conv_group_size)

    def forward(self, x, ctx, rot_block, rot_ctx, mask):
        h, taps = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(h, ctx, rot_block, rot_ctx, mask), taps)
        h, taps = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), taps)


class CandidateSelector(nn.Module):
    """Scores candidate b after token a at block row t as unary_t(b) + sum_r P[a, r] g_t[r] Q[b, r], where
    g_t projects the drafter's hidden state and P, Q are per-token codebooks. Starts as plain argmax
    (zero codebooks)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        rank = cfg.dflash2.selector_rank
        self.top_k = cfg.dflash2.selector_top_k
        self.hidden_projection = nn.Linear(cfg.hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, rank))


class DFlash2Drafter(DFlashDrafter):
    generation = 2
    layer_class = Draft2Layer

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        self.candidate_selector = CandidateSelector(cfg)


# ---- proposing a path: shared by the module (tests) and the packed runner -------------------------

def shaped_logits(logits: torch.Tensor, cfg: DFlash2Config) -> torch.Tensor:
    """The drafter's logits as the selector reads them: scaled, then tanh-capped when the config says so."""
    logits = logits.float() * cfg.output_multiplier
    cap = cfg.final_logit_softcapping
    return logits if cap is None else torch.tanh(logits / cap) * cap


def lattice(unary: torch.Tensor, candidates: torch.Tensor, anchor: int, g: torch.Tensor,
            predecessor: torch.Tensor, successor: torch.Tensor) -> torch.Tensor:
    """scores [L, k, k]: [t, p, c] scores candidate c of row t after candidate p of row t-1 (row 0 follows
    the anchor, so its k rows are equal). unary, candidates [L, k]; g [L, R]; codebooks [V, R]."""
    before = torch.cat([candidates.new_full((1, candidates.shape[1]), anchor), candidates[:-1]])
    left = predecessor[before].float() * g.float()[:, None, :]
    return unary.float()[:, None, :] + left @ successor[candidates].float().transpose(1, 2)


def walk(scores: torch.Tensor, settings: GenerationSettings, gen: torch.Generator | None
         ) -> tuple[list[int], torch.Tensor]:
    """One path left to right, each choice conditioned on the one before: argmax when greedy, else a draw
    from softmax(scores / temperature). Returns the chosen candidate index per row, and each row's
    distribution over its candidates given the chosen predecessor (temperature 1 when greedy)."""
    rows = scores.shape[0]
    probs = torch.softmax(scores / (1.0 if settings.greedy else settings.temperature), dim=-1)
    if settings.greedy:
        path = greedy_path(scores.tolist())
    else:
        path = sampled_path(probs.cumsum(-1).tolist(), torch.rand(rows, generator=gen, device=scores.device).tolist())
    chosen_before = torch.tensor([0, *path[:-1]], device=scores.device)
    return path, probs[torch.arange(rows, device=scores.device), chosen_before]
