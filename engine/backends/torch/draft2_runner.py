"""The DFlash2 drafter at inference time: DraftRunner's packed layers with the two convolutions wrapped
around each sublayer, then the candidate selector's path (drafter2.py). The same numbers as the module
(tests/test_engine_dflash2.py)."""
from __future__ import annotations

import torch

from ...limits import GenerationSettings
from .draft_runner import DraftRunner, _rms
from .drafter2 import DFlash2Drafter, grouped_causal_conv, lattice, shaped_logits, walk
from .packed import product_by
from .sampling import Candidates


class _Conv:
    def __init__(self, conv, dtype: torch.dtype):
        self.kernel, self.group = conv.kernel, conv.group
        self.base = conv.base_kernel.detach().to(dtype)
        self.project = product_by(conv.kernel_projection.weight.to(dtype))

    def prepare(self, x):
        taps = self.project(x).unflatten(-1, (2, self.kernel, -1))
        return grouped_causal_conv(x, self.base[0], taps[:, 0], self.group), taps[:, 1]

    def finish(self, y, taps):
        return grouped_causal_conv(y, self.base[1], taps, self.group)


class Draft2Runner(DraftRunner):
    """One generation's DFlash2 drafter state: reset() for a new prompt, then propose() once per step."""

    def __init__(self, drafter: DFlash2Drafter, head_weight: torch.Tensor, dtype: torch.dtype | None = None,
                 vocab=None):
        super().__init__(drafter, head_weight, dtype)   # the candidate selector scores every token: no subset
        self.settings2 = drafter.config.dflash2
        self.convs = [(_Conv(layer.attention_conv, self.dtype), _Conv(layer.mlp_conv, self.dtype))
                      for layer in drafter.layers]
        selector = drafter.candidate_selector
        self.top_k = selector.top_k
        self.project = product_by(selector.hidden_projection.weight.to(self.dtype))
        # Only k rows of each are read per step: the codebooks stay as loaded, not copied.
        self.predecessor = selector.predecessor_codebook.detach()
        self.successor = selector.successor_codebook.detach()

    def _layer(self, i, layer, x, ctx, cos, sin, start, mask):
        around_attention, around_mlp = self.convs[i]
        h, taps = around_attention.prepare(_rms(x, *layer.norms[0]))
        x = x + around_attention.finish(self._attention(i, layer, ctx, h, cos, sin, start, mask), taps)
        h, taps = around_mlp.prepare(_rms(x, *layer.norms[1]))
        return x + around_mlp.finish(self._mlp(layer, h), taps)

    def propose(self, block_embeds: torch.Tensor, ctx_features: torch.Tensor, anchor: int,
                settings: GenerationSettings, gen: torch.Generator | None
                ) -> tuple[torch.Tensor, Candidates | None, torch.Tensor]:
        """Drafts for block slots 1.. (slot 0 holds `anchor`, the last committed token); their proposal
        distribution, zero outside each slot's candidates (None when greedy); and each slot's selector
        distribution over its candidates, for the draft cutoff."""
        return self.propose_from(self.hidden(block_embeds, ctx_features)[1:], anchor, settings, gen)

    def propose_from(self, hidden: torch.Tensor, anchor: int, settings: GenerationSettings,
                     gen: torch.Generator | None) -> tuple[torch.Tensor, Candidates | None, torch.Tensor]:
        """propose() from the drafter's final hidden states of block slots 1.. (cuda.py computes them)."""
        unary, candidates = shaped_logits(self.head(hidden), self.settings2).topk(self.top_k, dim=-1)
        scores = lattice(unary, candidates, anchor, self.project(hidden), self.predecessor, self.successor)
        path, rows = walk(scores, settings, gen)
        picked = torch.tensor(path, device=candidates.device)
        drafts = candidates.gather(1, picked[:, None])[:, 0]
        return drafts, (None if settings.greedy else Candidates(candidates, rows)), rows
