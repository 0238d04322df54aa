"""What an EAGLE-3 drafter's step costs in the torch engine against the pair's DFlash drafter, and so how many tokens a
step it must keep to pay: EAGLE-3 drafts one token per pass of its layer, DFlash a whole block in one pass.

The EAGLE-3 drafter is random (SpecForge's layout, tests/tiny_torch.py random_eagle3; no trained one exists for our
pairs), sized as EAGLE-3 drafters are: the target's width, one layer, a head over 32000 tokens where the target has
more (a d2t map), else over all of them. Its drafts are almost never kept, so its decoding speed here is not what a
trained one would reach; what is measured is the cost of its steps. Each answer runs once with each drafter at 3 and
7 drafts a step, alternating which goes first, after plain decoding of the same answer (engine/bench.py
twin_drafters; the two draft different tokens). Reported: decoding speed, time per verify step, the draft pass's
time per step, DFlash's tokens per step (tau), and the tokens per step EAGLE-3 would have to keep at its measured
step time to match plain decoding and to match DFlash.

    python bench/bench_eagle3_pass.py [--pair demo|chat] [--limit 6] [--max-new-tokens 128]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import chat_pair  # noqa: E402
from engine.backends import load_pair  # noqa: E402
from engine.bench import DEMO_DIR, chat_prompts, demo_prompts, machine_line, twin_drafters  # noqa: E402
from tests.tiny_torch import random_eagle3  # noqa: E402

N_MAX = (3, 7)
HEAD = 32000      # the draft vocabulary of the public EAGLE-3 drafters for 128k-token Llama targets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="demo", choices=("demo", "chat"))
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    print(machine_line())
    if args.pair == "demo":
        hf, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    else:
        hf, draft = chat_pair.hf_folder(), chat_pair.DRAFT_DIR
    cfg = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        eagle = random_eagle3(Path(tmp) / "eagle3", cfg, None,
                              draft_vocab=HEAD if cfg["vocab_size"] > HEAD else None)
        one, two = (load_pair("torch", hf, d, device="cpu") for d in (draft, eagle))
        if args.pair == "demo":
            prompts = [one.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts()]
        else:
            prompts = [one.tokenizer.encode_prompt(text) for _, text in chat_prompts()]
        runs = twin_drafters({"dflash": (one, "dflash"), "eagle3": (two, "eagle3")}, prompts[:args.limit],
                             tuple(n + 1 for n in N_MAX), args.max_new_tokens, draft_vocab=0)
    sums, (plain_tokens, plain_s) = runs["sums"], runs["plain"]
    plain = plain_tokens / plain_s
    print(f"engine torch (CPU), pair {args.pair}, {args.limit} prompts, {args.max_new_tokens} tokens, greedy; "
          f"EAGLE-3 head over {two.drafter.config.eagle3.draft_vocab_size} tokens")
    print(f"plain decoding: {plain:.1f} tok/s")
    print("| drafts a step | DFlash tok/s | EAGLE-3 tok/s (random) | ms per step DFlash | EAGLE-3 | draft pass ms DFlash "
          "| EAGLE-3 | DFlash tau | EAGLE-3 tau to match plain | to match DFlash |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in N_MAX:
        (t1, s1, k1, d1, p1), (t2, s2, k2, d2, p2) = sums["dflash", n + 1], sums["eagle3", n + 1]
        step2 = s2 / k2
        print(f"| {n} | {t1 / s1:.1f} | {t2 / s2:.1f} | {1000 * s1 / k1:.1f} | {1000 * step2:.1f} | "
              f"{1000 * d1 / p1:.2f} | {1000 * d2 / p2:.2f} | {t1 / k1:.2f} | {step2 * plain:.2f} | "
              f"{step2 * t1 / s1:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
