"""Turning logits into tokens, and the acceptance rules of speculative decoding.

Greedy verification keeps the longest prefix of drafts equal to the target's argmax. With sampling,
exact speculative sampling accepts a draft d with probability min(1, p(d)/q(d)) and on rejection draws
from the normalised residual max(0, p - q); the output is then distributed exactly as the target's.
That holds for any q a draft was really drawn from, also one that is zero outside a few candidates
(DFlash2's selector, Candidates): a draft always has q > 0, and outside the candidates the residual is p."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...limits import GenerationSettings


@dataclass(frozen=True)
class Candidates:
    """A proposal distribution that is zero outside a few distinct token ids per row: ids and probs [k, c]."""
    ids: torch.Tensor
    probs: torch.Tensor

    def __getitem__(self, rows: slice) -> "Candidates":
        return Candidates(self.ids[rows], self.probs[rows])

    def at(self, tokens: torch.Tensor) -> torch.Tensor:
        """q of tokens [k], one per row (0 for a token that is not among its row's candidates)."""
        return (self.probs * (self.ids == tokens[:, None])).sum(-1)

    def row(self, n: int, vocab: int) -> torch.Tensor:
        """Row n over the whole vocabulary."""
        dense = torch.zeros(vocab, dtype=self.probs.dtype, device=self.probs.device)
        return dense.scatter(0, self.ids[n], self.probs[n])


def penalize(logits: torch.Tensor, windows: list[list[int]], penalty: float) -> torch.Tensor:
    """Rows of logits with the repeat penalty applied to the tokens of each row's window (penalties.py): a
    positive score divided by the penalty, a negative one multiplied (float32, a new tensor)."""
    pairs = [(r, t) for r, window in enumerate(windows) for t in set(window)]
    logits = logits.float().clone()
    if pairs:
        rows, cols = torch.tensor(pairs, device=logits.device).T
        seen = logits[rows, cols]
        logits[rows, cols] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def probabilities(logits: torch.Tensor, s: GenerationSettings) -> torch.Tensor:
    """Row-wise distribution after temperature, top-k, top-p and min-p (float32)."""
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p = sorted_p.masked_fill(before >= s.top_p, 0.0)  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if s.min_p > 0.0:
        probs = probs.masked_fill(probs < s.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def propose(logits: torch.Tensor, s: GenerationSettings, gen, ids: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | Candidates | None]:
    """Draft tokens for each row, and their proposal distribution q (None when greedy). With a draft vocabulary
    the logits' columns stand for the token ids `ids`: drafts come back as those tokens, and q, the subset's
    renormalised distribution, as Candidates over them (zero elsewhere, which the residual rule allows)."""
    if s.greedy:
        best = logits.argmax(-1)
        return (best if ids is None else ids[best]), None
    q = probabilities(logits, s)
    drawn = draw(q, gen)
    if ids is None:
        return drawn, q
    return ids[drawn], Candidates(ids.expand(q.shape[0], -1), q)


def chain(count: int, row_after: Callable[[torch.Tensor | None], torch.Tensor], first: torch.Tensor | None,
          s: GenerationSettings, gen, ids: torch.Tensor | None = None):
    """count drafts picked one after another, for drafters whose next logits depend on the draft before (DSpark's
    Markov head, EAGLE-3's layer): row_after(previous draft, as a [1] token tensor; `first` for the first) gives
    the next logits [C]; each pick is argmax (greedy) or a draw from that row's distribution under the answer's
    rule, which is its proposal q given the drafts before, so the residual rule stays exact. Column c stands for
    token ids[c] (None: token c). Returns the drafts [count], q (None when greedy; over a subset, Candidates) and
    the rows [count, C] (the draft cutoff reads them)."""
    previous, drafts, rows, qs = first, [], [], []
    for _ in range(count):
        row = row_after(previous).float()
        if s.greedy:
            column = row.argmax().view(1)
        else:
            q = probabilities(row[None], s)
            column = draw(q, gen)
            qs.append(q[0])
        previous = column if ids is None else ids[column]
        drafts.append(previous)
        rows.append(row)
    q = torch.stack(qs) if qs else None
    if q is not None and ids is not None:
        q = Candidates(ids.expand(q.shape[0], -1), q)
    return torch.cat(drafts), q, torch.stack(rows)


def verify(drafts: torch.Tensor, q: torch.Tensor | Candidates | None, target_logits: torch.Tensor,
           s: GenerationSettings, gen, windows: list[list[int]] | None = None) -> tuple[int, int]:
    """drafts [k], their proposal distribution q ([k, V] or Candidates), target_logits [k+1, V] (row i
    scores the token after slot i), each row's repeat-penalty window when the penalty is on.
    Returns (number of drafts accepted, the target's own next token)."""
    k = drafts.shape[0]
    if windows is not None:
        target_logits = penalize(target_logits, windows, s.repeat_penalty)
    if s.greedy:
        n, own = prefix_outcome(drafts, target_logits.argmax(-1))
        return int(n), int(own)
    p = probabilities(target_logits, s)
    if s.rule == "match":
        n, own = prefix_outcome(drafts, draw(p, gen))
        return int(n), int(own)
    if k:
        rows = torch.arange(k, device=drafts.device)
        ratio = p[rows, drafts] / (q.at(drafts) if isinstance(q, Candidates) else q[rows, drafts])
        u = torch.rand(k, generator=gen, device=drafts.device)
        n = int(leading_accepts(ratio, u))
        if n < k:
            q_n = q.row(n, p.shape[-1]) if isinstance(q, Candidates) else q[n]
            return n, int(draw(residual(p[n], q_n), gen))
    return k, int(draw(p[k], gen))


# ---- the pieces of verification, as device tensors (the CUDA path's kernels are tested against these) ----

def prefix_outcome(drafts: torch.Tensor, choices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [k] against the target's choices [k+1]: (n, choices[n]) as 0-dim tensors, n being how many
    leading drafts equal the choice in their row."""
    if drafts.shape[0] == 0:
        n = torch.zeros((), dtype=torch.long, device=choices.device)
    else:
        n = torch.cumprod((drafts == choices[: drafts.shape[0]]).long(), 0).sum()
    return n, choices[n]


def leading_accepts(ratio: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """How many leading drafts pass u < p/q (the first with u >= p/q is rejected), as a 0-dim tensor."""
    return torch.cumprod((u < ratio).long(), 0).sum()


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The normalised residual max(0, p - q); p itself when p == q up to rounding (every token is then
    as likely, so drawing from p is exact)."""
    rest = torch.clamp(p - q, min=0.0)
    total = rest.sum()
    return rest / total if total > 0 else p
