"""Two drafters of the demo target on the same held-out prompts, interleaved prompt by prompt with plain
decoding, so a retrained drafter is judged against the shipped one in one run (this machine's speed
drifts by 10-20% within minutes, so separate runs cannot compare them).

    python bench/bench_compare_drafters.py NEW_DRAFT_DIR [--old assets/demo/draft] [--limit 20]

Prints per-file tok/s and tau for both, then the totals and each drafter's speedup over plain decoding.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from engine.backends.torch.engine import load_pair  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("new", help="drafter folder to judge")
    ap.add_argument("--old", default=str(DEMO_DIR / "draft"), help="drafter to compare with (default: shipped)")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pairs = {"old": load_pair(DEMO_DIR / "target", args.old), "new": load_pair(DEMO_DIR / "target", args.new)}
    plain = pairs["old"]
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, plain_fallback=False)
    prompts = demo_prompts(args.limit)
    warm = plain.tokenizer.encode_prompt(prompts[0][1], raw=True)
    for pair in pairs.values():
        Generation(pair, warm, GenerationSettings(max_new_tokens=8)).run()
    Generation(plain, warm, GenerationSettings(max_new_tokens=8), baseline=True).run()

    tokens = {k: 0 for k in ("plain", *pairs)}
    seconds = dict.fromkeys(tokens, 0.0)
    lengths: dict[str, list[int]] = {k: [] for k in pairs}
    print(machine_line())
    for name, text in prompts:
        ids = plain.tokenizer.encode_prompt(text, raw=True)
        runs = {"plain": Generation(plain, ids, settings, baseline=True).run()}
        runs.update({k: Generation(p, ids, settings).run() for k, p in pairs.items()})
        for k, run in runs.items():
            tokens[k] += len(run.tokens)
            seconds[k] += len(run.tokens) / run.stats.end_to_end_tok_s
        for k in pairs:
            lengths[k] += runs[k].stats.acceptance_lengths
        identical = all(run.tokens == runs["plain"].tokens for run in runs.values())
        print(f"{name:40s} plain {runs['plain'].stats.end_to_end_tok_s:6.1f}  "
              + "  ".join(f"{k} {runs[k].stats.end_to_end_tok_s:6.1f} (tau {runs[k].stats.tau:5.2f})" for k in pairs)
              + f"  identical {identical}", flush=True)
    tok_s = {k: tokens[k] / seconds[k] for k in tokens}
    for k in pairs:
        tau = sum(lengths[k]) / len(lengths[k]) if lengths[k] else 0.0   # pooled over every verify pass
        print(f"{k}: {tok_s[k]:.1f} tok/s, {tok_s[k] / tok_s['plain']:.2f}x over plain ({tok_s['plain']:.1f}), "
              f"tau {tau:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
