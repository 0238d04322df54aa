"""What a drafter kind's extra work costs a step, per engine: the pair's DFlash drafter against its twin of another
kind that drafts exactly the same tokens, so the two differ only in what a step costs (tests/tiny_torch.py):

- `dflash2`: the drafter made a fresh DFlash2 one (`dflash2_from`: identity convolutions, a selector with nothing
  learned): two grouped convolutions around every sublayer, a top-k over the head's logits, the selector's lattice
  and its walk on the host;
- `dspark`: the drafter made a DSpark one drafting after the last token with a Markov head of zeros (`dspark_from`):
  the head's bias for each draft slot, markov_w2 @ markov_w1[the draft before], slot after slot (torch and MLX: a
  loop on the host; llama.cpp: in the drafter's graph).

Each answer runs once with each drafter at 3, 7 and 15 drafts a step, alternating which goes first
(engine/bench.py twin_drafters); the drafts are checked equal; the decoding speed (tokens after the first over
the time after the first, summed: the prompt's prefill is left out), the time per verify step and, for the step
engines, the draft pass's time per step are reported, with plain decoding for scale.

    python bench/bench_drafter_twins.py --kind dflash2|dspark [--engine llamacpp|torch|mlx] [--pair demo|chat]
        [--limit 6] [--max-new-tokens 128]

Both drafters draft from every token (draft_vocab 0). llama.cpp's calibration is skipped: every answer names its
method and drafts per step. A trained drafter of the other kind drafts other tokens; none exists for our pairs,
so what it gains in acceptance is not measured here.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import chat_pair  # noqa: E402
from engine.backends import load_pair  # noqa: E402
from engine.bench import DEMO_DIR, chat_prompts, demo_prompts, machine_line, twin_drafters  # noqa: E402
from tests.tiny_torch import dflash2_from, dspark_from  # noqa: E402

N_MAX = (3, 7, 15)
TWINS = {"dflash2": lambda draft, folder: dflash2_from(draft, folder, 0.0),
         "dspark": lambda draft, folder: dspark_from(draft, folder, scale=0.0, sample_from_anchor=False)}
LABELS = {"dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}


def pairs(kind: str, engine: str, which: str, work: Path):
    """(DFlash pair, its twin, prompt ids) on the engine."""
    if which == "demo":
        target, draft, hf = DEMO_DIR / "target", DEMO_DIR / "draft", DEMO_DIR / "target"
    else:
        target, draft, hf = chat_pair.gguf_path(), chat_pair.DRAFT_DIR, chat_pair.hf_folder()
    twin = TWINS[kind](draft, work / kind)
    if engine == "llamacpp":
        from engine.backends.llamacpp import calibrate, convert
        from engine.backends.llamacpp.engine import load_pair as llamacpp_pair
        calibrate.choose = lambda pair, cancelled=None, force=False: {
            "method": pair.drafter or "none", "n_max": pair.block_size - 1, "reason": "not measured (bench)",
            "plain_flash_attn": pair.flash_attn}
        lifted = convert.draft_gguf(twin, hf, "float16" if which == "chat" else "float32")
        one, two = llamacpp_pair(target, draft, draft_vocab=0), llamacpp_pair(target, lifted, draft_vocab=0)
    else:
        one, two = (load_pair(engine, hf, d, device="cpu") for d in (draft, twin))
    if which == "demo":
        ids = [one.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts()]
    else:
        ids = [one.tokenizer.encode_prompt(text) for _, text in chat_prompts()]
    return one, two, ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", required=True, choices=sorted(TWINS))
    ap.add_argument("--engine", default="llamacpp", choices=("llamacpp", "torch", "mlx"))
    ap.add_argument("--pair", default="demo", choices=("demo", "chat"))
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        one, two, prompts = pairs(args.kind, args.engine, args.pair, Path(tmp))
        try:
            assert two.info["method"] == args.kind, two.info["method"]
            runs = twin_drafters({"dflash": (one, "dflash"), args.kind: (two, args.kind)}, prompts[:args.limit],
                                 tuple(n + 1 for n in N_MAX), args.max_new_tokens, draft_vocab=0)
        finally:
            for pair in (one, two):
                getattr(pair, "close", lambda: None)()
    sums, (plain_tokens, plain_s) = runs["sums"], runs["plain"]
    name = LABELS[args.kind]
    print(f"engine {args.engine}, pair {args.pair}, {args.limit} prompts, {args.max_new_tokens} tokens, greedy; "
          f"same drafts and tokens in {runs['same']}/{runs['total']} answers")
    print(f"plain decoding: {plain_tokens / plain_s:.1f} tok/s")
    print(f"| drafts a step | DFlash tok/s | {name} tok/s | {name} / DFlash | ms per step DFlash | {name} | "
          f"draft pass ms DFlash | {name} | tau |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in N_MAX:
        (t1, s1, k1, d1, p1), (t2, s2, k2, d2, p2) = sums["dflash", n + 1], sums[args.kind, n + 1]
        drafts = f"{1000 * d1 / p1:.2f} | {1000 * d2 / p2:.2f}" if p1 and p2 else "- | -"
        print(f"| {n} | {t1 / s1:.1f} | {t2 / s2:.1f} | {(t2 / s2) / (t1 / s1):.2f}x | {1000 * s1 / k1:.1f} | "
              f"{1000 * s2 / k2:.1f} | {drafts} | {t1 / k1:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
