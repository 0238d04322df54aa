"""What both torch engines keep of one answer between the loop's calls (eager.py everywhere, cuda.py's static
engine on NVIDIA GPUs): the sampling rule and its random generator, whether the drafter drafts and its
confidence cutoff, the target features the drafter has not read, the last verify's features and the last
draft's proposal distribution, n-gram lookup's context; and what they describe alike (info, memory). The two
engines compose these rather than one subclassing the other."""
from __future__ import annotations

import torch

from ...config import GENERATION_METHODS
from ...draft_vocab import DraftVocab, for_generation
from ...limits import GenerationSettings
from ...penalties import History
from ...stats import process_peak_bytes
from . import NAME, cpu
from ...lookup import NGRAM_BLOCK, Lookup
from .sampling import Candidates, draw, penalize, probabilities


class Answer:
    def __init__(self, device: torch.device):
        self.device = device
        self.settings = GenerationSettings()
        self.gen: torch.Generator | None = None
        self.drafting = False
        self.cutoff = 0.0
        self.context: list[torch.Tensor] = []     # committed positions' features the drafter has not read
        self.tokens: list[int] = []               # and their tokens (EAGLE-3 reads them beside the features)
        self.verified: tuple[int, torch.Tensor | None] = (0, None)   # (position, features) of the last verify
        self.q: torch.Tensor | Candidates | None = None   # the last draft's proposal distribution (sampling)
        self.history = History()                  # the tokens the repeat penalty reads
        self.lookup: Lookup | None = None         # n-gram lookup's context, when it drafts this answer

    def start(self, settings: GenerationSettings, drafting: bool, drafter: bool, cutoff: float,
              prompt: list[int]) -> None:
        """A new answer: its sampling rule, a generator seeded by it (or at random), nothing drafted yet. Drafts
        come from n-gram lookup when the settings name it or there is no drafter, else from the drafter."""
        lookup = drafting and (settings.method or ("dflash" if drafter else "ngram")) == "ngram"
        self.settings, self.drafting, self.cutoff = settings, drafting and drafter and not lookup, cutoff
        self.lookup = Lookup(prompt) if lookup else None
        self.history = History(prompt, settings.penalized)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(settings.seed) if settings.seed is not None else self.gen.seed()
        self.context, self.verified, self.q = [], (0, None), None
        self.tokens = list(prompt) if self.drafting else []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def choose(self, logits: torch.Tensor) -> int:
        """The token after the last row of logits (the prompt's last), by the answer's sampling rule; n-gram
        lookup's context ends with it."""
        if self.settings.penalized:
            logits = penalize(logits[-1:], [self.history.tokens], self.settings.repeat_penalty)
        token = int(logits[-1].argmax()) if self.settings.greedy else int(
            draw(probabilities(logits, self.settings), self.gen)[0])
        if self.lookup is not None:
            self.lookup.extend([token])
        return token

    def unread_context(self) -> tuple[torch.Tensor, list[int]]:
        """The features committed since the drafter last ran, and those positions' tokens, handed to it once."""
        context = torch.cat(self.context) if len(self.context) > 1 else self.context[0]
        tokens, self.context, self.tokens = self.tokens, [], []
        return context, tokens

    def keep_drafts(self, drafts, q, confidence):
        """The drafts up to the cutoff's confident prefix; their proposal distribution waits for verify."""
        if self.cutoff > 0:
            keep = cpu.confident_prefix(*confidence, self.cutoff)
            drafts, q = drafts[:keep], (q[:keep] if q is not None else None)
        self.q = q
        return drafts

    def look_up(self, width: int) -> list[int]:
        """n-gram lookup's drafts for a block of `width`. Its proposal is certain (q is one at the draft), so the
        residual rule keeps a draft x with probability p(x) and else draws from p without x: exact sampling."""
        drafts = self.lookup.propose(width - 1)
        self.q = None
        if drafts and not self.settings.greedy:
            ids = torch.tensor(drafts, device=self.device)[:, None]
            self.q = Candidates(ids, torch.ones(ids.shape, device=self.device))
        return drafts

    def take_q(self, drafted: bool):
        """The proposal distribution of the drafts being verified (none for a plain step), used once."""
        q, self.q = (self.q if drafted else None), None
        return q

    def kept(self, last: int, drafts: list[int], n: int, own: int) -> tuple[int, int]:
        """A verify kept `last`, its first n drafts and the target's own token: the repeat penalty and n-gram
        lookup read them from now on. Returns (n, own), the verify's answer."""
        self.history.advance(last, drafts, n)
        if self.drafting:
            self.tokens += [last, *drafts[:n]]
        if self.lookup is not None:
            self.lookup.extend([*drafts[:n], own])
        return n, own

    def commit(self, length: int, copy: bool = False) -> None:
        """The kept new positions' features feed the drafter's next context (copied where the verify's
        output buffer is overwritten by the next step)."""
        pos, feats = self.verified
        if self.drafting and feats is not None:
            kept = feats[: length - pos]
            self.context.append(kept.clone() if copy else kept)
        self.verified = (0, None)

    def stop_drafting(self) -> None:
        self.drafting, self.context, self.tokens, self.lookup = False, [], [], None


