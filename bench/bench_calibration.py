"""Does llama.cpp's calibrated choice hold on the prompts users send? For the code pair (held-out standard-library
files) and the chat pair (held-out chats), in one run: calibrate afresh (three prompts of its own, interleaved,
calibrate.py), then decode the held-out prompts with plain decoding and DFlash at each n_max, interleaved prompt by
prompt, and compare the calibrated setting's total with the best fixed setting's. Repeated calibrations show how
often a busy or noisy moment changes the choice.

    python bench/bench_calibration.py [--limit 12] [--max-new-tokens 128] [--calibrations 2] [--json out.json]

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


def held_out(pair, which: str, limit: int) -> list[list[int]]:
    if which == "code":
        return [pair.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(limit)]
    return [pair.tokenizer.encode_prompt(text) for _, text in chat_prompts(limit)]


def run(which: str, limit: int, tokens: int, calibrations: int) -> dict:
    if which == "code":
        pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    else:
        pair = load_pair(chat_pair.gguf_path(), chat_pair.DRAFT_DIR)
    try:
        choices = [calibrate.choose(pair, force=True) for _ in range(calibrations)]
        settings = [0, *sorted({min(c, pair.block_size - 1) for c in calibrate.CANDIDATES})]
        runs: dict[int, list[dict]] = {n: [] for n in settings}
        for ids in held_out(pair, which, limit):
            for n in settings:          # interleaved prompt by prompt; plain on its own server, DFlash on one
                server = pair.server_for(max(settings) if n else 0)
                runs[n].append(calibrate.measure(server, ids, n, tokens))
        totals = {n: calibrate.total(r)["tok_s"] for n, r in runs.items()}
        medians = {n: statistics.median(r["tokens"] / r["seconds"] for r in rs if r["seconds"])
                   for n, rs in runs.items()}
        best = max(totals, key=totals.get)
        return {"pair": which, "prompts": len(runs[0]), "tokens": tokens,
                "choices": [c["n_max"] for c in choices], "calibrated_rates": [c["rates"] for c in choices],
                "total_tok_s": {str(n): round(v, 1) for n, v in totals.items()},
                "median_tok_s": {str(n): round(v, 1) for n, v in medians.items()},
                "best_fixed": best,
                "chosen_vs_best": [round(totals[c["n_max"]] / totals[best], 3) for c in choices]}
    finally:
        pair.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--calibrations", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(machine_line(), time.strftime("%Y-%m-%d %H:%M"), flush=True)
    results = []
    for which in ("code", "chat"):
        result = run(which, args.limit, args.max_new_tokens, args.calibrations)
        results.append(result)
        print(json.dumps(result), flush=True)
        print(f"{which}: calibrated n_max {result['choices']}, best fixed {result['best_fixed']}; the choice's total "
              f"is {result['chosen_vs_best']} of the best fixed setting's over {result['prompts']} held-out prompts",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
