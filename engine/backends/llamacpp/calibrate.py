"""Which is fastest for this pair on this computer: llama.cpp's plain decoding, n-gram lookup, the target's MTP
head or its drafter (DFlash, DSpark, EAGLE-3), each with how many drafts per step? Greedy answers to a few
prompts of the kind the pair is sent (a chat model: a coding request, an explanation and an edit of pasted code;
a code model: three code files), as long as the model's speed allows (answer_tokens), timed by the server itself
(decoding only). The settings take turns, round
after round, so a busy moment slows them alike; each keeps its best round per prompt, and the setting with the
best total over the prompts wins: one prompt may favour a setting the others do not (docs/BENCHMARKS.md). A
speculating setting at less than half the fastest one's speed after a round cannot catch up by a better round, so
it is not timed again: on a small target, slow drafting settings took most of the first load's wait. Plain
decoding, the baseline every gain is stated against, is timed in every round. n-gram lookup remembers what it has
seen across answers, so each of its settings gets a new server each round: an answer it has seen before would
draft itself. The choice and its numbers are remembered in the app's cache,
keyed by the build, the two files and the machine, so a pair calibrates once; it says in words which it chose
and why the others lost.
"""
from __future__ import annotations

import hashlib
import os
import platform
import time
from pathlib import Path

from ...cache_dir import app_cache, files_id, read_record, write_record
from ...errors import Cancelled
from ...limits import GenerationSettings
from ...machine import cpu_model
from .. import METHODS
from . import build
from .server import request_body

CANDIDATES = (3, 7, 15)      # DFlash's, DFlash2's and DSpark's drafts per step tried (capped at the block size - 1)
NGRAM_CANDIDATES = (4, 8, 16)   # n-gram lookup's longest drafts tried (docs/BENCHMARKS.md, "n-gram lookup")
MTP_CANDIDATES = (1, 2, 3)       # the target's MTP head drafts one token per pass: a server each (it drafts n_max)
EAGLE3_CANDIDATES = (2, 4, 6)    # an EAGLE-3 drafter too: one pass per draft, a server each
TOKENS = 64                  # per timed answer, at the least
LONGEST = 256                # per timed answer, at the most
BUDGET_S = 15.0              # seconds the timed answers would take at plain decoding's speed: a fast model's grow
ROUNDS = 2                   # timed rounds, after a warm-up answer on each server
KEEP_SHARE = 0.5             # a drafting setting below this share of the fastest one's speed: not timed again
WARM_UP = ("Say hello.", "# hello\n")   # a short first answer on a new server (chat, code): nothing n-gram lookup could reuse
CHAT_PROMPTS = ("Write a Python function that reads a CSV file and returns its rows as a list of dictionaries, "
                "then explain how it handles a missing file.",
                "Explain in a few short paragraphs why the sky is blue and why sunsets are red.",
                "Here is a function:\n\n```python\ndef summarize(values):\n    total = 0\n    count = 0\n"
                "    for value in values:\n        if value is None:\n            continue\n        total += value\n"
                "        count += 1\n    average = total / count if count else 0\n    return total, average\n```\n\n"
                "Rename `total` to `running_sum` and show the whole function.")
CODE_PROMPTS = ('import json\nimport os\n\n\ndef load_settings(path):\n    """Read the JSON settings file at path '
                'and return them as a dict, with defaults for missing keys."""\n',
                'class Inventory:\n    """Items in stock, with their counts and prices."""\n\n    def __init__(self):\n',
                'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n    result = []\n')


STORE = "llamacpp-calibration.json"     # in the app's cache


def store() -> Path:
    return app_cache() / STORE


