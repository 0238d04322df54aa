"""Typed user settings, persisted as one JSON file (paths.settings_file()).

Values are validated on the way in so an absurd number (temperature 50, top-p 2) is refused with a
sentence that names the field, instead of reaching the engine and failing there. Generation settings
take their ranges from the engine's one table (engine/limits.py). Every field is checked, down to the
shape of the last pair and of each baseline, because the window uses them as they are at start. A damaged
file never stops the app: an unreadable file (too big, nested too deeply, not a regular file) gives the
defaults, a field of the wrong type or range its default, and ``load_checked`` says which in a notice.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from engine.backends import ENGINES, METHODS
from engine.errors import SettingsError as EngineSettingsError
from engine.limits import LIMITS

from . import paths
from .pairs import PairRequest

log = logging.getLogger(__name__)

THEMES = ("system", "light", "dark")
FONT_SIZES = (7, 32)    # points, smallest and largest
PORTS = (1, 65535)
MAX_REMOTE_SERVERS = 8
MAX_RECENT_PAIRS = 12
MAX_MEASURED = 64               # pairs whose measured method the model list remembers
# the generation settings kept here and sent with every answer, each held to engine/limits.py, in the order the
# Settings dialog shows them
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "max_new_tokens", "loop_guard",
            "context_length")
MAX_FILE_BYTES = 4 * 2**20   # far above any settings file this app writes


class SettingsError(ValueError):
    """A setting is out of range; the message is meant for the user."""


@dataclass
class Settings:
    temperature: float = LIMITS["temperature"].default
    top_p: float = LIMITS["top_p"].default
    top_k: int = LIMITS["top_k"].default
    max_new_tokens: int = LIMITS["max_new_tokens"].default
    repeat_penalty: float = 1.1    # LM Studio's default (the engine's own is 1: off, as llama.cpp's)
    min_p: float = 0.05            # LM Studio's and llama.cpp's default
    seed: int | None = None        # None = a new seed for every answer
    loop_guard: int = 64           # tokens; 0 = off (the engine's own default)
    context_length: int | None = None   # None = all the context the engine loaded
    block_size: int = 0            # 0 = the drafter's own block size
    draft_cutoff: float | None = None  # None = the engine's choice by device (see GenerationSettings)
    plain_fallback: bool = True    # plain decoding for the rest of an answer when DFlash stays below break-even
    offline: bool = False          # no network at all: no downloads, no connection checks
    theme: str = "system"
    font_size: int = 11
    engine: str = "auto"           # "auto": the model list's plan; else the engine preferred where it runs a pair
    highlight_drafted: bool = True
    show_stats: bool = True
    last_pair: dict | None = None  # {id, name, target_dir, draft_dir} or {id, name, remote: {base_url, api_key}}
    baselines: dict = field(default_factory=dict)  # pair key -> BaselineRecord dict (see session.py)
    server_port: int = 8765        # the local OpenAI-compatible server (dflash_desktop/server.py), on 127.0.0.1
    server_api_key: str = ""       # "" = no key asked (the server only listens on this computer)
    remote_servers: list = field(default_factory=list)  # [{base_url, api_key}], the latest first
    recent_pairs: list = field(default_factory=list)    # pairs loaded before (PairRequest dicts), the latest first
    window_geometry: str = ""      # QMainWindow.saveGeometry(), base64: size and place restored at start
    window_state: str = ""         # QMainWindow.saveState(), base64: the stats dock's width and place
    splitter_state: str = ""       # the chats list / chat splitter, base64
    last_conversation: int | None = None   # the chat on screen when the app closed, reopened at start
    welcome_seen: bool = False     # the first-run welcome was shown (Help > Welcome reopens it)
    measured: dict = field(default_factory=dict)   # pairs.measured_key -> {method, summary}: what its engine measured fastest

    def validate(self, max_block_size: int | None = None) -> "Settings":
        """Raise SettingsError on the first out-of-range value; return self for chaining."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise SettingsError(message)

        for name in SAMPLING + ("draft_cutoff",):
            try:
                LIMITS[name].check(getattr(self, name), LIMITS[name].label)
            except EngineSettingsError as exc:
                raise SettingsError(str(exc)) from None
        limit = min(max_block_size or LIMITS["block_size"].high, LIMITS["block_size"].high)
        need(_is_int(self.block_size) and 0 <= self.block_size <= limit,
             f"Block size must be between 1 and {limit}, the drafter's block size, or 0 for the drafter's "
             f"own (got {self.block_size}).")
        need(all(isinstance(v, bool) for v in (self.plain_fallback, self.offline, self.welcome_seen)),
             "Plain fallback, offline mode and the welcome's flag are on or off.")
        need(isinstance(self.highlight_drafted, bool), "Highlight drafted is on or off (true or false).")
        need(isinstance(self.show_stats, bool), "Show stats is on or off (true or false).")
        need(self.last_pair is None or PairRequest.valid(self.last_pair), "The last model pair is not one this version can load: {id, name, "
             "target_dir, draft_dir, plan, thinking}, or {id, name, remote: {base_url, api_key}}.")
        need(isinstance(self.baselines, dict) and all(isinstance(k, str) and _is_baseline(v)
                                                      for k, v in self.baselines.items()),
             "Baselines are measurements per model pair: {tok_s, tokens, measured_at, device, method, cpu_other}.")
        need(isinstance(self.engine, str) and (self.engine == "auto" or self.engine in ENGINES),
             f"Engine must be automatic or one of {', '.join(ENGINES)} (got {self.engine!r}).")
        need(isinstance(self.theme, str) and self.theme in THEMES,
             f"Theme must be one of {', '.join(THEMES)} (got {self.theme!r}).")
        need(_is_int(self.font_size) and FONT_SIZES[0] <= self.font_size <= FONT_SIZES[1],
             f"Font size must be between {FONT_SIZES[0]} and {FONT_SIZES[1]} points (got {self.font_size}).")
        need(_is_int(self.server_port) and PORTS[0] <= self.server_port <= PORTS[1],
             f"Server port must be between {PORTS[0]} and {PORTS[1]} (got {self.server_port}).")
        need(isinstance(self.server_api_key, str) and len(self.server_api_key) <= 256 and
             (self.server_api_key.isascii() and self.server_api_key.isprintable() and " " not in self.server_api_key),
             "The server's API key must be printable ASCII without spaces, at most 256 characters.")
        need(isinstance(self.remote_servers, list) and len(self.remote_servers) <= MAX_REMOTE_SERVERS and all(
            isinstance(r, dict) and set(r) == {"base_url", "api_key"} and all(isinstance(v, str) for v in r.values())
            for r in self.remote_servers), "Remote servers are a short list of {base_url, api_key}.")
        need(isinstance(self.recent_pairs, list) and len(self.recent_pairs) <= MAX_RECENT_PAIRS and all(
            PairRequest.valid(p) for p in self.recent_pairs),
            "Recent models are a short list of pairs this version can load: {id, name, target_dir, ...}.")
        need(all(isinstance(v, str) and len(v) <= 16384 and _is_base64(v)
                 for v in (self.window_geometry, self.window_state, self.splitter_state)),
             "Window layout fields are short base64 texts.")
        need(isinstance(self.measured, dict) and len(self.measured) <= MAX_MEASURED and all(
            isinstance(k, str) and isinstance(v, dict) and set(v) - {"engine"} == {"method", "summary"}
            and v["method"] in METHODS and v.get("engine", "torch") in ENGINES
            and isinstance(v["summary"], str) and len(v["summary"]) <= 4000 for k, v in self.measured.items()),
            "Measured methods are {method, summary, engine} per model pair.")
        need(self.last_conversation is None or (_is_int(self.last_conversation) and self.last_conversation > 0),
             "The last chat is a chat number.")
        return self

    def generation(self, max_block_size: int | None = None) -> dict:
        """The engine's `settings` dict for a generate request."""
        out = {name: getattr(self, name) for name in SAMPLING if getattr(self, name) is not None}
        out["plain_fallback"] = self.plain_fallback
        if self.block_size:
            out["block_size"] = min(self.block_size, max_block_size or self.block_size)
        if self.draft_cutoff is not None:
            out["draft_cutoff"] = float(self.draft_cutoff)
        return out


