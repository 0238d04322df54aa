"""The demo pair on the mlx engine next to the torch engine, interleaved prompt by prompt in one run (this
machine's speed drifts by 10-30% within minutes): plain decoding and DFlash on each engine, greedy,
end-to-end tokens/s (prefill included, as in `dflash-desktop bench`), tau, and a check that all four
outputs are the same tokens. The demo pair is a Hugging Face folder; mlx-lm converts it at load time.

Variants of the mlx drafter (--draft-bits 8 4) run as extra columns: the drafter quantized after loading.
Each engine keeps its own draft policy unless --cutoff sets one for both (torch verifies only confident
drafts on a CPU; mlx verifies whole blocks).

    python bench/bench_mlx_engine.py [--device cpu] [--limit 8] [--max-new-tokens 128] [--draft-bits 8 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.backends import load_pair  # noqa: E402
from engine.backends.mlx import engine as mlx_engine  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation, StepCosts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, or auto (the mlx engine then takes Apple's GPU)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-bits", type=int, nargs="*", default=[], choices=[4, 8])
    ap.add_argument("--cutoff", type=float, help="one draft cutoff for every engine (default: each its own)")
    ap.add_argument("--tau-only", action="store_true", help="DFlash runs only, for acceptance (no speeds)")
    args = ap.parse_args()
    target, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    pairs = {"torch": load_pair("torch", target, draft, device=args.device),
             "mlx": load_pair("mlx", target, draft, device=args.device)}
    for bits in args.draft_bits:
        pairs[f"mlx-q{bits}"] = mlx_engine.load_pair(target, draft, device=args.device, draft_bits=bits)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, draft_cutoff=args.cutoff)
    tokenizer = pairs["torch"].tokenizer
    prompts = [tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(limit=args.limit)]
    methods = ("dflash",) if args.tau_only else ("plain", "dflash")
    keys = [(name, method) for name in pairs for method in methods]
    seconds, tokens = dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0)
    committed, steps = dict.fromkeys(keys, 0), dict.fromkeys(keys, 0)   # tokens per verify pass: tau
    identical, costs = 0, {name: StepCosts() for name in pairs}
    load_before = os.getloadavg()
    for i, ids in enumerate([prompts[0]] + prompts):    # the first prompt twice: the first pass warms up
        outputs = set()
        order = keys[i % len(keys):] + keys[:i % len(keys)]   # rotate, so no variant always runs first
        for name, method in order:
            start = time.perf_counter()
            run = Generation(pairs[name], ids, settings, baseline=method == "plain", costs=costs[name]).run()
            elapsed = time.perf_counter() - start
            outputs.add(tuple(run.tokens))
            if i:
                seconds[(name, method)] += elapsed
                tokens[(name, method)] += len(run.tokens)
                committed[(name, method)] += sum(run.stats.acceptance_lengths)
                steps[(name, method)] += len(run.stats.acceptance_lengths)
        identical += i > 0 and len(outputs) == 1
    print(machine_line())
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; {len(prompts)} prompts, "
          f"{args.max_new_tokens} new tokens, device {args.device}, cutoff "
          f"{'each engine its own' if args.cutoff is None else args.cutoff}")
    for name in pairs:
        info = pairs[name].info
        tau = committed[(name, "dflash")] / steps[(name, "dflash")]
        if args.tau_only:
            print(f"{name:<9} {info['device']:<4} {info['dtype']:<9} tau {tau:5.2f}")
            continue
        plain, fast = (tokens[(name, m)] / seconds[(name, m)] for m in ("plain", "dflash"))
        print(f"{name:<9} {info['device']:<4} {info['dtype']:<9} plain {plain:7.1f} tok/s  DFlash {fast:7.1f} tok/s  "
              f"{fast / plain:5.2f}x  tau {tau:5.2f}")
    base = tokens[("torch", "plain")] / seconds[("torch", "plain")] if not args.tau_only else 0
    for name in pairs:
        if name != "torch" and base:
            print(f"{name} over torch: plain {tokens[(name, 'plain')] / seconds[(name, 'plain')] / base:.2f}x, DFlash "
                  f"{tokens[(name, 'dflash')] / seconds[(name, 'dflash')] / (tokens[('torch', 'dflash')] / seconds[('torch', 'dflash')]):.2f}x")
    print(f"all outputs identical on {identical}/{len(prompts)} prompts")


if __name__ == "__main__":
    main()
