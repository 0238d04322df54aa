"""The DSpark drafter in MLX: the DFlash drafter (drafter.py) with a Markov head that biases each draft slot's
logits by the token drafted before it, markov_w2 @ markov_w1[previous]. The same maths as the torch engine's
dspark.py (tests/test_mlx_dspark.py holds them together); weights load by DeepSpec's names, the optional
confidence head is not read, nothing from the checkpoint is executed."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ...config import DraftConfig
from ...dspark_config import UNREAD
from ...limits import GenerationSettings
from .drafter import MlxDrafter
from .sampling import Keys, chain


class Table(nn.Module):
    """A weight read by rows or multiplied as it is (not an nn.Linear, so drafter quantization leaves it)."""

    def __init__(self, rows: int, cols: int):
        super().__init__()
        self.weight = mx.zeros((rows, cols))


class MarkovHead(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.markov_w1 = Table(cfg.vocab_size, cfg.dspark.markov_rank)   # a row per previous token
        self.markov_w2 = Table(cfg.vocab_size, cfg.dspark.markov_rank)   # rank -> a bias per token


class MlxDSpark(MlxDrafter):
    generation = 3
    unread = UNREAD

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        self.markov_head = MarkovHead(cfg)

    def propose(self, logits: mx.array, anchor: int, settings: GenerationSettings, keys: Keys,
                ids: mx.array | None = None, vocab: int = 0) -> tuple[mx.array, mx.array | None, mx.array]:
        """From the head's logits for the draft slots [m, C] (column c stands for ids[c], or token c): each slot's
        logits plus w2 @ w1[the token drafted before it], then argmax or a draw, left to right (sampling.chain).
        Returns the drafts (token ids), their proposal q spread over the `vocab` tokens (None when greedy) and the
        biased logits."""
        w1 = self.markov_head.markov_w1.weight
        w2 = self.markov_head.markov_w2.weight if ids is None else self.markov_head.markov_w2.weight[ids]
        rows = iter(logits)
        return chain(logits.shape[0], lambda previous: next(rows).astype(mx.float32) +
                     (w2 @ w1[previous]).astype(mx.float32), anchor, settings, keys, ids, vocab)
