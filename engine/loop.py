"""The one DFlash decode loop, shared by every engine (engine/backends/, docs/ENGINES.md).

One step: the engine's drafter fills a block [last token, MASK x (B-1)] in one pass, the target
verifies the block in one pass, the longest agreeing prefix plus one target token is committed, and
the engine rolls its caches back to that prefix. Plain decoding is the same loop with block size 1,
so comparisons are fair. The loop owns the position, the stop rules (EOS, max tokens, stop strings,
the loop guard, a full context, cancel), the text stream, the statistics and the plain fallback; it never touches a
tensor, so it imports no array library.

Every engine reaches the loop as one stream of timed chunks: an engine that drafts and verifies on its
own (a llama-server) streams them itself, and a step engine's prefill/draft/verify/commit become chunks
in StepStream. What an engine can do beyond its operations it declares in `capabilities`; the loop
reads that set and never probes.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass

from .backends import METHODS, Chunk
from .config import GENERATION_METHODS
from .errors import PromptTooLongError, SettingsError
from .limits import GenerationSettings
from .penalties import LoopGuard
from .stats import Stats, cuda_memory
from .text import TextStream

# The plain fallback waits for this many DFlash steps, then switches when both the whole answer so far
# and its last FALLBACK_WINDOW steps committed fewer tokens per step than the break-even: acceptance
# swings between stretches of an answer (a docstring, then code), and only a sustained collapse (a
# thinking-mode mismatch, a drafter for another model) should end DFlash. docs/BENCHMARKS.md, "Plain
# fallback", replays the demo pair's held-out prompts under other choices.
FALLBACK_MIN_STEPS = 32
FALLBACK_WINDOW = 16
# The plain step cost comes from other answers (other contexts, other moments of a busy machine), so
# DFlash must be clearly slower, not just slower: below this share of the plain rate.
FALLBACK_MARGIN = 0.8


@dataclass
class Step:
    """What one verify pass committed (the first Step is the prefill's token)."""
    tokens: list[int]
    drafted: list[bool]               # per token: proposed by the drafter (True) or the target
    spans: list[tuple[str, bool]]     # settled text, split by drafted/target origin
    proposed: int = 0                 # draft tokens offered this step
    accepted: int = 0                 # of which the target kept
    stop_reason: str | None = None    # set on the last step: eos, length, stop_string, loop, context_full, cancelled
    fallback: dict | None = None      # set on the step after which the loop switched to plain decoding

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.spans)


class StepCosts:
    """Seconds per plain step of one loaded pair on this machine, from the plain steps it has run
    (baselines, fallbacks, and one probe step when nothing else measured it). Whoever holds the pair holds
    these (the worker, a benchmark) and hands them to each Generation; a new pair starts with new ones."""

    def __init__(self):
        self.plain: deque[float] = deque(maxlen=16)

    @property
    def plain_s(self) -> float | None:
        return statistics.median(self.plain) if self.plain else None


class DFlashSteps:
    """The DFlash steps of one answer, as the plain fallback reads them: running totals over the whole
    answer and its last FALLBACK_WINDOW steps (judged after every step, so nothing is summed again)."""

    def __init__(self):
        self.count, self.tokens, self.seconds = 0, 0, 0.0
        self.recent: deque[tuple[int, float]] = deque(maxlen=FALLBACK_WINDOW)

    def add(self, tokens: int, seconds: float) -> None:
        self.count, self.tokens, self.seconds = self.count + 1, self.tokens + tokens, self.seconds + seconds
        self.recent.append((tokens, seconds))


class StepStream:
    """A step engine (prefill/draft/verify/commit) as a stream of chunks, one per verify, timed. The loop
    ends drafting through stop_drafting() (the plain fallback) and answers probe() before each step:
    true while a plain step must first measure what plain decoding costs."""

    capabilities = frozenset({"stop_drafting"})

    def __init__(self, pair, width: int, probe):
        self.pair, self.width, self.probe = pair, width, probe
        self.drafting = width > 1

    def stop_drafting(self) -> None:
        self.drafting = False
        self.pair.stop_drafting()

    def stream(self, prompt: list[int], settings: GenerationSettings):
        pair = self.pair
        start = time.perf_counter()
        last = pair.prefill(prompt, settings, self.drafting)
        yield Chunk([last], [False], seconds=time.perf_counter() - start)
        pos = len(prompt)                          # `last` sits at pos, not yet seen by the target
        while True:
            room = pair.max_positions - pos
            if room < 1:
                yield Chunk([], stop="context_full")
                return
            width = min(self.width, room) if self.drafting and not self.probe() else 1
            start = time.perf_counter()
            drafts = pair.draft(last, pos, width) if width > 1 else []
            drafted = time.perf_counter()
            n, last = pair.verify(last, pos, drafts)
            pos += n + 1
            pair.commit(pos)
            yield Chunk(drafts[:n] + [last], [True] * n + [False], seconds=time.perf_counter() - start,
                        draft_seconds=drafted - start if width > 1 else None,
                        proposed=len(drafts), accepted=n, plain=width == 1)


