"""llama.cpp against our torch engine on the same weights (the demo pair, f32), interleaved prompt by prompt
(this machine's speed drifts by 10-30% within minutes): llama.cpp plain decoding, llama.cpp DFlash at each
n_max, the torch engine's plain decoding and DFlash. Every method must give the same greedy tokens.

    python bench/bench_llamacpp.py [--limit 20] [--max-new-tokens 256] [--n-max 3 7 15] [--fallback 7 15]
                                   [--json out.json]

Decode tok/s is what the window shows (tokens after the first over the seconds after the first, the
server's HTTP stream included): the median over prompts, and `total` over all prompts together, whose ratio
to `llamacpp plain stock` (llama.cpp's own flags, as its users run it) is the `vs stock` column. The
other llama.cpp methods run with the engine's flags (flash attention off on a CPU). `server` is llama.cpp's
own count (`timings.predicted_per_second`). `dflash n_max N fallback` runs DFlash with the loop's plain
fallback on, as the app does: an answer whose drafts stop paying continues plainly (the other DFlash
rows keep drafting whatever happens). For
llama.cpp DFlash it also prints a step's cost (the server's decode time over its verify steps) and the
tokens each step gives. Greedy outputs may part where the target's two best logits are a float-rounding
tie (llama.cpp's batched verify and one-token decode use different kernels): such prompts are counted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine.backends.llamacpp.engine import load_pair as llamacpp_pair  # noqa: E402
from engine.backends.llamacpp.server import request_body  # noqa: E402
from engine.backends.torch.engine import load_pair as torch_pair  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

def server_rate(pair, ids, settings) -> dict:
    """One answer straight from the server (no loop): its own decode timing and draft counts."""
    last = {}
    for event in pair.server.stream(request_body(ids, settings)):
        last = event
    return last.get("timings") or {}


def total_rate(rates: list[float]) -> float:
    """tok/s over all prompts together (equal tokens each): the harmonic mean, which a slow prompt pulls down."""
    return len(rates) / sum(1 / r for r in rates)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--n-max", type=int, nargs="+", default=[3, 7, 15])
    p.add_argument("--fallback", type=int, nargs="*", default=[7, 15], help="n_max values also run with the fallback")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, plain_fallback=False)
    lc = llamacpp_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    tp = torch_pair(DEMO_DIR / "target", DEMO_DIR / "draft")
    prompts = [lc.tokenizer.encode_prompt(text, raw=True) for _, text in demo_prompts(limit=args.limit)]
    ours = lc.flash_attn                  # the engine's flags; "stock" is llama.cpp's own (-fa auto), as users run it
    methods = (["llamacpp plain stock", "llamacpp plain"] + [f"llamacpp dflash n_max {n}" for n in args.n_max]
               + [f"llamacpp dflash n_max {n} fallback" for n in args.fallback] + ["torch plain", "torch dflash"])
    rates = {m: [] for m in methods}
    server = {m: [] for m in methods if m.startswith("llamacpp")}
    split = {n: [] for n in args.n_max}          # (verify steps, decode ms, tokens) per answer
    switched = {m: [] for m in methods if m.endswith("fallback")}   # tokens before the switch, per answer
    same = 0
    for i, ids in enumerate([prompts[0]] + prompts):     # the first prompt twice: the first pass warms up
        outputs = set()
        for m in methods:
            n_max = int(m.split("n_max ")[1].split()[0]) if "n_max" in m else 0
            if m.startswith("llamacpp"):
                lc.flash_attn = "auto" if m.endswith("stock") else ours
                lc.server_for("dflash", n_max)            # started before the clock, as in a chat
                s = GenerationSettings(max_new_tokens=args.max_new_tokens, block_size=n_max + 1 if n_max else None,
                                       plain_fallback=m.endswith("fallback"))
                run = Generation(lc, ids, s, baseline=not n_max).run()
                if i and run.fallback:
                    switched[m].append(run.fallback["after_tokens"])
                t = {} if m.endswith("fallback") else server_rate(lc, ids, s)
                if i and t:
                    server[m].append(float(t.get("predicted_per_second", 0.0)))
                    if n_max:
                        steps = int(t["predicted_n"]) - 1 - int(t.get("draft_n_accepted", 0))
                        split[n_max].append((steps, float(t["predicted_ms"]), int(t["predicted_n"])))
            else:
                run = Generation(tp, ids, settings, baseline=m == "torch plain").run()
            outputs.add(tuple(run.tokens))
            if i:
                rates[m].append(run.stats.decode_tok_s)
        if i:
            same += len(outputs) == 1
            print(f"prompt {i}: " + ", ".join(f"{m} {rates[m][-1]:.0f}" for m in methods), file=sys.stderr)
    lc.close()
    print(f"{machine_line()}; {len(prompts)} prompts x {args.max_new_tokens} tokens, greedy, decode tok/s (median)")
    print(f"llama.cpp flags: ours -fa {ours}, stock -fa auto")
    print(f"{'method':<26}{'app':>8}{'server':>8}{'total':>8}{'vs stock':>10}")
    stock = total_rate(rates["llamacpp plain stock"])
    for m in methods:
        srv = f"{statistics.median(server[m]):.0f}" if server.get(m) else ""
        total = total_rate(rates[m])
        print(f"{m:<26}{statistics.median(rates[m]):>8.0f}{srv:>8}{total:>8.0f}{total / stock:>9.2f}x")
    for m, after in switched.items():
        print(f"{m}: switched to plain in {len(after)} of {len(prompts)} answers, after {sorted(after)} tokens")
    for n, rows in split.items():
        steps = sum(r[0] for r in rows)
        if steps:
            print(f"llama.cpp DFlash n_max {n}: {sum(r[1] for r in rows) / steps:.2f} ms per verify step, "
                  f"{sum(r[2] for r in rows) / steps:.2f} tokens per step")
    print(f"greedy outputs identical across all methods on {same}/{len(prompts)} prompts "
          "(tests/test_llamacpp_engine.py checks that llama.cpp's DFlash parts only at float-rounding ties)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "date": time.strftime("%Y-%m-%d"),
                                         "rates": rates, "server": server, "split": split, "switched": switched,
                                         "identical_prompts": same},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
