"""The plain fallback on the demo pair: what it costs when the drafter is good (it should never trigger)
and what it saves when acceptance collapses (a drafter of the right shape with random weights: every
draft rejected). Plain decoding, and DFlash with the fallback on and off, alternate prompt by prompt;
end-to-end tok/s over all prompts. Also prints this pair's break-even on this machine: the mean DFlash
step time in plain steps, the tokens per step at which DFlash only keeps pace with plain decoding.

    python bench/bench_fallback.py [--limit 10] [--max-new-tokens 256]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.backends.torch.drafter import DFlashDrafter  # noqa: E402
from engine.backends.torch.eager import TorchPair  # noqa: E402
from engine.backends.torch.engine import load_pair  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation, StepCosts  # noqa: E402


def collapsed(pair: TorchPair) -> TorchPair:
    """The same target with a drafter of the demo drafter's shape and random weights."""
    torch.manual_seed(0)
    drafter = DFlashDrafter(pair.drafter.config)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5)
    return TorchPair(pair.target, drafter.eval(), pair.tokenizer, "demo target, random drafter")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    good = load_pair(DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu")
    bad = collapsed(good)
    prompts = [good.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(args.limit)]
    on = GenerationSettings(max_new_tokens=args.max_new_tokens)
    off = GenerationSettings(max_new_tokens=args.max_new_tokens, plain_fallback=False)
    runs = {"plain": (good, on, True), "good, fallback off": (good, off, False), "good, fallback on": (good, on, False),
            "collapsed, fallback on": (bad, on, False), "collapsed, fallback off": (bad, off, False)}
    costs = {id(good): StepCosts(), id(bad): StepCosts()}   # each pair's plain step cost, as the worker keeps it
    for pair in (good, bad):   # warm-up; also times the plain step the fallback compares with
        Generation(pair, prompts[0], GenerationSettings(max_new_tokens=32), baseline=True, costs=costs[id(pair)]).run()
    tokens, seconds, fallbacks = dict.fromkeys(runs, 0), dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 0)
    steps_s, steps_n, plain_s = [], [], []
    for ids in prompts:
        outputs = set()
        for name, (pair, settings, baseline) in runs.items():
            start = time.perf_counter()
            run = Generation(pair, ids, settings, baseline=baseline, costs=costs[id(pair)]).run()
            seconds[name] += time.perf_counter() - start
            tokens[name] += len(run.tokens)
            fallbacks[name] += run.fallback is not None
            outputs.add(tuple(run.tokens))
            if name == "plain":
                plain_s.append(run.stats.decode_s / max(run.stats.steps, 1))
            if name == "good, fallback off":
                steps_s.append(run.stats.decode_s)
                steps_n.append(run.stats.steps)
        assert len(outputs) == 1, "a run gave other tokens than plain decoding"
    print(machine_line())
    plain = tokens["plain"] / seconds["plain"]
    for name in runs:
        rate = tokens[name] / seconds[name]
        print(f"{name:26s}{rate:8.1f} tok/s  {rate / plain:5.2f}x plain   fallbacks {fallbacks[name]}/{len(prompts)}")
    step, plain_step = sum(steps_s) / sum(steps_n), sum(plain_s) / len(plain_s)
    print(f"break-even on this machine: a DFlash step costs {step * 1e3:.2f} ms, a plain step {plain_step * 1e3:.2f} ms "
          f"(the loop's own estimate: {costs[id(good)].plain_s * 1e3:.2f} ms), so DFlash pays above "
          f"{step / plain_step:.2f} tokens per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