class Generation:
    """One generation; iterate it to run the loop step by step. cancel() may be called from another
    thread and takes effect before the next step."""

    def __init__(self, pair, prompt_ids: list[int], settings: GenerationSettings = GenerationSettings(),
                 baseline: bool = False, costs: StepCosts | None = None):
        self.pair, self.settings = pair, settings
        self.costs = costs if costs is not None else StepCosts()
        self.prompt = list(prompt_ids)
        if not self.prompt:
            raise SettingsError("The prompt is empty: give at least one token.")
        self.limit = limit = min(pair.max_positions, settings.context_length or pair.max_positions)
        if len(self.prompt) >= limit:
            held = ("the model's context holds" if limit == pair.max_positions
                    else "the context length setting allows")
            raise PromptTooLongError(
                f"The prompt has {len(self.prompt)} tokens but {held} {limit}. "
                "Shorten the prompt or start a new conversation.")
        methods = pair.info.get("methods") or ("none", "dspark", "dflash", "dflash2")   # a step engine runs its drafter
        if settings.method is not None and settings.method not in methods:
            raise SettingsError(f"This model runs {', '.join(METHODS[m] for m in methods if m in METHODS)}, not "
                                f"{METHODS[settings.method]}: choose one of those, or let the engine choose.")
        baseline = baseline or settings.method == "none"
        # how this answer speculates, in words (its fallback says so): named, the engine's choice, or DFlash
        named = settings.method or pair.info.get("method")
        self.method_label = METHODS[named if named not in (None, "none") else "dflash"]
        block, whose = pair.block_size, "the drafter's"
        if named == "ngram" and "ngram_block" in pair.info:   # blocks of its own (torch: also without a drafter)
            block, whose = pair.info["ngram_block"], "n-gram lookup's"
        wanted = 1 if baseline or block == 1 else (settings.block_size or block)
        if wanted > block:
            raise SettingsError(f"block_size {wanted} exceeds {whose} block size {block}.")
        self.block_size = wanted
        self.stats = Stats(block_size=wanted, prompt_tokens=len(self.prompt),
                           speculation=named if named not in (None, "none") else "dflash")
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self.fallback: dict | None = None
        self.stream = TextStream(pair.tokenizer, settings.stop_strings) if pair.tokenizer else None
        self.loop_guard = LoopGuard(settings.loop_guard)
        self._cancel = threading.Event()
        self._streaming = False          # inside a streaming engine's request (cancel interrupts it)
        self.started: float | None = None   # perf_counter when the answer's clock started (after prepare)

    @property
    def text(self) -> str:
        return self.stream.text if self.stream else ""

    def cancel(self) -> None:
        """Stop after the current step; a streaming engine that can (llama.cpp) is also woken from a read
        that waits on its server, so cancel takes effect at once even when the server has stopped sending."""
        self._cancel.set()
        if "interrupt" in self.pair.capabilities and self._streaming:
            try:
                self.pair.interrupt()
            except Exception:   # noqa: BLE001 - the flag above still stops the answer after its next step
                pass

    def run(self) -> "Generation":
        for _ in self:
            pass
        return self

    def __iter__(self):
        pair, s = self.pair, self.settings
        baseline = self.block_size == 1
        stepping = "stream" not in pair.capabilities
        source = StepStream(pair, self.block_size, lambda: judging and self.costs.plain_s is None) if stepping else pair
        # Timing decides when the fallback happens, and a sampled answer depends on it: a seeded sampled
        # answer must come out the same every time, so it never falls back.
        judging = (not baseline and "stop_drafting" in source.capabilities and s.plain_fallback
                   and (s.greedy or s.seed is None))
        measures_plain = "stop_drafting" in source.capabilities     # only an engine that can stop needs it
        costs, dflash_steps = self.costs, DFlashSteps()
        if costs.plain_s is None and "plain_step_s" in pair.capabilities and pair.plain_step_s:
            costs.plain.append(pair.plain_step_s)       # until this pair's own plain steps measure it
        interruptible = "interrupt" in pair.capabilities
        if interruptible:                   # the engine asks it while it starts a server or connects
            pair.cancelled = self._cancel.is_set
        self._streaming = True
        chunks = None
        try:
            if "prepare" in pair.capabilities:      # a server started for this answer is not the answer's time
                pair.prepare(s, baseline)
            start = self.started = time.perf_counter()
            chunks = source.stream(self.prompt, s) if stepping else pair.stream(self.prompt, s, baseline=baseline)
            decode_start = arrived = None
            for chunk in chunks:
                if chunk.stop:
                    yield self._end(chunk.stop)
                    break
                now = time.perf_counter()
                if chunk.totals is not None:
                    self.stats.record_totals(**chunk.totals)
                if chunk.method:                         # the engine's own pick for this answer (llama.cpp)
                    self.stats.speculation, self.method_label = chunk.method, METHODS[chunk.method]
                switched = bool(chunk.fallback) and self.fallback is None
                if switched:
                    self.fallback = self.stats.fallback = chunk.fallback
                plain_step = chunk.plain if chunk.plain is not None else baseline
                first = chunk.tokens and decode_start is None
                if first:
                    decode_start = now
                    self.stats.prefill_s = now - start
                elif chunk.tokens:                               # a step after the prompt's first token
                    elapsed = chunk.seconds if chunk.seconds is not None else now - arrived
                    if plain_step and measures_plain:
                        costs.plain.append(elapsed)
                    elif not plain_step and self.fallback is None:
                        dflash_steps.add(len(chunk.tokens), elapsed)
                    if chunk.proposed is not None:
                        self.stats.record_step(chunk.proposed, chunk.accepted,
                                               chunk.draft_seconds if self._drafter_drafts() else None)
                if chunk.tokens:
                    arrived = now
                step = self._commit(chunk.tokens, chunk.drafted or [False] * len(chunk.tokens),
                                    chunk.proposed or 0, chunk.accepted)
                if first:
                    self.stats.ttft_s = time.perf_counter() - start
                step.fallback = self.fallback if switched else None
                if (judging and not plain_step and self.fallback is None and dflash_steps.count
                        and self.stop_reason is None):
                    step.fallback = self._judge(dflash_steps, costs)
                    if step.fallback:
                        source.stop_drafting()
                if step.tokens or step.spans or step.stop_reason or step.fallback:
                    yield step
                if self.stop_reason is not None or self._cancel.is_set():
                    break
        finally:
            self._streaming = False
            if chunks is not None:
                chunks.close()
            if interruptible:      # a later server start (a count, the next load) is not this cancel
                pair.cancelled = _never
        if self.stop_reason is None:
            yield self._end("cancelled" if self._cancel.is_set() else "eos")
        self.stats.decode_s = time.perf_counter() - (decode_start or start)
        if self.stats.drafted and self._drafter_drafts():
            self.stats.draft_vocab = getattr(pair, "draft_vocab", None)
        self._record_memory(pair.memory())

    def _drafter_drafts(self) -> bool:
        """Whether a drafter (not n-gram lookup) writes this answer's drafts: only its draft pass and vocabulary go
        into the stats."""
        return self.stats.speculation in GENERATION_METHODS.values()

    def _record_memory(self, memory: dict) -> None:
        self.stats.peak_memory_bytes = int(memory.get("peak_bytes", 0))
        for name, value in cuda_memory(memory).items():
            setattr(self.stats, name, value)

    def _judge(self, steps: DFlashSteps, costs: StepCosts) -> dict | None:
        """Switch to plain decoding when DFlash commits tokens at under FALLBACK_MARGIN of plain decoding's
        measured rate, over the answer so far and over its recent steps alike; or when its steps never
        commit more than one token."""
        if steps.count < FALLBACK_MIN_STEPS or costs.plain_s is None:
            return None
        recent = (sum(n for n, _ in steps.recent), sum(s for _, s in steps.recent), len(steps.recent))
        parts = [(steps.tokens, steps.seconds, steps.count), recent]   # (tokens, seconds, steps) each
        tau = max(tokens / count for tokens, _, count in parts)
        step_s = steps.seconds / steps.count
        break_even = step_s / costs.plain_s          # tokens per step at which DFlash only keeps pace
        rates = [tokens / seconds for tokens, seconds, _ in parts]
        if tau > 1.0 and max(rates) >= FALLBACK_MARGIN / costs.plain_s:
            return None
        share = max(rates) * costs.plain_s
        self.fallback = {"after_tokens": len(self.tokens), "tau": tau, "break_even": break_even,
                         "dflash_step_ms": step_s * 1000, "plain_step_ms": costs.plain_s * 1000,
                         "speed_share": share,
                         "reason": (f"{self.method_label} kept none of its drafts over its first {steps.count} steps: "
                                    f"one token per step, which gains nothing whatever this pair's break-even "
                                    f"({break_even:.2f} here), so the rest of the answer used plain decoding."
                                    if tau <= 1.0 else
                                    f"{self.method_label} committed {tau:.2f} tokens per step over its first "
                                    f"{steps.count} steps, below this pair's break-even of {break_even:.2f} on this "
                                    f"machine (it ran at {share:.0%} of plain decoding's speed), so the rest of the "
                                    "answer used plain decoding.")}
        self.stats.fallback = self.fallback
        return self.fallback

    def _end(self, reason: str) -> Step:
        self.stop_reason = reason
        return Step([], [], self._take(final=True), stop_reason=reason)

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
            if self.loop_guard.push(tok):
                self.stop_reason = "loop"
                break
            if self.limit < self.pair.max_positions and len(self.prompt) + len(self.tokens) >= self.limit:
                self.stop_reason = "context_full"
                break
        return Step(kept, kept_flags, self._take(final=self.stop_reason is not None),
                    proposed=proposed, accepted=accepted, stop_reason=self.stop_reason)

    def _take(self, final: bool):
        return self.stream.take(final) if self.stream else []


def _never() -> bool:
    return False
