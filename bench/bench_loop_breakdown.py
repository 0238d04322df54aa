"""Where the decoding loop's time goes, measured inside the real loop on the demo pair (not in isolated
calls, which miss what the loop adds): milliseconds per step in each engine operation (prefill, draft,
verify, commit) and in the loop's own bookkeeping, for plain decoding and DFlash, alternating runs.

    python bench/bench_loop_breakdown.py [--limit 20] [--rounds 2]
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation, StepCosts  # noqa: E402
from engine.backends.torch.engine import load_pair  # noqa: E402

TIMED = collections.defaultdict(float)


def timed(owner, name: str, label: str) -> None:
    """Replace owner.name by a wrapper that adds its wall time to TIMED[label]."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TIMED[label] += time.perf_counter() - start
    setattr(owner, name, wrapper)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    for op in ("prefill", "draft", "verify", "commit"):
        timed(pair, op, op)
    timed(Generation, "_commit", "stop rules and text")
    prompts = [pair.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(args.limit)]
    settings = GenerationSettings(max_new_tokens=256)
    costs = StepCosts()
    Generation(pair, prompts[0], GenerationSettings(max_new_tokens=8), costs=costs).run()   # warm-up
    print(machine_line())
    for _ in range(args.rounds):
        for mode in ("plain", "dflash"):
            TIMED.clear()
            tokens, steps, total = 0, 0, 0.0
            for ids in prompts:
                start = time.perf_counter()
                run = Generation(pair, ids, settings, baseline=mode == "plain", costs=costs).run()
                total += time.perf_counter() - start
                tokens, steps = tokens + len(run.tokens), steps + run.stats.steps
            parts = ", ".join(f"{k} {1e3 * v / steps:.2f}" for k, v in TIMED.items())
            print(f"{mode}: {tokens / total:.1f} tok/s, {steps} steps, {1e3 * total / steps:.2f} ms per step "
                  f"(all included): {parts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
