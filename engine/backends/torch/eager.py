"""The eager torch engine: the operations the decode loop calls (the contract is in
engine/backends/__init__.py) on a Hugging Face target with our drafter packed for decoding (or drafts from
n-gram lookup, engine/lookup.py), sampling on the device, caches rolled back to the accepted prefix after every
verify. Runs on every device; on CUDA the static engine (cuda.py) takes the architectures it has graphs for."""
from __future__ import annotations

import torch

from ...errors import EngineError
from ...limits import GenerationSettings
from ...tokenizer import ChatTokenizer
from . import cpu
from ...draft_vocab import DraftVocab
from .answer import block_embeddings, draft_over, hold, memory
from .draft2_runner import Draft2Runner
from .draft_runner import DraftRunner
from .drafter import DFlashDrafter
from .drafter2 import DFlash2Drafter
from .dspark import DSparkDrafter, DSparkRunner
from .eagle3 import Eagle3Drafter, Eagle3Runner
from .sampling import propose, verify
from .target import TargetModel

# drafter generation (engine/config.py) -> the module that loads it and the runner that decodes with it
DRAFTERS = {1: (DFlashDrafter, DraftRunner), 2: (DFlash2Drafter, Draft2Runner), 3: (DSparkDrafter, DSparkRunner),
            4: (Eagle3Drafter, Eagle3Runner)}


class TorchPair:
    """A loaded pair and the state of its current answer (one at a time)."""

    capabilities = frozenset()     # a step engine; what it holds is freed with the object

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, tokenizer: ChatTokenizer | None,
                 name: str = "", family: str = "", vocab: DraftVocab | None = None):
        hold(self, target, drafter, tokenizer, name, family, target.max_positions, vocab)
        self.runner = (DRAFTERS[drafter.generation][1](drafter, target.head.weight, runner_dtype(self.device),
                                                       self.vocab) if drafter else None)
        self.auto_cutoff = cpu.DRAFT_CUTOFF if self.device.type == "cpu" else 0.0

    # -- the operations the loop calls ---------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompt: list[int], settings: GenerationSettings, drafting: bool) -> int:
        a = self.answer
        a.start(settings, drafting, self.runner is not None,
                self.auto_cutoff if settings.draft_cutoff is None else settings.draft_cutoff, prompt)
        self.target.reset()
        logits, feats = self.target.forward(torch.tensor([prompt], device=self.device), last_only=True,
                                            features=a.drafting)
        self.target.rollback(len(prompt))   # nothing to forget; ends the caches' recording of this forward
        if a.drafting:
            a.context = [feats]
            self.runner.reset()
        draft_over(self, settings)
        return a.choose(logits[-1:])

    @torch.inference_mode()
    def draft(self, last: int, pos: int, width: int) -> list[int]:
        if self.answer.lookup is not None:
            return self.answer.look_up(width)
        a, cfg = self.answer, self.runner.config
        context, tokens = a.unread_context()
        if cfg.generation == 4:    # a token per pass, each after the one before; the cutoff reads their logits
            drafts, q, logits = self.runner.propose(context, [*tokens[1:], last], self.target.embed, width - 1,
                                                    a.settings, a.gen)
            return a.keep_drafts(drafts, q, (logits, q)).tolist()
        embeds = block_embeddings(self.target, cfg, last, cfg.input_width(width))
        if cfg.generation == 2:   # one path picked by the candidate selector; the cutoff reads its distributions
            drafts, q, rows = self.runner.propose(embeds, context, last, a.settings, a.gen)
            confidence = (None, rows)
        elif cfg.generation == 3:  # left to right through the Markov head; the cutoff reads the biased logits
            drafts, q, logits = self.runner.propose(embeds, context, last, a.settings, a.gen)
            confidence = (logits, q)
        else:
            logits = self.runner.logits(embeds, context)
            drafts, q = propose(logits, a.settings, a.gen, self.runner.ids)
            confidence = (logits, q)
        return a.keep_drafts(drafts, q, confidence).tolist()

    @torch.inference_mode()
    def verify(self, last: int, pos: int, drafts: list[int]) -> tuple[int, int]:
        if self.target.cached_length != pos:
            raise EngineError(f"Internal error: the loop is at position {pos} but the target's cache holds "
                              f"{self.target.cached_length} positions.", code="internal")
        a = self.answer
        block = torch.tensor([[last, *drafts]], device=self.device)
        logits, feats = self.target.forward(block, features=a.drafting)
        n, own = verify(block[0, 1:], a.take_q(bool(drafts)), logits, a.settings, a.gen,
                        a.history.windows(last, drafts))
        a.verified = (pos, feats)
        return a.kept(last, drafts, n, own)

    @torch.inference_mode()
    def commit(self, length: int) -> None:
        self.target.rollback(length)
        self.answer.commit(length)

    def stop_drafting(self) -> None:
        self.answer.stop_drafting()

    def memory(self) -> dict:
        return memory(self.device)


def runner_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype the drafter's packed layers run in: the CPU's choice there, the drafter's own elsewhere."""
    return cpu.draft_dtype() if device.type == "cpu" else None