def remember_server(settings: Settings, base_url: str, api_key: str) -> None:
    """Put a remote server first in the list the model picker offers."""
    rest = [r for r in settings.remote_servers if r["base_url"] != base_url]
    settings.remote_servers = [{"base_url": base_url, "api_key": api_key}, *rest][:MAX_REMOTE_SERVERS]


def remember_measured(settings: Settings, pair_id: str, method: str, summary: str, engine: str | None = None) -> None:
    """Keep what a pair's engine measured fastest on this computer, and the engine where several were timed
    (the model list shows it), the latest last."""
    rest = {k: v for k, v in settings.measured.items() if k != pair_id}
    record = {"method": method, "summary": summary, **({"engine": engine} if engine else {})}
    settings.measured = dict(list({**rest, pair_id: record}.items())[-MAX_MEASURED:])


def remember_pair(settings: Settings, pair: dict) -> None:
    """Put a pair that loaded first in the model bar's list of my models (PairRequest.to_dict())."""
    rest = [p for p in settings.recent_pairs if p.get("id") != pair.get("id")]
    settings.recent_pairs = [pair, *rest][:MAX_RECENT_PAIRS]


def _is_base64(value: str) -> bool:
    return all(ch.isalnum() or ch in "+/=" for ch in value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value, low: float, high: float) -> bool:
    """Compared before anything converts it: NaN fails every comparison, and 10**400 never becomes a float."""
    return type(value) in (int, float) and low <= value <= high


