"""A test drafter that proposes the target's own greedy continuation (optionally with planted
mistakes), so full- and partial-acceptance paths run with exactly known outcomes. It wraps a loaded
pair and replaces only its draft operation (engine/backends/__init__.py)."""


class OraclePair:
    def __init__(self, pair, reference: list[int], wrong_every: int = 0):
        self.pair, self.reference, self.wrong_every = pair, reference, wrong_every
        self.proposals = 0
        self.prompt_len = 0

    def __getattr__(self, name):
        return getattr(self.pair, name)

    def prefill(self, prompt, settings, drafting):
        self.prompt_len = len(prompt)
        return self.pair.prefill(prompt, settings, drafting)

    def draft(self, last, pos, width):
        done = pos - self.prompt_len + 1              # reference tokens already committed
        out = []
        for k in range(width - 1):
            i = done + k
            tok = self.reference[i] if i < len(self.reference) else 0
            self.proposals += 1
            if self.wrong_every and self.proposals % self.wrong_every == 0:
                tok = (tok + 1) % self.pair.info["vocab_size"]
            out.append(tok)
        return out
