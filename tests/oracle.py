"""A test drafter that proposes the target's own greedy continuation (optionally with planted
mistakes), so full- and partial-acceptance paths run with exactly known outcomes."""
import torch

from engine.decode import Generation


class OracleGeneration(Generation):
    def __init__(self, *args, reference: list[int], wrong_every: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.reference = reference
        self.wrong_every = wrong_every
        self.proposals = 0

    def _draft(self, runner, last, pos, width, ctx_feats, sampling, gen):
        done = pos - len(self.prompt) + 1              # reference tokens already committed
        out = []
        for k in range(width - 1):
            i = done + k
            tok = self.reference[i] if i < len(self.reference) else 0
            self.proposals += 1
            if self.wrong_every and self.proposals % self.wrong_every == 0:
                tok = (tok + 1) % self.pair.target.vocab_rows
            out.append(tok)
        return torch.tensor(out, dtype=torch.long), None
