"""Shared by the A/B benchmarks: plain decoding and DFlash under two or more engine variants, all
alternating prompt by prompt in one run (this machine's speed drifts by 10-30% within minutes), with
end-to-end tokens/s (prefill included, as in `dflash-desktop bench`) and a check that every variant
gave the same tokens."""
from __future__ import annotations

import time
from typing import Callable, ContextManager

from engine.bench import machine_line
from engine.limits import GenerationSettings
from engine.loop import Generation, StepCosts


def run_ab(pair, prompts: list[list[int]], variants: dict[str, Callable[[], ContextManager]],
           max_new_tokens: int = 256) -> None:
    """Print tok/s per (method, variant), DFlash over plain per variant, and each variant over the first."""
    settings = GenerationSettings(max_new_tokens=max_new_tokens)
    keys = [(method, name) for name in variants for method in ("plain", "dflash")]
    seconds, tokens = dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0)
    identical, costs = 0, StepCosts()    # the pair's plain step cost, as the app's worker keeps it
    for i, ids in enumerate([prompts[0]] + prompts):    # the first prompt twice: the first pass warms up
        outputs = set()
        for method, name in keys:
            with variants[name]():
                start = time.perf_counter()
                run = Generation(pair, ids, settings, baseline=method == "plain", costs=costs).run()
                elapsed = time.perf_counter() - start
            outputs.add(tuple(run.tokens))
            if i:
                seconds[(method, name)] += elapsed
                tokens[(method, name)] += len(run.tokens)
        identical += i > 0 and len(outputs) == 1
    rate = {k: tokens[k] / seconds[k] for k in keys}
    print(machine_line())
    for (method, name), r in rate.items():
        print(f"{method:<7}{name:<10}{r:8.1f} tok/s")
    first = next(iter(variants))
    for name in variants:
        line = f"{name}: DFlash over plain {rate[('dflash', name)] / rate[('plain', name)]:.2f}x"
        if name != first:
            line += (f"; over {first}: plain {rate[('plain', name)] / rate[('plain', first)]:.3f}x, "
                     f"DFlash {rate[('dflash', name)] / rate[('dflash', first)]:.3f}x")
        print(line)
    print(f"all {2 * len(variants)} outputs identical on {identical}/{len(prompts)} prompts")
