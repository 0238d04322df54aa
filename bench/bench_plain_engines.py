"""Plain decoding, torch engine against llama.cpp, on a random target shaped like Qwen3-0.6B (hidden 1024,
28 layers, 16 query / 8 KV heads of 128, MLP 3072), interleaved prompt by prompt. The vocabulary is the demo
tokenizer's 4096 tokens (the converter must know the tokenizer; Qwen's 151,936-token head is not there, so
the real model reads about a quarter more weights per token). Random weights: no drafter would accept
anything, so this measures each engine's plain decoding only, which is what decides the default engine.

    python bench/bench_plain_engines.py [--work work-data/qwen3-0.6b-shape] [--prompts 3] [--tokens 64]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine.backends.llamacpp import convert  # noqa: E402
from engine.backends.llamacpp.engine import load_pair as llamacpp_pair  # noqa: E402
from engine.backends.torch.engine import load_pair as torch_pair  # noqa: E402
from tests.tiny_torch import save_random_pair  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

SHAPE = dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=ROOT / "work-data" / "qwen3-0.6b-shape")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gguf", nargs="+", default=["float32", "q8_0"], help="llama.cpp target types to time")
    args = p.parse_args(argv)
    target = args.work / "target"
    if not (target / "model.safetensors").is_file():
        save_random_pair(args.work, tokenizer_dir=DEMO_DIR / "target", **SHAPE)
    settings = GenerationSettings(max_new_tokens=args.tokens, plain_fallback=False)
    pairs = {"torch float32": torch_pair(target)}
    for dtype in args.gguf:
        convert.target_gguf(target, dtype)
        pairs[f"llama.cpp {dtype}"] = llamacpp_pair(target, None, dtype=dtype)
    prompts = [pairs["torch float32"].tokenizer.encode_prompt(text, raw=True)[:256]
               for _, text in demo_prompts(limit=args.prompts)]
    rates = {name: [] for name in pairs}
    for i, ids in enumerate([prompts[0]] + prompts):       # the first prompt twice: a warm-up
        for name, pair in pairs.items():
            run = Generation(pair, ids, settings, baseline=True).run()
            if i:
                rates[name].append(run.stats.decode_tok_s)
                print(f"prompt {i} {name}: {run.stats.decode_tok_s:.1f} tok/s", file=sys.stderr)
    for pair in pairs.values():
        getattr(pair, "close", lambda: None)()
    print(f"{machine_line()}; random Qwen3-0.6B-shaped target, {len(prompts)} prompts x {args.tokens} tokens")
    for name, r in rates.items():
        print(f"{name:<20}{statistics.median(r):>8.1f} tok/s (median, decoding only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
