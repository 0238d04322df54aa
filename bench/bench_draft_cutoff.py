"""How many drafts to verify on this device: DFlash tok/s and tau at several draft cutoffs against plain
decoding, all on the same prompts in one run (interleaved per prompt, so machine load hits all alike).

    python bench/bench_draft_cutoff.py [--cutoffs 0,0.02,0.05,0.1,0.2,0.3] [--limit 10] [--max-new-tokens 256]
                                       [--threads N] [--json PATH]

Uses the embedded demo pair and its held-out prompts. A cutoff only decides how many drafts the target
checks, so every run must give the same tokens as plain decoding; the script says if one does not.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from engine.backends.torch.engine import load_pair  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cutoffs", default="0,0.02,0.05,0.1,0.2,0.3")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cutoffs = [float(c) for c in args.cutoffs.split(",")]
    pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    prompts = [pair.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(args.limit)]
    Generation(pair, prompts[0], GenerationSettings(max_new_tokens=8), baseline=True).run()  # warm-up
    secs = {c: 0.0 for c in ["plain", *cutoffs]}
    tokens = dict.fromkeys(secs, 0)
    steps, committed, drafted = (dict.fromkeys(cutoffs, 0) for _ in range(3))
    identical = True
    for ids in prompts:
        base = Generation(pair, ids, GenerationSettings(max_new_tokens=args.max_new_tokens), baseline=True)
        start = time.perf_counter()
        base.run()
        secs["plain"] += time.perf_counter() - start
        tokens["plain"] += len(base.tokens)
        for c in cutoffs:
            run = Generation(pair, ids, GenerationSettings(max_new_tokens=args.max_new_tokens, draft_cutoff=c,
                                                                 plain_fallback=False))
            start = time.perf_counter()
            run.run()
            secs[c] += time.perf_counter() - start
            tokens[c] += len(run.tokens)
            steps[c] += run.stats.steps
            committed[c] += sum(run.stats.acceptance_lengths)
            drafted[c] += run.stats.drafted
            identical &= run.tokens == base.tokens
    plain = tokens["plain"] / secs["plain"]
    rows = []
    print(f"{'cutoff':>8}{'tok/s':>9}{'vs plain':>10}{'tau':>7}{'drafts verified/step':>22}")
    print(f"{'plain':>8}{plain:>9.1f}")
    for c in cutoffs:
        rate = tokens[c] / secs[c]
        row = {"cutoff": c, "tok_s": rate, "speedup": rate / plain, "tau": committed[c] / steps[c],
               "drafts_per_step": drafted[c] / steps[c]}
        rows.append(row)
        print(f"{c:>8g}{rate:>9.1f}{row['speedup']:>9.2f}x{row['tau']:>7.2f}{row['drafts_per_step']:>22.1f}")
    print(f"{len(prompts)} prompts x {args.max_new_tokens} tokens; outputs identical to plain decoding: "
          f"{'yes' if identical else 'NO'}; {machine_line()}")
    if args.json:
        args.json.write_text(json.dumps({"plain_tok_s": plain, "rows": rows, "identical": identical,
                                         "machine": machine_line(), "date": time.strftime("%Y-%m-%d")}, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
