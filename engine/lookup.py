"""N-gram lookup (prompt lookup decoding): drafts copied from the answer's own context, no drafter needed.

The last few tokens are looked up in the prompt and the answer so far, longest n-gram first, most recent
occurrence first, and the tokens that followed that occurrence are proposed. Answers that repeat or edit what
they were given (code, lists, quotes) continue their context often, and a verify keeps only what the target
would have chosen, so output is never changed. Plain Python: an index of every n-gram, updated per token,
makes a lookup O(1) however long the context."""
from __future__ import annotations

LONGEST_MATCH = 3      # the longest n-gram looked up; shorter ones down to a single token when it is not found
# The most tokens one n-gram step commits (its drafts plus the target's own token): docs/BENCHMARKS.md, "N-gram
# lookup in the torch engine", has the measurement that chose it (bench/bench_torch_ngram.py).
NGRAM_BLOCK = 9


class Lookup:
    """The context of one answer (prompt, then every committed token up to the last one chosen) and where each
    of its n-grams last occurred with a token after it."""

    def __init__(self, prompt: list[int]):
        self.tokens: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}   # n-gram -> index of the token after its latest occurrence
        self.extend(prompt)

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens; the n-grams ending just before each now know what followed them."""
        seq, follows = self.tokens, self.follows
        for token in tokens:
            end = len(seq)
            for n in range(1, min(LONGEST_MATCH, end) + 1):
                follows[tuple(seq[end - n:end])] = end
            seq.append(token)

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the latest earlier occurrence of the context's longest matching
        suffix; none when even its last token never occurred before. A continuation that runs into the end of
        the context keeps copying what it proposed (a repeating phrase continues its period)."""
        seq = self.tokens
        for n in range(min(LONGEST_MATCH, len(seq)), 0, -1):
            start = self.follows.get(tuple(seq[-n:]))
            if start is not None:
                out: list[int] = []
                for i in range(start, start + count):
                    out.append(seq[i] if i < len(seq) else out[i - len(seq)])
                return out
        return []
