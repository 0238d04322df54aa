"""What one decoding step costs on this machine, part by part, on the embedded demo pair: a plain
(one-token) target step, a verify of w tokens with transformers' SDPA attention and with ours
(grouped K/V heads), and one draft pass (packed drafter + LM head) in float32 and bfloat16.
All in one run; the variants of each row alternate call by call (this machine's speed drifts by
10-20% within a minute), medians of many repetitions.

    python bench/bench_step_costs.py [--context 500] [--reps 60] [--threads N]

DFlash's speedup is tau / (draft + verify) in units of a plain step, so these ratios say where
the time goes and what a change can buy.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import DEMO_DIR, machine_line  # noqa: E402
from engine.backends.torch.draft_runner import DraftRunner  # noqa: E402
from engine.backends.torch.engine import load_pair  # noqa: E402
from engine.backends.torch.cpu import GROUPED_SDPA  # noqa: E402


def interleaved_ms(variants: dict, reps: int) -> dict[str, float]:
    """Median milliseconds per call of each variant, calling them in turn so drift hits all alike."""
    times = {name: [] for name in variants}
    for rep in range(reps + 5):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            if rep >= 5:   # warm-up calls are not counted
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=500, help="tokens already in the cache")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    theirs = load_pair(DEMO_DIR / "target").target   # the same weights on transformers' own SDPA
    theirs.model.set_attn_implementation("sdpa")
    targets = {"sdpa": theirs, GROUPED_SDPA: pair.target}
    gen = torch.Generator().manual_seed(0)
    vocab = pair.target.vocab_rows
    ids = torch.randint(10, vocab, (1, args.context), generator=gen)
    rows: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for target in targets.values():
            target.reset()
            target.forward(ids, last_only=True, features=False)

        def verify(target, block):
            length = target.cached_length
            return lambda: (target.forward(block, features=False), target.rollback(length))

        for width in (1, 2, 4, 8, 16):
            block = torch.randint(10, vocab, (1, width), generator=gen)
            rows[f"target, {width} token(s)"] = interleaved_ms(
                {name: verify(target, block) for name, target in targets.items()}, args.reps)

        features = torch.randn(args.context, pair.drafter.fc.in_features, generator=gen)
        block = pair.target.embed(torch.randint(10, vocab, (pair.block_size,), generator=gen))
        new = features[:5]  # a typical step commits about five tokens

        def draft(dtype):
            runner = DraftRunner(pair.drafter, pair.target.head.weight, dtype)
            runner.hidden(block, features)   # the prompt's context

            def step():
                runner.logits(block, new)
                runner.length -= new.shape[0]   # keep the context length fixed across repetitions
            return step
        rows["draft pass (block 16)"] = interleaved_ms(
            {str(dtype).removeprefix("torch."): draft(dtype) for dtype in (torch.float32, torch.bfloat16)}, args.reps)

    plain = rows["target, 1 token(s)"]["sdpa"]
    print(f"{'step':28s} {'variant':14s} {'ms':>7s} {'plain steps':>12s}")
    for name, variants in rows.items():
        for variant, ms in variants.items():
            print(f"{name:28s} {variant:14s} {ms:7.2f} {ms / plain:12.2f}")
    print(f"context {args.context} tokens, median of {args.reps}; {machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