def hold(pair, target, drafter, tokenizer, name: str, family: str, max_positions: int,
         vocab: DraftVocab | None = None) -> None:
    """What both engines keep of a loaded pair: its parts, the contract's fields, one answer's state; on a CPU
    the target tuned for it (the static engine runs there only in the tests). A DFlash drafter's frequency
    ranking (engine/draft_vocab.py) is kept for its runner where its generation drafts from one."""
    pair.target, pair.drafter, pair.tokenizer, pair.name = target, drafter, tokenizer, name
    pair.vocab = for_generation(vocab, drafter.generation) if drafter is not None else None
    pair.draft_vocab = None       # the answer's draft vocabulary size (None: every token), for its stats
    pair.device = target.device
    if pair.device.type == "cpu":
        cpu.tune_target(target.model)
    pair.eos_ids = tokenizer.eos_ids if tokenizer else ()
    pair.block_size = drafter.config.verify_width if drafter else 1
    pair.max_positions = max_positions
    pair.info = pair_info(target, drafter, tokenizer, name, family, max_positions)
    pair.info["draft_vocab"] = len(pair.vocab.ranked) if pair.vocab else None   # tokens ranked
    pair.answer = Answer(pair.device)


def draft_over(pair, settings: GenerationSettings) -> None:
    """The answer's draft vocabulary: the size its settings name, else the drafter's default (DraftVocab.chosen); an
    EAGLE-3 drafter's own head where it covers fewer tokens than the target's."""
    if pair.runner is None or pair.vocab is None:
        pair.draft_vocab = pair.runner.config.own_head_size if pair.runner is not None else None
        return
    pair.draft_vocab = pair.runner.use_vocabulary(settings.draft_vocab, pair.device.type == "cpu")


def block_embeddings(target, config, last: int, width: int) -> torch.Tensor:
    """The drafter's input block [last, MASK x (width-1)] through the target's embedding."""
    block = torch.full((width,), config.mask_token_id, dtype=torch.long, device=target.device)
    block[0] = last
    embeds = target.embed(block)
    return embeds * config.input_embedding_scale if config.input_embedding_scale != 1.0 else embeds


def pair_info(target, drafter, tokenizer, name: str, family: str, max_positions: int) -> dict:
    """The loaded event's description of a torch pair (docs/PROTOCOL.md, `loaded`)."""
    return {"engine": NAME, "device": str(target.device),
            "dtype": target.quantization or str(target.embedding.weight.dtype).removeprefix("torch."),
            "architecture": family or getattr(target.model.config, "model_type", ""),
            "name": name, "block_size": drafter.config.verify_width if drafter else 1,
            "has_drafter": drafter is not None, "drafter_generation": drafter.generation if drafter else None,
            # every pair can run n-gram lookup, in blocks of its own; the drafter's method is the default, and a
            # target alone speculates with n-gram lookup (a step without a match is a plain step, and the plain
            # fallback ends it where it does not pay)
            "methods": ["none", "ngram", *([GENERATION_METHODS[drafter.generation]] if drafter else [])],
            "method": GENERATION_METHODS[drafter.generation] if drafter else "ngram",
            "ngram_block": NGRAM_BLOCK,
            "has_tokenizer": tokenizer is not None, "chat_template": bool(tokenizer and tokenizer.has_template),
            "supports_thinking": bool(tokenizer and tokenizer.supports_thinking),
            "vocab_size": target.vocab_rows, "max_positions": max_positions, "layers": target.num_layers}


def memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_bytes": int(torch.cuda.max_memory_allocated(device)),
                "reserved_bytes": int(torch.cuda.memory_reserved(device))}
    return {"peak_bytes": process_peak_bytes()}
