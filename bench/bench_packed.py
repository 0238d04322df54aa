"""Packed oneDNN weights (engine/backends/torch/packed.py) against stock F.linear, in the real decoding loop on the demo
pair: plain decoding and DFlash, each with stock and packed weights, alternating prompt by prompt.

    python bench/bench_packed.py [--limit 20] [--max-new-tokens 256]
"""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ab_runs import run_ab  # noqa: E402
from engine.backends.torch import draft_runner  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts  # noqa: E402
from engine.backends.torch.packed import stock_linears  # noqa: E402
from engine.backends.torch.cpu import draft_dtype  # noqa: E402
from engine.backends.torch.engine import load_pair  # noqa: E402


def stock_runner(pair):
    """A draft runner built on plain F.linear, the way it was before packing."""
    packing = draft_runner.product_by
    draft_runner.product_by = lambda weight: (lambda x: F.linear(x, weight))
    try:
        return draft_runner.DraftRunner(pair.drafter, pair.target.head.weight, draft_dtype())
    finally:
        draft_runner.product_by = packing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    pair = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    runners = {"stock": stock_runner(pair), "packed": pair.runner}

    @contextmanager
    def stock():
        pair.runner = runners["stock"]
        with stock_linears(pair.target.model):
            yield

    @contextmanager
    def packed():
        pair.runner = runners["packed"]
        yield

    prompts = [pair.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(args.limit)]
    run_ab(pair, prompts, {"stock": stock, "packed": packed}, args.max_new_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
