"""Every way llama.cpp can speculate for a pair, against its plain decoding, by prompt kind, and whether the
calibrated choice holds on prompts it never saw. For the code pair (held-out standard-library files, and
repetitive code to continue) and the chat pair (held-out chats, and edits of pasted text), in one run: calibrate
afresh (three prompts of its own, interleaved, calibrate.py) as the app does and, alternating with it, one way it
did before (`--compare pruning`: every setting timed in every round, however far behind; `--compare sizing`: timed
answers all of 64 tokens), each calibration timed, then decode every held-out prompt with plain
decoding, n-gram lookup and DFlash at each of their settings, interleaved prompt by prompt, and compare the
calibrated setting's total with the best fixed setting's. n-gram lookup gets a new server for every answer, so
it never drafts an answer from one it has seen (users' second asks do gain from that).

    python bench/bench_calibration.py [--limit 12] [--max-new-tokens 128] [--calibrations 2]
                                      [--compare pruning|sizing] [--json out.json]

Decode tok/s comes from the server's own timing; `total` is all the prompts' tokens over all their seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine import chat_pair  # noqa: E402
from engine.backends.llamacpp import calibrate  # noqa: E402
from engine.backends.llamacpp.engine import load_pair  # noqa: E402
from engine.bench import DEMO_DIR, chat_prompts, demo_prompts, machine_line  # noqa: E402

# prompts whose answers repeat text they were given: where n-gram lookup should pay
CHAT_EDITS = (
    "Here is my config file:\n\n```json\n{\n  \"host\": \"localhost\",\n  \"port\": 8000,\n  \"debug\": true,\n"
    "  \"workers\": 4,\n  \"log_level\": \"info\",\n  \"database\": {\"name\": \"shop\", \"user\": \"admin\"}\n}\n```\n\n"
    "Change the port to 8080 and show the whole file.",
    "Fix the spelling in this paragraph and return all of it:\n\nThe wether was nice yesterday, so we walked to "
    "the park and sat by the lake. Their were many ducks on the water, and the children fed them bread.",
    "Sort this shopping list alphabetically, one item per line:\n\nmilk\nbread\neggs\napples\ncheese\nbutter\n"
    "tomatoes\nrice",
    "Here is a class:\n\n```python\nclass Counter:\n    def __init__(self):\n        self.count = 0\n\n"
    "    def increment(self):\n        self.count += 1\n        return self.count\n\n    def reset(self):\n"
    "        self.count = 0\n```\n\nAdd a docstring to each method and show the whole class.",
)
CODE_EDITS = (
    "def test_add():\n    assert add(1, 2) == 3\n    assert add(0, 0) == 0\n\n\ndef test_sub():\n"
    "    assert sub(3, 2) == 1\n    assert sub(0, 0) == 0\n\n\ndef test_mul():\n",
    "COLORS = {\n    'red': (255, 0, 0),\n    'green': (0, 255, 0),\n    'blue': (0, 0, 255),\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n\n"
    "class Size:\n    def __init__(self, width, height):\n",
    "parser.add_argument('--input', type=str, help='the input file')\n"
    "parser.add_argument('--output', type=str, help='the output file')\n",
)


def held_out(pair, which: str, limit: int) -> dict[str, list[list[int]]]:
    tok = pair.tokenizer
    if which == "code":
        return {"code": [tok.encode_prompt(text, raw=True) for _, text in demo_prompts(limit)],
                "repetitive": [tok.encode_prompt(text, raw=True) for text in CODE_EDITS]}
    return {"chat": [tok.encode_prompt(text) for _, text in chat_prompts(limit)],
            "edit": [tok.encode_prompt(text) for text in CHAT_EDITS]}


def calibrated(pair, before: str | None) -> dict:
    """A fresh calibration as the app makes it (before None), or as it did before 2026-11-28 in one way: "sizing"
    (timed answers all of 64 tokens) or "pruning" (every setting timed in every round); its wall time in "wall_s"."""
    sized, share = calibrate.answer_tokens, calibrate.KEEP_SHARE
    if before == "sizing":
        calibrate.answer_tokens = lambda rate, answers: calibrate.TOKENS
    if before == "pruning":
        calibrate.KEEP_SHARE = 0.0
    try:
        start = time.perf_counter()
        choice = calibrate.choose(pair, force=True)
        return {**choice, "wall_s": time.perf_counter() - start, "variant": before or "app"}
    finally:
        calibrate.answer_tokens, calibrate.KEEP_SHARE = sized, share


def run(which: str, limit: int, tokens: int, calibrations: int, compare: str) -> dict:
    if which == "code":
        pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    else:
        pair = load_pair(chat_pair.gguf_path(), chat_pair.DRAFT_DIR)
    try:
        choices = [calibrated(pair, before) for r in range(calibrations)
                   for before in ((None, compare) if r % 2 == 0 else (compare, None))]
        settings = [("none", 0), *calibrate.settings_of(pair)]
        kinds = held_out(pair, which, limit)
        out = {"pair": which, "tokens": tokens, "choices": [calibrate.name(c["method"], c["n_max"]) for c in choices],
               "calibration_tokens": [c["tokens"] for c in choices],
               "calibration_s": [round(c["wall_s"], 1) for c in choices],
               "calibrations": [c["variant"] for c in choices],
               "calibrated_rates": [c["rates"] for c in choices], "kinds": {}}
        for kind, prompts in kinds.items():
            runs: dict[str, list[dict]] = {calibrate.name(*s): [] for s in settings}
            for i, ids in enumerate(prompts):
                order = settings if i % 2 else settings[::-1]    # interleaved prompt by prompt, alternating order
                for method, n in order:
                    server = calibrate.server(pair, method, n, max(k for m, k in settings if m == method))
                    runs[calibrate.name(method, n)].append(calibrate.measure(server, ids, n, tokens))
            totals = {k: calibrate.total(r) for k, r in runs.items()}
            medians = {k: statistics.median(r["tokens"] / r["seconds"] for r in rs if r["seconds"])
                       for k, rs in runs.items()}
            best = max(totals, key=lambda k: totals[k]["tok_s"])
            plain = totals["none"]["tok_s"]
            out["kinds"][kind] = {
                "prompts": len(prompts),
                "total_tok_s": {k: round(v["tok_s"], 1) for k, v in totals.items()},
                "tau": {k: round(v["tau"], 2) for k, v in totals.items() if k != "none"},
                "median_tok_s": {k: round(v, 1) for k, v in medians.items()},
                "vs_plain": {k: round(v["tok_s"] / plain, 3) for k, v in totals.items()},
                "best_fixed": best,
                "chosen_vs_best": [round(totals[c][("tok_s")] / totals[best]["tok_s"], 3) for c in out["choices"]]}
        return out
    finally:
        pair.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--calibrations", type=int, default=2)
    ap.add_argument("--pairs", nargs="*", default=["code", "chat"])
    ap.add_argument("--compare", choices=("pruning", "sizing"), default="pruning")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(machine_line(), time.strftime("%Y-%m-%d %H:%M"), flush=True)
    results = []
    for which in args.pairs:
        result = run(which, args.limit, args.max_new_tokens, args.calibrations, args.compare)
        results.append(result)
        print(json.dumps(result), flush=True)
        for kind, r in result["kinds"].items():
            print(f"{which}/{kind}: calibrated {list(zip(result['calibrations'], result['choices']))} (timed answers "
                  f"of {result['calibration_tokens']} tokens, {result['calibration_s']} s), best fixed "
                  f"{r['best_fixed']}; vs plain "
                  f"{r['vs_plain']}; the choice's total is {r['chosen_vs_best']} of the best fixed setting's over "
                  f"{r['prompts']} prompts", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
