"""Packed oneDNN weights (engine/packed.py) against stock F.linear, in the real decoding loop on the demo
pair: plain decoding and DFlash, each with stock and packed weights, all four alternating prompt by
prompt in one run (this machine's speed drifts by 10-30% within minutes). End-to-end tokens/s,
prefill included, as in `dflash-desktop bench`.

    python bench/bench_packed.py [--limit 20] [--max-new-tokens 256]
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import draft_runner  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.decode import Generation, GenerationSettings  # noqa: E402
from engine.packed import stock_linears  # noqa: E402
from engine.pair import draft_dtype, load_pair  # noqa: E402


def stock_runner(pair):
    """A draft runner built on plain F.linear, the way it was before packing."""
    packing = draft_runner.product_by
    draft_runner.product_by = lambda weight: (lambda x: F.linear(x, weight))
    try:
        return draft_runner.DraftRunner(pair.drafter, pair.target.head.weight, draft_dtype(pair.target.device))
    finally:
        draft_runner.product_by = packing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    runners = {"stock": stock_runner(pair), "packed": pair.draft_runner}
    prompts = [pair.encode_prompt(text, raw=True) for _, text in demo_prompts(args.limit)]
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    seconds = {(m, w): 0.0 for m in ("plain", "dflash") for w in runners}
    tokens = dict.fromkeys(seconds, 0)
    identical = 0
    for i, ids in enumerate([prompts[0]] + prompts):    # the first prompt twice: the first pass warms up
        outputs = set()
        for method, weights in seconds:
            pair.__dict__["draft_runner"] = runners[weights]
            with stock_linears(pair.target.model) if weights == "stock" else nullcontext():
                start = time.perf_counter()
                run = Generation(pair, ids, settings, baseline=method == "plain").run()
                elapsed = time.perf_counter() - start
            outputs.add(tuple(run.tokens))
            if i:
                seconds[(method, weights)] += elapsed
                tokens[(method, weights)] += len(run.tokens)
        identical += i > 0 and len(outputs) == 1
    print(machine_line())
    rate = {k: tokens[k] / seconds[k] for k in seconds}
    for (method, weights), r in rate.items():
        print(f"{method:<7}{weights:<8}{r:8.1f} tok/s")
    for weights in runners:
        print(f"DFlash over plain, {weights} weights: {rate[('dflash', weights)] / rate[('plain', weights)]:.2f}x")
    print(f"all four outputs identical on {identical}/{len(prompts)} prompts")
    print(f"packed over stock: plain {rate[('plain', 'packed')] / rate[('plain', 'stock')]:.3f}x, "
          f"DFlash {rate[('dflash', 'packed')] / rate[('dflash', 'stock')]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
