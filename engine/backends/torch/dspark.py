"""Our own DSpark drafter: the DFlash drafter (drafter.py) with a Markov head. Each draft slot's logits get a
bias from the token drafted just before it, markov_w2 @ markov_w1[previous], so the block is proposed
left to right (the first slot's "previous" is the last committed token) while the layers still run once.

Weights load by their public names (DeepSpec's `markov_head.markov_w1/w2`); the optional confidence head is
not read (the draft cutoff reads the drafter's own probabilities, as it does for DFlash), nor are copies of the
target's embedding and LM head that an export may carry (every engine takes them from the target, as llama.cpp's
converter does when they cover the whole vocabulary). A drafter trained on a
subset of the vocabulary (a speculators import, engine/speculators.py) drafts from that subset: its head rows
and markov_w2's rows of those tokens. Nothing from the checkpoint is executed."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...config import DraftConfig
from ...dspark_config import UNREAD
from ...limits import GenerationSettings
from .draft_runner import DraftRunner
from .drafter import DFlashDrafter
from .sampling import Candidates, chain


class MarkovHead(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        rank = cfg.dspark.markov_rank
        self.markov_w1 = nn.Linear(rank, cfg.vocab_size, bias=False)   # weight [V, rank]: a row per previous token
        self.markov_w2 = nn.Linear(rank, cfg.vocab_size, bias=False)   # weight [V, rank]: rank -> a bias per token


class DSparkDrafter(DFlashDrafter):
    generation = 3
    unread = UNREAD

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        self.markov_head = MarkovHead(cfg)


def markov_drafts(logits: torch.Tensor, anchor: int, w1: torch.Tensor,
                  w2: Callable[[torch.Tensor], torch.Tensor], settings: GenerationSettings,
                  gen: torch.Generator | None, ids: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | Candidates | None, torch.Tensor]:
    """Drafts for the slots whose logits [m, C] the drafter's head gave, one after the other (sampling.chain):
    slot j's logits plus w2(w1[the token before it]). Column c stands for token ids[c] (None: token c); w1 has a
    row per token, w2 a column per logit column. Returns the drafts [m] (token ids), q and the biased logits."""
    rows = iter(logits.float())
    return chain(logits.shape[0], lambda previous: next(rows) + w2(w1[previous]).float()[0],
                 torch.tensor([anchor], device=logits.device), settings, gen, ids)


def module_drafts(drafter: DSparkDrafter, hidden: torch.Tensor, head_weight: torch.Tensor, anchor: int,
                  settings: GenerationSettings, gen=None):
    """markov_drafts for the module's final hidden states of the draft slots (the reference the runner is
    tested against)."""
    head = drafter.markov_head
    return markov_drafts(F.linear(hidden, head_weight).float(), anchor, head.markov_w1.weight,
                         lambda x: F.linear(x, head.markov_w2.weight), settings, gen)


class DSparkRunner(DraftRunner):
    """One generation's DSpark drafter state: reset() for a new prompt, then propose() once per step."""

    def __init__(self, drafter: DSparkDrafter, head_weight: torch.Tensor, dtype: torch.dtype | None = None,
                 vocab=None):
        super().__init__(drafter, head_weight, dtype, vocab)
        self.first = drafter.config.first_draft
        # one row of w1 is read per draft and multiplies w2 transposed (rank x tokens, read along the tokens: on
        # a CPU in float32 this measured fastest, docs/BENCHMARKS.md), over the draft vocabulary's columns when
        # there is one (the last size asked kept, as the head's rows are); float32 everywhere, as llama.cpp's
        # graph adds the bias, so near-ties break alike on every device
        head = drafter.markov_head
        self.w1 = head.markov_w1.weight.detach().float()
        self._w2t = head.markov_w2.weight.detach().float().T.contiguous()
        self.w2t = self._w2t
        self._w2t_subset: torch.Tensor | None = None

    def w2(self, u: torch.Tensor) -> torch.Tensor:
        return u @ self.w2t

    def use_vocabulary(self, setting: int | None, on_cpu: bool) -> int | None:
        size = super().use_vocabulary(setting, on_cpu)
        if size is None:
            self.w2t = self._w2t
        else:
            if self._w2t_subset is None or self._w2t_subset.shape[1] != size:
                self._w2t_subset = self._w2t[:, self.ids].contiguous()
            self.w2t = self._w2t_subset
        return size

    def propose(self, block_embeds: torch.Tensor, ctx_features: torch.Tensor, anchor: int,
                settings: GenerationSettings, gen: torch.Generator | None):
        """Drafts for the block's draft slots (from slot 0 in DeepSpec's layout), their proposal distribution
        (None when greedy) and their biased logits."""
        return self.propose_from(self.hidden(block_embeds, ctx_features)[self.first:], anchor, settings, gen)

    def propose_from(self, hidden: torch.Tensor, anchor: int, settings: GenerationSettings,
                     gen: torch.Generator | None):
        """propose() from the drafter's final hidden states of the draft slots (cuda.py computes them)."""
        return markov_drafts(self.head(hidden).float(), anchor, self.w1, self.w2, settings, gen, self.ids)
