"""The DFlash decode loop. One step: the drafter fills a block [last token, MASK x (B-1)] in one pass,
the target verifies the block in one pass, the longest agreeing prefix plus one target token is
committed, and the committed positions' features become the drafter's next context.
Plain decoding is the same loop with block size 1 and no drafter, so comparisons are fair."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from .errors import PromptTooLongError, SettingsError
from .pair import Pair
from .sampling import SamplingSettings, draw, probabilities, propose, verify
from .stats import Stats, peak_memory_bytes
from .text import TextStream

CPU_DRAFT_CUTOFF = 0.05   # measured on the demo pair: see docs/BENCHMARKS.md, "Draft cutoff"


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    block_size: int | None = None      # None: the drafter's own; 1: plain decoding
    stop_strings: tuple[str, ...] = ()
    rule: str = "residual"
    # Verify drafts only while the drafter's running confidence (product of its top probability per
    # slot, see confident_prefix) stays at or above this. None: automatic (CPU_DRAFT_CUTOFF on a CPU, where each
    # verified token costs compute; 0.0, the whole block, on a GPU, where verifying 16 tokens costs
    # about as much as one). Lossless at any value: it only decides how many drafts are checked.
    draft_cutoff: float | None = None

    def __post_init__(self):
        if not 1 <= self.max_new_tokens <= 1_000_000:
            raise SettingsError(f"max_new_tokens must be between 1 and 1,000,000, got {self.max_new_tokens}.")
        if self.block_size is not None and not 1 <= self.block_size <= 64:
            raise SettingsError(f"block_size must be between 1 and 64, got {self.block_size}.")
        if self.draft_cutoff is not None and not 0.0 <= self.draft_cutoff < 1.0:
            raise SettingsError(f"draft_cutoff must be at least 0 and below 1, got {self.draft_cutoff}.")
        self.sampling  # validates temperature, top-p, top-k

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_p, self.top_k, self.rule)


@dataclass
class Step:
    """What one verify pass committed (the first Step is the prefill's token)."""
    tokens: list[int]
    drafted: list[bool]               # per token: proposed by the drafter (True) or the target
    spans: list[tuple[str, bool]]     # settled text, split by drafted/target origin
    proposed: int = 0                 # draft tokens offered this step
    accepted: int = 0                 # of which the target kept
    stop_reason: str | None = None    # set on the last step: eos, length, stop_string, context_full, cancelled

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.spans)


