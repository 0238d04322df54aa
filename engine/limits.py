"""The one table of generation settings and their limits, and the settings object built from it.

Pure standard library: the window (settings file, settings dialog), the worker protocol, the CLI and
the decode loop all read their ranges, defaults and help texts here, so no two of them can disagree.
Every check names the setting, the limit and what to do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .backends import METHODS
from .errors import SettingsError

SEED_MAX = 2**63 - 1
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
RULES = ("residual", "match")
# The largest request body the local OpenAI-compatible server reads (dflash_desktop/server.py): far more than
# any context holds as text, far below what one worker command line may carry (protocol.MAX_LINE_BYTES).
MAX_REQUEST_BYTES = 8 * 2**20
# Positions the engines with caches sized once hold (llama.cpp's server, the torch engine's CUDA path) unless
# the model's own limit is lower; the model picker's memory estimate counts this many (dflash_desktop/fit.py).
DEFAULT_CONTEXT = 8192
# The repeat penalty reads this many most recent tokens (prompt and answer), as llama.cpp's repeat_last_n.
REPEAT_WINDOW = 64


@dataclass(frozen=True)
class Limit:
    """One numeric setting. `low`/`high` bound it (`open_low`/`open_high`: that end is excluded);
    `zero`, when set, says what 0 stands for below a positive `low` ("off", "greedy")."""
    name: str
    kind: type            # int or float
    low: float
    high: float
    default: Any
    label: str
    help: str
    open_low: bool = False
    open_high: bool = False
    zero: str = ""
    optional: bool = False   # None allowed (means: automatic / the drafter's own / random)

    def describe(self) -> str:
        if self.open_low:
            span = f"above {self.low:g} and at most {self.high:g}"
        elif self.open_high:
            span = f"at least {self.low:g} and below {self.high:g}"
        else:
            span = f"from {self.low:g} to {self.high:g}"
        return f"0 ({self.zero}) or {span}" if self.zero else span

    def check(self, value: Any, name: str | None = None) -> Any:
        """The value, or SettingsError naming the setting (as `name`, default its key) and its limits."""
        name = name or self.name
        if value is None:
            if self.optional:
                return None
            raise SettingsError(f"{name} needs a value: {self.describe()}.")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{name} must be a number, got {value!r}.")
        if self.kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise SettingsError(f"{name} must be a whole number, got {value!r}.")
            value = int(value)
        elif abs(value) > 1e300 or not math.isfinite(value):   # an integer past that never becomes a float
            raise SettingsError(f"{name} must be a finite number: {self.describe()}.")
        if self.zero and value == 0:
            return self.kind(0)
        below = value <= self.low if self.open_low else value < self.low
        above = value >= self.high if self.open_high else value > self.high
        if below or above:
            raise SettingsError(f"{name} must be {self.describe()}, got {value!r}.")
        return self.kind(value)


LIMITS: dict[str, Limit] = {lim.name: lim for lim in (
    Limit("temperature", float, 0.01, 2.0, 0.0, "Temperature",
          "0 picks the most likely token every time (greedy: the same answer each run). Higher values "
          "sample more freely; DFlash keeps the target's own distribution either way.", zero="greedy"),
    Limit("top_p", float, 0.0, 1.0, 1.0, "Top-p",
          "Sample only from the smallest set of tokens whose probabilities add up to this. 1 turns it off.",
          open_low=True),
    Limit("top_k", int, 1, 100_000, 0, "Top-k",
          "Sample only from the k most likely tokens. 0 turns it off.", zero="off"),
    Limit("max_new_tokens", int, 1, 32_768, 256, "Max new tokens",
          "The answer stops after this many tokens, even mid-sentence."),
    Limit("block_size", int, 1, 64, None, "Block size",
          "Tokens per draft block, the first being the last committed token. Empty: the drafter's own "
          "(usually 16). 1 turns DFlash off (plain decoding).", optional=True),
    Limit("draft_cutoff", float, 0.0, 1.0, None, "Draft cutoff",
          "Verify drafts only while the drafter's running confidence stays at or above this. Empty: "
          "automatic for the device. Higher values verify fewer drafts per step; the output never changes.",
          open_high=True, optional=True),
    Limit("draft_vocab", int, 1, 1 << 20, None, "Draft vocabulary",
          "The drafter proposes only this many of the tokens its model uses most (a ranking shipped beside the "
          "drafter; of a drafter trained on a set of its own, the lowest ids of that set), which makes each "
          "draft cheaper; the output never changes. 0: every token. Empty: the drafter's own set, else the "
          "engine's measured choice for the device.", zero="every token", optional=True),
    Limit("seed", int, 0, SEED_MAX, None, "Seed",
          "Random seed for sampling. Empty: a new seed each time.", optional=True),
    Limit("repeat_penalty", float, 1.0, 2.0, 1.0, "Repeat penalty",
          f"Makes tokens seen in the last {REPEAT_WINDOW} tokens less likely (their scores are divided by it), "
          "which keeps small models from looping. 1 turns it off. DFlash applies the same penalty when it "
          "verifies, so its output stays the model's own."),
    Limit("min_p", float, 0.0, 1.0, 0.0, "Min-p",
          "When sampling, drop tokens less likely than this share of the most likely one. 0 turns it off.",
          open_high=True),
    Limit("loop_guard", int, 16, 4096, 0, "Loop guard",
          "Stop an answer once its last this-many tokens are one phrase repeated over and over (at least "
          "three times in a row). 0 turns it off.", zero="off"),
    Limit("context_length", int, 16, 1 << 24, None, "Context length",
          "The most tokens a chat may hold (prompt, history and answer), at most the context the engine "
          "loaded. Empty: all of it.", optional=True),
)}


@dataclass(frozen=True)
class GenerationSettings:
    """Validated settings for one generation; every field checked against LIMITS on creation."""
    max_new_tokens: int = LIMITS["max_new_tokens"].default
    temperature: float = LIMITS["temperature"].default
    top_p: float = LIMITS["top_p"].default
    top_k: int = LIMITS["top_k"].default
    seed: int | None = None
    block_size: int | None = None      # None: the drafter's own; 1: plain decoding
    stop_strings: tuple[str, ...] = ()
    rule: str = "residual"             # "residual" (exact speculative sampling) or "match" (sample-and-match)
    draft_cutoff: float | None = None  # None: the engine's choice for its device
    draft_vocab: int | None = None     # draft over this many most frequent tokens; 0: all; None: the engine's choice
    plain_fallback: bool = True        # switch to plain decoding when DFlash stays below break-even
    repeat_penalty: float = LIMITS["repeat_penalty"].default
    min_p: float = LIMITS["min_p"].default
    loop_guard: int = LIMITS["loop_guard"].default          # 0: off
    context_length: int | None = None  # None: the whole context the engine loaded
    method: str | None = None          # how to speculate (a METHODS key); None: the engine's own, measured, choice

    def __post_init__(self):
        for name, limit in LIMITS.items():
            object.__setattr__(self, name, limit.check(getattr(self, name)))
        stops = self.stop_strings
        if isinstance(stops, str) or not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
            raise SettingsError(f"stop_strings must be a list of strings, got {stops!r}.")
        if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
            raise SettingsError(f"stop_strings takes at most {MAX_STOP_STRINGS} strings of at most "
                                f"{MAX_STOP_STRING_CHARS} characters each.")
        object.__setattr__(self, "stop_strings", tuple(stops))
        if self.rule not in RULES:
            raise SettingsError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}.")
        if self.method is not None and self.method not in METHODS:
            raise SettingsError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}.")
        if not isinstance(self.plain_fallback, bool):
            raise SettingsError(f"plain_fallback must be true or false, got {self.plain_fallback!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return self.repeat_penalty != 1.0

    @classmethod
    def from_dict(cls, raw: dict) -> "GenerationSettings":
        """From a protocol `settings` object: unknown keys are refused by name."""
        unknown = sorted(set(raw) - set(SETTINGS_KEYS))
        if unknown:
            raise SettingsError(f"Unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS_KEYS)}.")
        return cls(**raw)


SETTINGS_KEYS = tuple(f.name for f in fields(GenerationSettings))