def key(pair) -> str:
    folder = pair.base.binary.parent.parent       # the build that runs it, and where it runs
    parts = [build.key(build.backend_of(folder)), str(folder), str(pair.base.device), str(pair.base.gpu_layers),
             files_id(pair.base.model), files_id(pair.draft), platform.machine(),
             platform.processor() or cpu_model(), str(os.cpu_count()), str(pair.base.threads),
             f"-fa {pair.flash_attn}",      # the servers' flags: a choice measured with others is measured again
             ",".join(pair.methods), "ngram-mod 4/2",   # what was measured and how: older ways of choosing
             "plain -fa auto measured", f"{len(CHAT_PROMPTS)} prompts interleaved", "answers sized by speed"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def remembered(pair) -> dict | None:
    return read_record(STORE).get(key(pair))


def prompts(pair) -> list[list[int]]:
    tok = pair.tokenizer
    if tok.has_template:
        return [tok.encode_prompt(text) for text in CHAT_PROMPTS]
    return [tok.encode_prompt(text, raw=True) for text in CODE_PROMPTS]


def warm_up(pair) -> list[int]:
    tok = pair.tokenizer
    return tok.encode_prompt(WARM_UP[0]) if tok.has_template else tok.encode_prompt(WARM_UP[1], raw=True)


PASS_PER_DRAFT = ("mtp", "eagle3")   # methods whose server drafts all its n_max, whatever a request asks
ONE_PASS = ("dspark", "dflash", "dflash2")   # methods that draft a block in one pass: one server, each request lowers it


def settings_of(pair) -> list[tuple[str, int]]:
    """(method, drafts per step) for each speculating setting the pair's files allow."""
    out = []
    if "ngram" in pair.methods:
        out += [("ngram", n) for n in NGRAM_CANDIDATES]
    if "mtp" in pair.methods:
        out += [("mtp", n) for n in MTP_CANDIDATES]
    if "eagle3" in pair.methods:
        out += [("eagle3", n) for n in EAGLE3_CANDIDATES]
    for method in ONE_PASS:
        if method in pair.methods:
            out += [(method, n) for n in sorted({min(c, pair.block_size - 1) for c in CANDIDATES})]
    return out


def name(method: str, n_max: int = 0) -> str:
    """A setting's key in a choice's rates: none, or the method and its drafts per step ("dflash 7")."""
    return "none" if method == "none" else f"{method} {n_max}"


def parse(key: str) -> tuple[str, int]:
    method, _, n = key.partition(" ")
    return method, int(n or 0)


def fastest_drafting(choice: dict) -> tuple[str, int] | None:
    """The fastest speculating setting the calibration measured (where the user asks for speculation even
    though plain decoding measured faster)."""
    best = {m: r for m, r in (choice.get("by_method") or {}).items() if m != "none"}
    top = max(best, key=lambda m: best[m]["tok_s"]) if best else None
    return (top, best[top]["n_max"]) if top else None


def answer_tokens(rate: float, answers: int) -> int:
    """Tokens per timed answer: 64, or more in steps of 64 up to 256 where plain decoding at `rate` tokens/s
    would still decode all the timed answers within BUDGET_S. n-gram lookup drafts only text an answer already
    holds, which comes late in an answer, so 64 tokens undervalue it (docs/BENCHMARKS.md, "Every speculation
    method by prompt kind"), and users' answers run longer; a big model on a CPU keeps 64, or its calibration
    would take minutes more."""
    fit = int(rate * BUDGET_S / max(answers, 1)) // TOKENS * TOKENS
    return max(TOKENS, min(LONGEST, fit))


def server(pair, method: str, n_max: int, longest: int):
    """The server a setting is timed on: one DFlash or DSpark server at its longest drafts (each request lowers
    them); a new n-gram server (nothing remembered); an MTP head or EAGLE-3 drafter started at n_max, since it
    drafts as many passes as its server was started with."""
    return pair.server_for(method, n_max if method in PASS_PER_DRAFT else longest, fresh=method == "ngram")


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
            "drafted": int(t.get("draft_n", 0)), "accepted": int(t.get("draft_n_accepted", 0))}


def choose(pair, cancelled=lambda: False, force: bool = False) -> dict:
    """The remembered choice for this pair here, or a new calibration (seconds on a small model, minutes on a
    big one on a CPU)."""
    k = key(pair)
    saved = read_record(STORE)
    if k in saved and not force:
        return saved[k]
    ids, warm = prompts(pair), warm_up(pair)
    plain_flags = list(dict.fromkeys((pair.flash_attn, "auto")))   # the engine's flash attention, and llama.cpp's
    drafting = settings_of(pair)
    best: dict = {}                                   # (setting, prompt index) -> the best run of the rounds
    pair.plain_flash_attn = plain_flags[0]            # plain decoding's speed sizes the timed answers
    probe = measure(pair.server_for("none"), warm, 0, tokens=32)
    rate = probe["tokens"] / probe["seconds"] if probe["seconds"] > 0 else 0.0
    tokens = answer_tokens(rate, (len(plain_flags) + len(drafting)) * len(ids) * ROUNDS)

    def run(setting, server, n_max: int, warm_first: bool) -> None:
        if warm_first:                                # the first answer on a new server warms it up
            measure(server, warm, n_max, tokens=16)
        for i, prompt in enumerate(ids):
            if cancelled():
                raise Cancelled("Loading was cancelled while timing speculation against plain decoding.")
            result = measure(server, prompt, n_max, tokens)
            kept = best.get((setting, i))
            if kept is None or result["seconds"] * kept["tokens"] < kept["seconds"] * result["tokens"]:
                best[setting, i] = result

    settings = [("plain", f) for f in plain_flags] + [name(m, n) for m, n in drafting]
    timed = list(drafting)                            # the speculating settings still timed
    for r in range(ROUNDS):
        for flags in plain_flags:
            pair.plain_flash_attn = flags
            run(("plain", flags), pair.server_for("none"), 0, warm_first=True)
        for method in ("ngram", *PASS_PER_DRAFT, *ONE_PASS):
            mine = [n for m, n in timed if m == method]
            if not mine:
                continue
            longest = max(n for m, n in drafting if m == method)
            for j, n_max in enumerate(mine[r % len(mine):] + mine[:r % len(mine)]):   # a new order each round
                # only DFlash and DSpark keep their server from one setting to the next: the others get a new one
                run(name(method, n_max), server(pair, method, n_max, longest), n_max,
                    warm_first=method not in ONE_PASS or j == 0)
        rates = {setting: total([best[setting, i] for i in range(len(ids))])["tok_s"] for setting in settings}
        timed = [(m, n) for m, n in timed if rates[name(m, n)] >= KEEP_SHARE * max(rates.values())]
    totals = {setting: total([best[setting, i] for i in range(len(ids))]) for setting in settings}
    flags = max(plain_flags, key=lambda f: totals["plain", f]["tok_s"])
    choice = decide({"none": totals["plain", flags], **{name(m, n): totals[name(m, n)] for m, n in drafting}},
                    prompts=len(ids), tokens=tokens)
    choice["plain_flash_attn"] = flags
    choice["measured"] = time.strftime("%Y-%m-%d %H:%M")
    saved[k] = choice
    write_record(STORE, saved)
    return choice


