"""What keeps an answer from repeating itself, in plain Python (no array library): the token windows the
repeat penalty reads, and the loop guard.

The repeat penalty of a row depends on the tokens before it, drafts included: a verify block's row i follows
the committed tokens, the block's last token and its first i drafts, so each row gets its own window. Every
engine that verifies applies the penalty to each row with that row's window, which is what plain decoding
would have seen at that position, so speculation keeps the target's output (llama.cpp's server does the
same by sampling the rows one at a time)."""
from __future__ import annotations

from .limits import REPEAT_WINDOW


class History:
    """The last REPEAT_WINDOW tokens before the answer's next position, kept across an answer's steps; inactive
    (no windows, nothing kept) when the answer has no repeat penalty."""

    def __init__(self, prompt: list[int] = (), active: bool = True):
        self.active = active
        self.tokens = list(prompt)[-REPEAT_WINDOW:] if active else []

    def windows(self, last: int, drafts: list[int]) -> list[list[int]] | None:
        """The window of each of a verify's len(drafts) + 1 rows: row i sees last and drafts[:i]; None when
        inactive."""
        if not self.active:
            return None
        seen = self.tokens + [last] + list(drafts)
        base = len(self.tokens) + 1
        return [seen[max(0, base + i - REPEAT_WINDOW): base + i] for i in range(len(drafts) + 1)]

    def advance(self, last: int, drafts: list[int], accepted: int) -> None:
        """A verify kept `last` and its first `accepted` drafts: they now come before the next position."""
        if self.active:
            self.tokens = (self.tokens + [last, *drafts[:accepted]])[-REPEAT_WINDOW:]


LONGEST_PHRASE = 128   # tokens: a longer phrase repeated is not looked for (a check per token per length)


class LoopGuard:
    """Stops an answer whose last tokens are one phrase repeated: at least `span` tokens of it, and three times
    in a row or more. run[p] counts how many tokens in a row equal the token p places earlier, updated per
    token: a check costs one comparison per phrase length."""

    def __init__(self, span: int):
        self.span, self.longest = span, max(span // 3, min(LONGEST_PHRASE, span))
        self.tokens: list[int] = []
        self.run = [0] * (self.longest + 1)

    def push(self, token: int) -> bool:
        """Add an answer token; True when the answer is looping."""
        if not self.span:
            return False
        if len(self.tokens) > 4 * self.longest:
            del self.tokens[: -self.longest]
        tokens = self.tokens
        tokens.append(token)
        looping = False
        for p in range(1, min(self.longest, len(tokens) - 1) + 1):
            self.run[p] = self.run[p] + 1 if tokens[-1 - p] == token else 0
            # the last run[p] + p tokens are a phrase of p tokens and its repeats
            looping |= self.run[p] + p >= max(self.span, 3 * p)
        return looping
