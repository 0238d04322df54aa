"""Turning logits into tokens, and the acceptance rules of speculative decoding, in MLX: the same rules
as the torch engine's sampling.py. Greedy verification keeps the longest prefix of drafts equal to the
target's argmax. With sampling, a draft d is accepted with probability min(1, p(d)/q(d)) and on
rejection the token is drawn from the normalised residual max(0, p - q), so the output follows the
target's distribution exactly; rule "match" accepts only drafts equal to the target's own sample.

Randomness comes from an explicit key chain (Keys), so a seeded answer is the same every time."""
from __future__ import annotations

import secrets

import mlx.core as mx

from ...limits import GenerationSettings


class Keys:
    """A seeded chain of MLX random keys: each draw takes a fresh subkey."""

    def __init__(self, seed: int | None):
        self._key = mx.random.key(secrets.randbits(63) if seed is None else seed)

    def next(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub


def penalize(logits: mx.array, windows: list[list[int]], penalty: float) -> mx.array:
    """Rows of logits with the repeat penalty applied to each row's window (penalties.py), float32."""
    logits = logits.astype(mx.float32)
    pairs = [(r, t) for r, window in enumerate(windows) for t in set(window)]
    if not pairs:
        return logits
    rows, cols = mx.array([r for r, _ in pairs]), mx.array([t for _, t in pairs])
    seen = logits[rows, cols]
    logits[rows, cols] = mx.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def probabilities(logits: mx.array, s: GenerationSettings) -> mx.array:
    """Row-wise distribution after temperature, top-k, top-p and min-p (float32)."""
    logits = logits.astype(mx.float32) / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = mx.topk(logits, s.top_k, axis=-1).min(axis=-1, keepdims=True)
        logits = mx.where(logits < kth, -mx.inf, logits)
    probs = mx.softmax(logits, axis=-1, precise=True)
    if s.top_p < 1.0:
        order = mx.argsort(-probs, axis=-1)
        sorted_p = mx.take_along_axis(probs, order, axis=-1)
        before = mx.cumsum(sorted_p, axis=-1) - sorted_p
        sorted_p = mx.where(before >= s.top_p, 0.0, sorted_p)   # the smallest set reaching top_p
        probs = mx.put_along_axis(mx.zeros_like(probs), order, sorted_p, axis=-1)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    if s.min_p > 0.0:
        probs = mx.where(probs < s.min_p * probs.max(axis=-1, keepdims=True), 0.0, probs)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def draw(probs: mx.array, keys: Keys) -> mx.array:
    """One token per row of probs."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=keys.next())


def chain(count: int, row_after, first: int | None, s: GenerationSettings, keys: Keys, ids: mx.array | None = None,
          vocab: int = 0) -> tuple[mx.array, mx.array | None, mx.array]:
    """count drafts picked one after another (the torch engine's sampling.chain): row_after(previous draft; `first`
    for the first) gives the next logits [C]; argmax when greedy, else a draw from the row's distribution, its
    proposal given the drafts before. Column c stands for ids[c] (None: token c). Returns the drafts (token ids),
    q (None when greedy; a subset's spread over the `vocab` tokens, zero elsewhere) and the rows [count, C]."""
    previous, drafts, rows, qs = first, [], [], []
    for _ in range(count):
        row = row_after(previous).astype(mx.float32)
        if s.greedy:
            column = int(row.argmax())
        else:
            q = probabilities(row[None], s)
            column = int(draw(q, keys)[0])
            qs.append(q[0])
        previous = column if ids is None else int(ids[column])
        drafts.append(previous)
        rows.append(row)
    q = None
    if qs:
        q = mx.stack(qs)
        if ids is not None:
            whole = mx.zeros((q.shape[0], vocab), dtype=q.dtype)
            whole[:, ids] = q
            q = whole
    return mx.array(drafts), q, mx.stack(rows)


def propose(logits: mx.array, s: GenerationSettings, keys: Keys, ids: mx.array | None = None,
            vocab: int = 0) -> tuple[mx.array, mx.array | None]:
    """Draft tokens for each row, and their proposal distribution q (None when greedy). With a draft vocabulary
    the logits' columns stand for the token ids `ids` of a vocabulary of `vocab`: drafts come back as those
    tokens and q, the subset's renormalised distribution, is spread over the whole vocabulary (zero elsewhere,
    which the residual rule allows)."""
    if s.greedy:
        best = logits.argmax(axis=-1)
        return (best if ids is None else ids[best]), None
    q = probabilities(logits, s)
    drawn = draw(q, keys)
    if ids is None:
        return drawn, q
    whole = mx.zeros((q.shape[0], vocab), dtype=q.dtype)
    whole[:, ids] = q
    return ids[drawn], whole


def verify(drafts: list[int], q: mx.array | None, target_logits: mx.array, s: GenerationSettings,
           keys: Keys, windows: list[list[int]] | None = None) -> tuple[int, int]:
    """drafts [k], target_logits [k+1, V] (row i scores the token after slot i), each row's repeat-penalty
    window when the penalty is on. Returns (number of drafts accepted, the target's own next token)."""
    k = len(drafts)
    if windows is not None:
        target_logits = penalize(target_logits, windows, s.repeat_penalty)
    if s.greedy:
        best = target_logits.argmax(axis=-1).tolist()
        n = _agreeing(drafts, best)
        return n, best[n]
    p = probabilities(target_logits, s)
    if s.rule == "match":
        own = draw(p, keys).tolist()
        n = _agreeing(drafts, own)
        return n, own[n]
    if k:
        rows, cols = mx.arange(k), mx.array(drafts)
        ratio = p[rows, cols] / q[rows, cols]
        u = mx.random.uniform(shape=(k,), key=keys.next())
        rejected = (u >= ratio).tolist()
        if any(rejected):
            n = rejected.index(True)
            residual = mx.maximum(p[n] - q[n], 0.0)
            total = residual.sum()
            # p == q up to rounding: every token is as likely, so draw from p itself
            residual = mx.where(total > 0, residual / mx.maximum(total, 1e-30), p[n])
            return n, int(draw(residual[None], keys)[0])
    return k, int(draw(p[k:k + 1], keys)[0])


def confident_prefix(logits: mx.array, q: mx.array | None, cutoff: float) -> int:
    """How many leading drafts to verify: while the drafter's running confidence (the product of its top
    probabilities) stays at or above the cutoff."""
    top = (q if q is not None else mx.softmax(logits.astype(mx.float32), axis=-1, precise=True)).max(axis=-1)
    running = mx.cumprod(top).tolist()
    return next((i for i, c in enumerate(running) if c < cutoff), len(running))


def _agreeing(drafts: list[int], own: list[int]) -> int:
    n = 0
    while n < len(drafts) and drafts[n] == own[n]:
        n += 1
    return n