def _texts(d: dict, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> bool:
    return all(isinstance(d.get(k), str) for k in required) and all(
        d.get(k) is None or isinstance(d[k], str) for k in optional)


def _is_baseline(raw) -> bool:
    """What session.BaselineRecord reads, with values it can show (a time.localtime it can take)."""
    return (isinstance(raw, dict) and _texts(raw, ("device",), ("method",)) and _is_number(raw.get("tok_s"), 0, 1e9)
            and _is_int(raw.get("tokens")) and 0 <= raw["tokens"] <= 2**31
            and _is_number(raw.get("measured_at"), 0, 1e11)
            and (raw.get("cpu_other") is None or _is_number(raw["cpu_other"], 0, 1))
            and isinstance(raw.get("runs", []), list) and len(raw.get("runs", [])) <= 100
            and all(_is_number(r, 0, 1e9) for r in raw.get("runs", [])))


def load(path: Path | None = None) -> Settings:
    """Read settings; a missing or broken file gives defaults, a bad field its default."""
    return load_checked(path)[0]


def load_checked(path: Path | None = None) -> tuple[Settings, str | None]:
    """The settings, and a notice for the window naming what fell back to its default (None when all is well).
    A missing file is a first start: defaults, no notice."""
    path = Path(path or paths.settings_file())
    try:
        raw = json.loads(paths.read_small_file(path, MAX_FILE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return Settings(), None
    except RecursionError:
        return _unreadable(path, "its JSON is nested too deeply")
    except (OSError, ValueError) as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return _unreadable(path, str(exc))
    if not isinstance(raw, dict):
        return _unreadable(path, "it does not hold a JSON object")
    settings, bad = Settings(), []
    for f in fields(Settings):
        if f.name not in raw:
            continue
        candidate = replace(settings, **{f.name: raw[f.name]})   # no copy: any nesting the parser took is fine
        try:
            candidate.validate()
        except (SettingsError, TypeError, RecursionError) as exc:
            log.warning("setting %s ignored: %s", f.name, exc)
            bad.append(f"- {f.name}: {exc}")
            continue
        settings = candidate
    if not bad:
        return settings, None
    return settings, (f"Some settings in {path} could not be used and are back to their defaults:\n"
                      + "\n".join(bad) + "\nThe other settings were kept; the file is written again when a setting "
                      "changes or the app closes.")


def _unreadable(path: Path, why: str) -> tuple[Settings, str]:
    log.warning("settings file %s unreadable (%s); using defaults", path, why)
    return Settings(), (f"The settings file {path} could not be read ({why}), so every setting is back to its "
                        "default. It is written again when a setting changes or the app closes.")


def save(settings: Settings, path: Path | None = None) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    path = Path(path or paths.settings_file())
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(settings), indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
