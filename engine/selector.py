"""DFlash2's candidate selector picks one path through each block row's top-k tokens, left to right, each
choice conditioned on the one before. The walk itself is plain Python over the lattice's scores (a few
dozen numbers per row), so the torch and MLX engines share it; each engine computes the scores."""
from __future__ import annotations

import bisect


def greedy_path(scores: list[list[list[float]]]) -> list[int]:
    """scores[t][p][c]: candidate c of row t after candidate p of row t-1 (row 0 follows the anchor, so its
    rows are equal and row 0's predecessor is taken as 0). The best candidate per row, given the last."""
    path, prev = [], 0
    for row in scores:
        choices = row[prev]
        prev = max(range(len(choices)), key=choices.__getitem__)
        path.append(prev)
    return path


def sampled_path(cumulative: list[list[list[float]]], draws: list[float]) -> list[int]:
    """As greedy_path, drawing each row's candidate from its cumulative distribution given the last choice,
    with one uniform draw in [0, 1) per row."""
    path, prev = [], 0
    for table, u in zip(cumulative, draws):
        cum = table[prev]
        prev = min(bisect.bisect_right(cum, u * cum[-1]), len(cum) - 1)
        path.append(prev)
    return path
