"""Turning logits into tokens, and the acceptance rules of speculative decoding.

Greedy verification keeps the longest prefix of drafts equal to the target's argmax. With sampling,
exact speculative sampling accepts a draft d with probability min(1, p(d)/q(d)) and on rejection draws
from the normalised residual max(0, p - q); the output is then distributed exactly as the target's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import SettingsError


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    rule: str = "residual"  # "residual" (exact speculative sampling) or "match" (sample-and-match)

    def __post_init__(self):
        if not 0.0 <= self.temperature <= 100.0:
            raise SettingsError(f"temperature must be between 0 and 100, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingsError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise SettingsError(f"top_k must be 0 (off) or positive, got {self.top_k}.")
        if self.rule not in ("residual", "match"):
            raise SettingsError(f"unknown acceptance rule {self.rule!r}; use 'residual' or 'match'.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, s: SamplingSettings) -> torch.Tensor:
    """Row-wise distribution after temperature, top-k and top-p (float32)."""
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
    return probs


def draw(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def propose(logits: torch.Tensor, s: SamplingSettings, gen) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft tokens for each row, and their proposal distribution q (None when greedy)."""
    if s.greedy:
        return logits.argmax(-1), None
    q = probabilities(logits, s)
    return draw(q, gen), q


def verify(drafts: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
           s: SamplingSettings, gen) -> tuple[int, int]:
    """drafts [k], target_logits [k+1, V] (row i scores the token after slot i).
    Returns (number of drafts accepted, the target's own next token)."""
    k = drafts.shape[0]
    if s.greedy:
        best = target_logits.argmax(-1)
        n = int(torch.cumprod((drafts == best[:k]).int(), 0).sum()) if k else 0
        return n, int(best[n])
    p = probabilities(target_logits, s)
    if s.rule == "match":
        own = draw(p, gen)
        n = int(torch.cumprod((drafts == own[:k]).int(), 0).sum()) if k else 0
        return n, int(own[n])
    if k:
        rows = torch.arange(k, device=drafts.device)
        ratio = p[rows, drafts] / q[rows, drafts]
        u = torch.rand(k, generator=gen, device=drafts.device)
        rejected = (u >= ratio).nonzero()
        if rejected.numel():
            n = int(rejected[0, 0])
            residual = torch.clamp(p[n] - q[n], min=0.0)
            total = residual.sum()
            # p == q up to rounding: every token is as likely, so draw from p itself
            residual = residual / total if total > 0 else p[n]
            return n, int(draw(residual, gen))
    return k, int(draw(p[k], gen))