class Generation:
    """One generation; iterate it to run the loop step by step. cancel() may be called from another
    thread and takes effect before the next step."""

    def __init__(self, pair: Pair, prompt_ids: list[int], settings: GenerationSettings = GenerationSettings(),
                 baseline: bool = False):
        self.pair, self.settings = pair, settings
        self.prompt = list(prompt_ids)
        if not self.prompt:
            raise SettingsError("The prompt is empty: give at least one token.")
        limit = pair.target.max_positions
        if len(self.prompt) >= limit:
            raise PromptTooLongError(
                f"The prompt has {len(self.prompt)} tokens but the model's context holds {limit}. "
                "Shorten the prompt or start a new conversation.")
        drafter_block = pair.block_size
        wanted = 1 if baseline or pair.drafter is None else (settings.block_size or drafter_block)
        if wanted > drafter_block:
            raise SettingsError(f"block_size {wanted} exceeds the drafter's block size {drafter_block}.")
        self.block_size = wanted
        cutoff = settings.draft_cutoff
        self.draft_cutoff = (CPU_DRAFT_CUTOFF if pair.target.device.type == "cpu" else 0.0) if cutoff is None else cutoff
        self.stats = Stats(block_size=wanted, prompt_tokens=len(self.prompt))
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self.stream = TextStream(pair.tokenizer, settings.stop_strings) if pair.tokenizer else None
        self._cancel = threading.Event()

    @property
    def text(self) -> str:
        return self.stream.text if self.stream else ""

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> "Generation":
        for _ in self:
            pass
        return self

    def __iter__(self):
        with torch.inference_mode():
            yield from self._loop()

    def _loop(self):
        pair, s = self.pair, self.settings
        target, sampling = pair.target, s.sampling
        drafter = pair.drafter if self.block_size > 1 else None
        device = target.device
        gen = torch.Generator(device=device)
        gen.manual_seed(s.seed) if s.seed is not None else gen.seed()
        start = time.perf_counter()

        target.reset()
        logits, feats = target.forward(torch.tensor([self.prompt], device=device), last_only=True,
                                       features=drafter is not None)
        first = int(logits[-1].argmax()) if sampling.greedy else int(draw(probabilities(logits[-1:], sampling), gen)[0])
        self.stats.prefill_s = time.perf_counter() - start
        step = self._commit([first], [False], 0, 0)
        self.stats.ttft_s = time.perf_counter() - start
        yield step

        runner = pair.draft_runner if drafter else None
        if runner is not None:
            runner.reset()
        ctx_feats = feats
        last = first
        decode_start = time.perf_counter()
        while self.stop_reason is None:
            if self._cancel.is_set():
                self.stop_reason = "cancelled"
                yield Step([], [], self._take(final=True), stop_reason="cancelled")
                break
            pos = target.cached_length            # position of `last`, not yet seen by the target
            room = target.max_positions - pos
            if room < 1:
                self.stop_reason = "context_full"
                yield Step([], [], self._take(final=True), stop_reason="context_full")
                break
            width = min(self.block_size, room)
            if drafter is not None and width > 1:
                drafts, q = self._draft(runner, last, pos, width, ctx_feats, sampling, gen)
            else:
                drafts, q = torch.empty(0, dtype=torch.long, device=device), None
            block = torch.cat([torch.tensor([last], device=device), drafts]).unsqueeze(0)
            logits, feats = target.forward(block, features=drafter is not None)
            n, own = verify(drafts, q, logits, sampling, gen)
            target.crop(pos + 1 + n)
            if drafter is not None:
                ctx_feats = feats[: n + 1]
            self.stats.record_step(len(drafts), n)
            committed = drafts[:n].tolist() + [own]
            last = own
            yield self._commit(committed, [True] * n + [False], len(drafts), n)
        self.stats.decode_s = time.perf_counter() - decode_start
        self.stats.peak_memory_bytes = peak_memory_bytes(device)

    def _draft(self, runner, last, pos, width, ctx_feats, sampling, gen):
        """Propose up to width-1 tokens after `last` (at position pos); returns (drafts, q or None)."""
        block = torch.full((width,), runner.config.mask_token_id, dtype=torch.long, device=ctx_feats.device)
        block[0] = last
        logits = runner.logits(self.pair.target.embed(block), ctx_feats)
        drafts, q = propose(logits, sampling, gen)
        if self.draft_cutoff > 0:
            keep = confident_prefix(logits, q, self.draft_cutoff)
            drafts, q = drafts[:keep], (q[:keep] if q is not None else None)
        return drafts, q

    def _commit(self, tokens, drafted, proposed, accepted) -> Step:
        """Apply EOS, max-tokens and stop strings token by token, so nothing past a stop is emitted."""
        kept, kept_flags = [], []
        eos = self.pair.eos_ids
        for tok, flag in zip(tokens, drafted):
            if tok in eos:
                self.stop_reason = "eos"
                break
            kept.append(tok)
            kept_flags.append(flag)
            self.tokens.append(tok)
            self.stats.generated_tokens += 1
            if self.stream is not None:
                self.stream.push(tok, flag)
                if self.stream.stop_strings and self.stream.find_stop():
                    self.stop_reason = "stop_string"
                    break
            if len(self.tokens) >= self.settings.max_new_tokens:
                self.stop_reason = "length"
                break
        return Step(kept, kept_flags, self._take(final=self.stop_reason is not None),
                    proposed=proposed, accepted=accepted, stop_reason=self.stop_reason)

    def _take(self, final: bool):
        return self.stream.take(final) if self.stream else []


def confident_prefix(logits: torch.Tensor | None, q: torch.Tensor | None, cutoff: float) -> int:
    """How many leading drafts to verify: those where the running product of the drafter's top
    probability per slot (a rough chance that all of them are accepted) is >= cutoff. It reads the
    drafter's distributions only, never the tokens drawn from them, so speculative sampling stays exact."""
    probs = torch.softmax(logits.float(), dim=-1) if q is None else q
    return int((torch.cumprod(probs.max(-1).values, 0) >= cutoff).sum())
