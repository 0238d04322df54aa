"""What DFlash2's draft pass costs in llama.cpp: the pair's DFlash drafter against the same drafter made a
fresh DFlash2 one (identity convolutions, a selector with nothing learned), which drafts exactly the tokens
the DFlash one drafts, so the two differ only in the cost of a step: DFlash2's two convolutions around every
sublayer, its top-k over the head's logits and the selector's lattice, walked on the host. Each answer runs
once with each drafter at n_max 3, 7 and 15, alternating which goes first; the drafts are checked equal; the
decoding speed per setting (tokens after the first over the time after the first, summed over the answers: the
prompt's prefill is left out) and the time per verify step are reported, with plain decoding for scale.

    python bench/bench_llamacpp_dflash2.py [--pair demo|chat] [--limit 6] [--max-new-tokens 128]

Both drafters draft from every token (draft_vocab 0), so the shipped ranking does not make them differ.
Calibration is skipped: every answer names its method and drafts per step.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import chat_pair  # noqa: E402
from engine.backends.llamacpp import calibrate, convert  # noqa: E402
from engine.backends.llamacpp.engine import load_pair  # noqa: E402
from engine.bench import DEMO_DIR, chat_prompts, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.tiny_torch import dflash2_from  # noqa: E402

N_MAX = (3, 7, 15)


def pairs(which: str, work: Path):
    """(DFlash pair, DFlash2 pair, prompt ids) on llama.cpp."""
    calibrate.choose = lambda pair, cancelled=None, force=False: {
        "method": pair.drafter or "none", "n_max": pair.block_size - 1, "reason": "not measured (bench)",
        "plain_flash_attn": pair.flash_attn}
    if which == "demo":
        target, draft, hf = DEMO_DIR / "target", DEMO_DIR / "draft", DEMO_DIR / "target"
    else:
        target, draft, hf = chat_pair.gguf_path(), chat_pair.DRAFT_DIR, chat_pair.hf_folder()
    lifted = convert.draft_gguf(dflash2_from(draft, work / "dflash2", 0.0), hf, "float16" if which == "chat"
                                else "float32")
    one, two = load_pair(target, draft, draft_vocab=0), load_pair(target, lifted, draft_vocab=0)
    if which == "demo":
        texts = [text for _, text in demo_prompts()]
        ids = [one.tokenizer.encode_prompt(t, raw=True) for t in texts]
    else:
        ids = [one.tokenizer.encode_prompt(text) for _, text in chat_prompts()]
    return one, two, ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="demo", choices=("demo", "chat"))
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        one, two, prompts = pairs(args.pair, Path(tmp))
        try:
            assert two.info["drafter_generation"] == 2 and one.info["drafter_generation"] == 1
            sums = {(m, n): [0, 0.0, 0] for m in ("dflash", "dflash2") for n in N_MAX}   # tokens, s, steps
            plain = [0, 0.0]
            same = total = 0
            for i, ids in enumerate([prompts[0]] + prompts[:args.limit]):     # the first prompt twice: a warm-up
                base = dict(max_new_tokens=args.max_new_tokens, plain_fallback=False)
                ref = Generation(one, ids, GenerationSettings(**base), baseline=True).run()
                if i:
                    plain[0] += ref.stats.generated_tokens - 1
                    plain[1] += ref.stats.decode_s
                for n in N_MAX:
                    runs = {}
                    order = (("dflash", one), ("dflash2", two))
                    for method, pair in (order if (i + n) % 2 else order[::-1]):
                        runs[method] = r = Generation(pair, ids, GenerationSettings(**base, method=method,
                                                                                    block_size=n + 1)).run()
                        if i:
                            s = sums[method, n]
                            s[0] += r.stats.generated_tokens - 1
                            s[1] += r.stats.decode_s
                            s[2] += r.stats.generated_tokens - r.stats.accepted
                    a, b = runs["dflash"], runs["dflash2"]
                    if i:
                        total += 1
                        same += (a.tokens, a.stats.drafted, a.stats.accepted) == (
                            b.tokens, b.stats.drafted, b.stats.accepted)
        finally:
            one.close()
            two.close()
    print(f"pair {args.pair}, {args.limit} prompts, {args.max_new_tokens} tokens, greedy; "
          f"same drafts and tokens in {same}/{total} answers")
    print(f"plain decoding: {plain[0] / plain[1]:.1f} tok/s")
    print("| n_max | DFlash tok/s | DFlash2 tok/s | DFlash2 / DFlash | ms per step DFlash | DFlash2 | tau |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in N_MAX:
        (t1, s1, k1), (t2, s2, k2) = sums["dflash", n], sums["dflash2", n]
        print(f"| {n} | {t1 / s1:.1f} | {t2 / s2:.1f} | {(t2 / s2) / (t1 / s1):.2f}x | {1000 * s1 / k1:.1f} | "
              f"{1000 * s2 / k2:.1f} | {t1 / k1:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
