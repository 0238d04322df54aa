"""Typed user settings, persisted as one JSON file (paths.settings_file()).

Values are validated on the way in so an absurd number (temperature 50, top-p 2) is refused with a
sentence that names the field, instead of reaching the engine and failing there. A damaged file never
stops the app: unreadable or invalid fields fall back to their defaults.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from . import paths

log = logging.getLogger(__name__)

THEMES = ("system", "light", "dark")


class SettingsError(ValueError):
    """A setting is out of range; the message is meant for the user."""


@dataclass
class Settings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    block_size: int = 0            # 0 = the drafter's own block size
    draft_cutoff: float | None = None  # None = the engine's choice by device (see GenerationSettings)
    theme: str = "system"
    font_size: int = 11
    highlight_drafted: bool = True
    show_stats: bool = True
    last_pair: dict | None = None  # {id, name, target_dir, draft_dir}
    baselines: dict = field(default_factory=dict)  # pair key -> BaselineRecord dict (see session.py)

    def validate(self, max_block_size: int | None = None) -> "Settings":
        """Raise SettingsError on the first out-of-range value; return self for chaining."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise SettingsError(message)

        num = (int, float)
        need(isinstance(self.temperature, num) and 0.0 <= self.temperature <= 2.0,
             f"Temperature must be between 0 and 2 (got {self.temperature}); 0 means greedy.")
        need(isinstance(self.top_p, num) and 0.0 < self.top_p <= 1.0,
             f"Top-p must be greater than 0 and at most 1 (got {self.top_p}).")
        need(_is_int(self.top_k) and 0 <= self.top_k <= 100_000,
             f"Top-k must be a whole number from 0 (off) to 100000 (got {self.top_k}).")
        need(_is_int(self.max_new_tokens) and 1 <= self.max_new_tokens <= 32_768,
             f"Max new tokens must be between 1 and 32768 (got {self.max_new_tokens}).")
        limit = max_block_size or 64
        need(_is_int(self.block_size) and 0 <= self.block_size <= limit,
             f"Block size must be between 1 and {limit}, the drafter's block size, or 0 for the drafter's "
             f"own (got {self.block_size}).")
        need(self.draft_cutoff is None or (isinstance(self.draft_cutoff, num) and not isinstance(self.draft_cutoff, bool)
                                           and 0.0 <= self.draft_cutoff < 1.0),
             f"Draft cutoff must be at least 0 and below 1, or empty for automatic (got {self.draft_cutoff}).")
        need(self.theme in THEMES, f"Theme must be one of {', '.join(THEMES)} (got {self.theme!r}).")
        need(_is_int(self.font_size) and 7 <= self.font_size <= 32,
             f"Font size must be between 7 and 32 points (got {self.font_size}).")
        return self

    def generation(self, max_block_size: int | None = None) -> dict:
        """The engine's `settings` dict for a generate request."""
        out = {"temperature": float(self.temperature), "top_p": float(self.top_p), "top_k": int(self.top_k),
               "max_new_tokens": int(self.max_new_tokens)}
        if self.block_size:
            out["block_size"] = min(self.block_size, max_block_size or self.block_size)
        if self.draft_cutoff is not None:
            out["draft_cutoff"] = float(self.draft_cutoff)
        return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load(path: Path | None = None) -> Settings:
    """Read settings; a missing or broken file gives defaults, a bad field its default."""
    path = path or paths.settings_file()
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Settings()
    except (OSError, ValueError) as exc:
        log.warning("settings file %s unreadable (%s); using defaults", path, exc)
        return Settings()
    settings = Settings()
    if not isinstance(raw, dict):
        return settings
    for f in fields(Settings):
        if f.name not in raw:
            continue
        candidate = Settings(**{**asdict(settings), f.name: raw[f.name]})
        try:
            candidate.validate()
        except (SettingsError, TypeError):
            log.warning("setting %s=%r ignored: out of range", f.name, raw[f.name])
            continue
        settings = candidate
    return settings


def save(settings: Settings, path: Path | None = None) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    path = Path(path or paths.settings_file())
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(settings), indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
