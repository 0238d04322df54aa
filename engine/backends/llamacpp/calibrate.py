"""Which is fastest for this pair on this computer: llama.cpp's plain decoding, or its DFlash with how
many drafts per step? Greedy answers to a few prompts of the kind the pair is sent (a chat model: a coding
request, an explanation and a list; a code model: three code files), timed by the server itself (decoding
only). The settings take turns, round after round, so a busy moment slows them alike; each keeps its best
round per prompt, and the setting with the best total over the prompts wins: one prompt may favour a setting
the others do not (docs/BENCHMARKS.md). The choice and its numbers are remembered in the app's cache, keyed
by the build, the two files and the machine, so a pair calibrates once; it says in words which it chose and why.
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
TOKENS = 64                  # per timed answer
ROUNDS = 2                   # timed rounds, after a warm-up answer on each server
CHAT_PROMPTS = ("Write a Python function that reads a CSV file and returns its rows as a list of dictionaries, "
                "then explain how it handles a missing file.",
                "Explain in a few short paragraphs why the sky is blue and why sunsets are red.",
                "List eight ideas for a rainy weekend at home, one line each.")
CODE_PROMPTS = ('import json\nimport os\n\n\ndef load_settings(path):\n    """Read the JSON settings file at path '
                'and return them as a dict, with defaults for missing keys."""\n',
                'class Inventory:\n    """Items in stock, with their counts and prices."""\n\n    def __init__(self):\n',
                'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n    result = []\n')


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
             "plain -fa auto measured", f"{len(CHAT_PROMPTS)} prompts interleaved"]   # older ways of choosing
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


def prompts(pair) -> list[list[int]]:
    tok = pair.tokenizer
    if tok.has_template:
        return [tok.encode_prompt(text) for text in CHAT_PROMPTS]
    return [tok.encode_prompt(text, raw=True) for text in CODE_PROMPTS]


def measure(server, prompt: list[int], n_max: int, tokens: int = TOKENS) -> dict:
    """Tokens, decoding seconds (the server's own timing) and accepted drafts of one greedy answer; n_max
    lowers the drafting server's drafts per step for this request (our patch 0002)."""
    body = {**request_body(prompt, GenerationSettings(max_new_tokens=tokens)), "speculative.n_max": n_max}
    last = {}
    for event in server.stream(body):
        last = event
    t = last.get("timings") or {}
    n = int(t.get("predicted_n", 0))
    return {"tokens": max(n - 1, 0), "seconds": float(t.get("predicted_ms", 0.0)) / 1000,
            "accepted": int(t.get("draft_n_accepted", 0))}


def choose(pair, cancelled=lambda: False, force: bool = False) -> dict:
    """The remembered choice for this pair here, or a new calibration (seconds on a small model, minutes on a
    big one on a CPU)."""
    k = key(pair)
    saved = _load()
    if k in saved and not force:
        return saved[k]
    ids = prompts(pair)
    drafts = sorted({min(c, pair.block_size - 1) for c in CANDIDATES})
    plain_flags = list(dict.fromkeys((pair.flash_attn, "auto")))   # the engine's flash attention, and llama.cpp's
    best: dict = {}                                   # (setting, prompt index) -> the best run of the rounds

    def run(setting, server, n_max: int, warm: bool) -> None:
        if warm:                                      # the first answer on a new server warms it up
            measure(server, ids[0], n_max)
        for i, prompt in enumerate(ids):
            if cancelled():
                raise Cancelled("Loading was cancelled while timing DFlash against plain decoding.")
            result = measure(server, prompt, n_max)
            kept = best.get((setting, i))
            if kept is None or result["seconds"] * kept["tokens"] < kept["seconds"] * result["tokens"]:
                best[setting, i] = result

    for r in range(ROUNDS):
        for flags in plain_flags:
            pair.plain_flash_attn = flags
            run(("plain", flags), pair.server_for(0), 0, warm=True)
        server = pair.server_for(max(drafts))
        for j, n_max in enumerate(drafts[r % len(drafts):] + drafts[:r % len(drafts)]):   # a new order each round
            run(n_max, server, n_max, warm=j == 0)
    totals = {setting: total([best[setting, i] for i in range(len(ids))])
              for setting in [("plain", f) for f in plain_flags] + drafts}
    flags = max(plain_flags, key=lambda f: totals["plain", f]["tok_s"])
    pair.plain_flash_attn = flags
    pair.server_for(0)
    choice = decide({0: totals["plain", flags], **{n: totals[n] for n in drafts}}, prompts=len(ids))
    choice["plain_flash_attn"] = flags
    choice["measured"] = time.strftime("%Y-%m-%d %H:%M")
    saved[k] = choice
    store().parent.mkdir(parents=True, exist_ok=True)
    tmp = store().with_suffix(".tmp")
    tmp.write_text(json.dumps(saved, indent=1), encoding="utf-8")
    os.replace(tmp, store())
    return choice


def total(runs: list[dict]) -> dict:
    """Tokens per second and tokens per step over all the prompts together (the whole time, not a mean of rates)."""
    tokens, seconds, accepted = (sum(r[f] for r in runs) for f in ("tokens", "seconds", "accepted"))
    steps = max(tokens - accepted, 1)
    return {"tok_s": tokens / seconds if seconds > 0 else 0.0, "tau": (accepted + steps) / steps}


def decide(best: dict[int, dict], prompts: int = 1) -> dict:
    """The fastest of plain decoding (n_max 0) and each DFlash n_max over `prompts` prompts, with the reason."""
    plain = best[0]["tok_s"]
    # a setting whose drafts were never accepted (tau 1) cannot gain: only noise could make it look faster
    n_max = max((n for n in best if not n or best[n]["tau"] > 1.0), key=lambda n: best[n]["tok_s"])
    top = max((n for n in best if n), key=lambda n: best[n]["tok_s"])
    rates = {str(n): round(r["tok_s"], 1) for n, r in best.items()}
    taus = {str(n): round(r["tau"], 2) for n, r in best.items() if n}
    if n_max:
        reason = (f"llama.cpp's DFlash with {n_max} drafts per step decoded {best[n_max]['tok_s']:.0f} tokens/s "
                  f"(tau {best[n_max]['tau']:.2f}) against plain decoding's {plain:.0f} tokens/s on this computer"
                  f"{over(prompts)}, so DFlash runs with that setting.")
    else:
        reason = (f"On this computer llama.cpp's plain decoding ({plain:.0f} tokens/s) was faster than its DFlash "
                  f"at its best ({best[top]['tok_s']:.0f} tokens/s with {top} drafts per step, tau "
                  f"{best[top]['tau']:.2f}){over(prompts)}: a DFlash step costs more here than the tokens it saves, "
                  "so answers use plain decoding.")
    return {"n_max": n_max, "rates": rates, "taus": taus, "tau": best[top]["tau"], "prompts": prompts,
            "speed_share": best[top]["tok_s"] / plain if plain else 0.0, "reason": reason}


def over(prompts: int) -> str:
    return f" over {prompts} prompts" if prompts > 1 else ""
