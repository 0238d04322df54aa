"""Where a DFlash step's time goes, on random weights: one plain decoding step, one draft pass, one
verify pass of B tokens, and the loop's own host overhead (time outside those forwards).

    python bench/bench_engine.py [--sizes tiny,0.6b] [--tokens 48] [--repeats 3] [--threads N] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.tiny_torch import random_pair  # noqa: E402

SIZES = {
    "tiny": dict(vocab=4096, hidden=256, layers=6, heads=4, kv_heads=2, draft_layers=2),
    # Qwen3-0.6B's shape: 28 layers, hidden 1024, 16 heads of 128 (8 KV), MLP 3072, vocab 151936
    "0.6b": dict(vocab=151936, hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072,
                 draft_layers=3),
}


class Timer:
    """Wraps a callable and adds up the seconds spent in it."""
    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __call__(self, *a, **kw):
        start = time.perf_counter()
        out = self.fn(*a, **kw)
        self.total += time.perf_counter() - start
        return out


def measure(size: str, tokens: int, repeats: int) -> dict:
    """Medians over interleaved baseline/DFlash runs, so drifting machine load hits both alike."""
    rows = [measure_once(size, tokens) for _ in range(repeats)]
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in rows)
    return out


_PAIRS: dict = {}


def measure_once(size: str, tokens: int) -> dict:
    spec = dict(SIZES[size])
    draft_layers = spec.pop("draft_layers")
    if size not in _PAIRS:
        _PAIRS[size] = random_pair("qwen3", seed=0, draft_layers=draft_layers, block_size=16, **spec)
    pair = _PAIRS[size]
    prompt = list(range(10, 74))
    settings = GenerationSettings(max_new_tokens=tokens, plain_fallback=False)
    Generation(pair, prompt, GenerationSettings(max_new_tokens=4)).run()  # warm-up
    Generation(pair, prompt, GenerationSettings(max_new_tokens=4), baseline=True).run()

    base = Generation(pair, prompt, settings, baseline=True).run()
    base_step = base.stats.decode_s / base.stats.steps

    pair.verify, pair.draft = verify_op, draft_op = Timer(pair.verify), Timer(pair.draft)
    gen = Generation(pair, prompt, settings).run()
    del pair.verify, pair.draft
    steps = gen.stats.steps
    verify = verify_op.total / steps
    draft = draft_op.total / steps
    step = gen.stats.decode_s / steps
    overhead = step - draft - verify
    return {
        "size": size, "params_target_M": sum(p.numel() for p in pair.target.model.parameters()) / 1e6,
        "params_drafter_M": sum(p.numel() for p in pair.drafter.parameters()) / 1e6,
        "baseline_step_ms": base_step * 1000, "draft_pass_ms": draft * 1000, "verify_pass_ms": verify * 1000,
        "dflash_step_ms": step * 1000, "host_overhead_ms": overhead * 1000,
        "overhead_share": overhead / step, "draft_to_verify": draft / verify,
        "verify_to_baseline_step": verify / base_step,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="tiny,0.6b")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [measure(s, args.tokens, args.repeats) for s in args.sizes.split(",")]
    print(f"machine: {machine_line()}  date: {time.strftime('%Y-%m-%d')}")
    print(f"{'size':<6}{'target M':>9}{'draft M':>8}{'base step':>10}{'draft':>8}{'verify B=16':>12}"
          f"{'overhead':>9}{'ovh %':>7}{'draft/verify':>13}")
    for r in rows:
        print(f"{r['size']:<6}{r['params_target_M']:>9.1f}{r['params_drafter_M']:>8.1f}{r['baseline_step_ms']:>9.1f}m"
              f"{r['draft_pass_ms']:>7.1f}m{r['verify_pass_ms']:>11.1f}m{r['host_overhead_ms']:>8.2f}m"
              f"{r['overhead_share']:>7.1%}{r['draft_to_verify']:>13.2f}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