def total(runs: list[dict]) -> dict:
    """Tokens per second and tokens per step over all the prompts together (the whole time, not a mean of rates)."""
    tokens, seconds, accepted = (sum(r[f] for r in runs) for f in ("tokens", "seconds", "accepted"))
    steps = max(tokens - accepted, 1)
    return {"tok_s": tokens / seconds if seconds > 0 else 0.0, "tau": (accepted + steps) / steps,
            "drafted": sum(r.get("drafted", 0) for r in runs)}


def decide(best: dict[str, dict], prompts: int = 1, tokens: int | None = None) -> dict:
    """The fastest of plain decoding ("none") and each speculating setting ("ngram 8", "dflash 7") over
    `prompts` prompts, with the reason in words: what runs, and why each other method lost."""
    plain = best["none"]["tok_s"]
    # a setting whose drafts were never accepted (tau 1) cannot gain: only noise could make it look faster
    chosen = max((k for k in best if k == "none" or best[k]["tau"] > 1.0), key=lambda k: best[k]["tok_s"])
    method, n_max = parse(chosen)
    tops = {}                                         # method -> its fastest setting
    for k in best:
        m = parse(k)[0]
        if m != "none" and (m not in tops or best[k]["tok_s"] > best[tops[m]]["tok_s"]):
            tops[m] = k
    top = max(tops.values(), key=lambda k: best[k]["tok_s"]) if tops else None
    where = f"on this computer{over(prompts, tokens)}"
    if method != "none":
        reason = (f"llama.cpp's {METHODS[method]} with {n_max} drafts per step decoded {best[chosen]['tok_s']:.0f} "
                  f"tokens/s (tau {best[chosen]['tau']:.2f}) against plain decoding's {plain:.0f} tokens/s {where}, "
                  "so answers use it.")
    else:
        why = ("a drafting step costs more here than the tokens it saves"
               if any(best[k]["tau"] > 1.0 for k in tops.values()) else "no drafts were accepted")
        reason = f"llama.cpp's plain decoding ({plain:.0f} tokens/s) was the fastest {where}: {why}, so answers use it."
    losers = [f"{METHODS[m]} {best[k]['tok_s']:.0f} tokens/s at its best ({parse(k)[1]} drafts per step, "
              + (f"tau {best[k]['tau']:.2f})" if best[k]["tau"] > 1.0 else
                 "none of its drafts accepted)" if best[k].get("drafted", 1) else
                 "nothing to draft: no text in the answers repeated what came before)")
              for m, k in tops.items() if m != method]
    if losers:
        reason += f" Measured beside it: {'; '.join(losers)}."
    by_method = {m: {"n_max": parse(k)[1], "tok_s": round(best[k]["tok_s"], 1), "tau": round(best[k]["tau"], 2)}
                 for m, k in {"none": "none", **tops}.items()}
    return {"method": method, "n_max": n_max, "by_method": by_method,
            "rates": {k: round(r["tok_s"], 1) for k, r in best.items()},
            "taus": {k: round(r["tau"], 2) for k, r in best.items() if k != "none"},
            "tau": best[top]["tau"] if top else 1.0, "prompts": prompts, "tokens": tokens,
            "speed_share": best[top]["tok_s"] / plain if top and plain else 0.0, "reason": reason}


def over(prompts: int, tokens: int | None = None) -> str:
    if prompts > 1:
        return f" over {prompts} prompts" + (f" ({tokens}-token answers)" if tokens else "")
    return f" over a {tokens}-token answer" if tokens else ""
