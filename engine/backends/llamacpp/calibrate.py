"""Which is fastest for this pair on this computer: llama.cpp's plain decoding, or its DFlash with how
many drafts per step? A short greedy answer with each, timed by the server itself (decoding only), the
best of a few runs so a busy moment does not decide it. The choice and its numbers are remembered in the
app's cache, keyed by the build, the two files and the machine, so a pair calibrates once; it says in
words which it chose and why.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

from ...cache_dir import app_cache
from ...errors import Cancelled
from ...limits import GenerationSettings
from . import build
from .server import request_body

CANDIDATES = (3, 7, 15)      # drafts per step tried (capped at the block size - 1)
TOKENS = 128                 # per timed answer
RUNS = 2                     # timed answers per choice, after one warm-up
CODE_PROMPT = ('import json\nimport os\n\n\ndef load_settings(path):\n    """Read the JSON settings file at path '
               'and return them as a dict, with defaults for missing keys."""\n')
CHAT_PROMPT = ("Write a Python function that reads a CSV file and returns its rows as a list of dictionaries, "
               "then explain how it handles a missing file.")


def store() -> Path:
    return app_cache() / "llamacpp-calibration.json"


def _file_id(path: Path | None) -> str:
    if path is None:
        return "-"
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"


def key(pair) -> str:
    parts = [build.key(), _file_id(pair.base.model), _file_id(pair.draft), platform.machine(),
             platform.processor() or _cpu_model(), str(os.cpu_count()), str(pair.base.threads),
             f"-fa {pair.flash_attn}",      # the servers' flags: a choice measured with others is measured again
             "plain -fa auto measured"]     # choices from before plain decoding was timed both ways
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _load() -> dict:
    try:
        data = json.loads(store().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def remembered(pair) -> dict | None:
    return _load().get(key(pair))


def prompt_ids(pair) -> list[int]:
    tok = pair.tokenizer
    if tok.has_template:
        return tok.encode_prompt(CHAT_PROMPT)
    return tok.encode_prompt(CODE_PROMPT, raw=True)


def measure(pair, prompt: list[int], n_max: int) -> dict:
    """Decoding speed (tokens/s, the server's own timing) and tau of one greedy answer."""
    server = pair.server_for(n_max)
    last = {}
    for event in server.stream(request_body(prompt, GenerationSettings(max_new_tokens=TOKENS))):
        last = event
    t = last.get("timings") or {}
    n, ms = int(t.get("predicted_n", 0)), float(t.get("predicted_ms", 0.0))
    accepted = int(t.get("draft_n_accepted", 0))
    steps = max(n - 1 - accepted, 1)
    return {"tok_s": (n - 1) / (ms / 1000) if ms > 0 and n > 1 else 0.0, "tau": (accepted + steps) / steps}


def fastest(pair, prompt: list[int], n_max: int, cancelled) -> dict:
    """The best of RUNS timed answers after a warm-up one."""
    runs = []
    for i in range(RUNS + 1):
        if cancelled():
            raise Cancelled("Loading was cancelled while timing DFlash against plain decoding.")
        result = measure(pair, prompt, n_max)
        if i:                                    # the first answer warms the server up
            runs.append(result)
    return max(runs, key=lambda r: r["tok_s"])


def choose(pair, cancelled=lambda: False, force: bool = False) -> dict:
    """The remembered choice for this pair here, or a new calibration (a few seconds to a minute)."""
    k = key(pair)
    saved = _load()
    if k in saved and not force:
        return saved[k]
    prompt = prompt_ids(pair)
    plain: dict[str, dict] = {}
    for flags in dict.fromkeys((pair.flash_attn, "auto")):   # the engine's flash attention, and llama.cpp's own
        pair.plain_flash_attn = flags
        plain[flags] = fastest(pair, prompt, 0, cancelled)
    flags = max(plain, key=lambda f: plain[f]["tok_s"])
    pair.plain_flash_attn = flags
    best = {0: plain[flags]}
    for n_max in sorted({min(c, pair.block_size - 1) for c in CANDIDATES}):
        best[n_max] = fastest(pair, prompt, n_max, cancelled)
    pair.server_for(0)
    choice = decide(best)
    choice["plain_flash_attn"] = flags
    choice["measured"] = time.strftime("%Y-%m-%d %H:%M")
    saved[k] = choice
    store().parent.mkdir(parents=True, exist_ok=True)
    tmp = store().with_suffix(".tmp")
    tmp.write_text(json.dumps(saved, indent=1), encoding="utf-8")
    os.replace(tmp, store())
    return choice


def decide(best: dict[int, dict]) -> dict:
    """The fastest of plain decoding (n_max 0) and each DFlash n_max, with the reason in words."""
    plain = best[0]["tok_s"]
    # a setting whose drafts were never accepted (tau 1) cannot gain: only noise could make it look faster
    n_max = max((n for n in best if not n or best[n]["tau"] > 1.0), key=lambda n: best[n]["tok_s"])
    top = max((n for n in best if n), key=lambda n: best[n]["tok_s"])
    rates = {str(n): round(r["tok_s"], 1) for n, r in best.items()}
    taus = {str(n): round(r["tau"], 2) for n, r in best.items() if n}
    if n_max:
        reason = (f"llama.cpp's DFlash with {n_max} drafts per step decoded {best[n_max]['tok_s']:.0f} tokens/s "
                  f"(tau {best[n_max]['tau']:.2f}) against plain decoding's {plain:.0f} tokens/s on this computer, "
                  "so DFlash runs with that setting.")
    else:
        reason = (f"On this computer llama.cpp's plain decoding ({plain:.0f} tokens/s) was faster than its DFlash "
                  f"at its best ({best[top]['tok_s']:.0f} tokens/s with {top} drafts per step, tau "
                  f"{best[top]['tau']:.2f}): a DFlash step costs more here than the tokens it saves, so answers "
                  "use plain decoding.")
    return {"n_max": n_max, "rates": rates, "taus": taus, "tau": best[top]["tau"],
            "speed_share": best[top]["tok_s"] / plain if plain else 0.0, "reason": reason}
