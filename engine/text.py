"""Streaming detokenisation: committed token ids become text pieces as they arrive, tagged with whether
the drafter proposed them. Bytes that are not yet a whole character, and text that could be the start
of a stop string, are held back until they are settled."""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop_strings: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.ids: list[int] = []
        self.text = ""
        self.flags: list[bool] = []  # per character of self.text: did a drafted token produce it
        self.emitted = 0
        self._prefix = 0
        self._read = 0
        self.stopped = False

    def _decode(self, ids):
        return self.tokenizer.decode(ids)

    def push(self, token_id: int, drafted: bool) -> None:
        self.ids.append(token_id)
        self._settle(drafted, final=False)

    def _settle(self, drafted: bool, final: bool) -> None:
        prefix = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        if full.endswith("\ufffd") and not final:
            return  # an incomplete multi-byte character: wait for the next token
        new = full[len(prefix):]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += new
        self.flags.extend([drafted] * len(new))

    def find_stop(self) -> bool:
        """Cut the text at the first stop string; True when one was found."""
        start = max(0, self.emitted - max((len(s) for s in self.stop_strings), default=0))
        hits = [i for i in (self.text.find(s, start) for s in self.stop_strings) if i >= 0]
        if not hits:
            return False
        cut = min(hits)
        self.text, self.flags, self.stopped = self.text[:cut], self.flags[:cut], True
        return True

    def take(self, final: bool = False) -> list[tuple[str, bool]]:
        """Text settled since the last call, as (piece, drafted) spans."""
        if final and not self.stopped and self._read < len(self.ids):
            self._settle(drafted=False, final=True)  # bytes that never became a character
        end = len(self.text)
        if not final and not self.stopped:
            end -= self._holdback()
        spans: list[tuple[str, bool]] = []
        i = self.emitted
        while i < end:
            j = i
            while j < end and self.flags[j] == self.flags[i]:
                j += 1
            spans.append((self.text[i:j], self.flags[i]))
            i = j
        self.emitted = max(self.emitted, end)
        return spans

    def _holdback(self) -> int:
        tail = self.text[self.emitted:]
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best
