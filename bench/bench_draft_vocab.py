"""The draft vocabulary's size: draft-pass time, tau and tok/s at several sizes against the whole vocabulary and
plain decoding, interleaved per prompt in one run (machine load hits every size alike).

    python bench/bench_draft_vocab.py --pair chat [--sizes 0,4096,8192,16384] [--limit 8] [--max-new-tokens 128]
    python bench/bench_draft_vocab.py --pair demo --sizes 0,512,1024,2048,4096
    python bench/bench_draft_vocab.py --engine mlx ...        # MLX on its CPU device
    python bench/bench_draft_vocab.py --engine llamacpp --n-max 7 ...   # a server per size (llama.cpp's drafter
                                                                         # GGUF gets a head of the size's rows)

llama-server times its draft pass inside the server, so that column is empty for it.

Greedy, on held-out prompts (the demo pair's held-out files, the chat pair's held-out questions); every run must
give plain decoding's tokens, and the script says if one does not. Size 0 is the whole vocabulary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import DEMO_DIR, chat_prompts, demo_prompts, machine_line  # noqa: E402
from engine.backends import load_pair  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402


def load(pair_id: str, engine: str, sizes: list[int]) -> tuple[dict, list[list[int]]]:
    """{size: pair} (one pair for every size, but llama.cpp's: a server each) and the prompts' token ids."""
    from engine import chat_pair
    if pair_id == "demo":
        target, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    else:
        target, draft = (chat_pair.gguf_path() if engine == "llamacpp" else chat_pair.hf_folder()), chat_pair.DRAFT_DIR
    if engine == "llamacpp":
        from engine.backends.llamacpp.engine import load_pair as llamacpp_pair
        pairs = {size: llamacpp_pair(target, draft, "cpu", draft_vocab=size) for size in sizes}
    else:
        pairs = dict.fromkeys(sizes, load_pair(engine, target, draft, device="cpu"))
    tok = pairs[sizes[0]].tokenizer
    if pair_id == "demo":
        return pairs, [tok.encode_prompt(text, raw=True) for _, text in demo_prompts()]
    return pairs, [tok.encode_chat([{"role": "user", "content": text}]) for _, text in chat_prompts()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=("demo", "chat"), default="chat")
    ap.add_argument("--engine", choices=("torch", "mlx", "llamacpp"), default="torch")
    ap.add_argument("--n-max", type=int, default=7, help="llama.cpp: drafts per step")
    ap.add_argument("--sizes", default="0,4096,8192,16384")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--cutoff", type=float, help="draft cutoff (default: the engine's for the CPU)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    pairs, prompts = load(args.pair, args.engine, sizes)
    prompts = prompts[:args.limit]
    block = args.n_max + 1 if args.engine == "llamacpp" else None
    for pair in pairs.values():
        Generation(pair, prompts[0], GenerationSettings(max_new_tokens=8, block_size=block)).run()   # warm-up
    pair = pairs[sizes[0]]
    keys = ["plain", *sizes]
    secs, tokens = dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0)
    draft_s, passes, committed, steps = (dict.fromkeys(sizes, 0.0) for _ in range(4))
    identical = True
    for ids in prompts:
        if args.engine == "llamacpp":
            pair.server_for("dflash", 0)
        base = Generation(pair, ids, GenerationSettings(max_new_tokens=args.max_new_tokens), baseline=True)
        start = time.perf_counter()
        base.run()
        secs["plain"] += time.perf_counter() - start
        tokens["plain"] += len(base.tokens)
        for size in sizes:
            if args.engine == "llamacpp":
                pairs[size].server_for("dflash", args.n_max)      # started before the clock, as in a chat
            run = Generation(pairs[size], ids, GenerationSettings(
                max_new_tokens=args.max_new_tokens, draft_vocab=size, draft_cutoff=args.cutoff, block_size=block,
                plain_fallback=False))
            start = time.perf_counter()
            run.run()
            secs[size] += time.perf_counter() - start
            tokens[size] += len(run.tokens)
            draft_s[size] += run.stats.draft_s
            passes[size] += run.stats.draft_passes
            committed[size] += run.stats.accepted + run.stats.steps
            steps[size] += run.stats.steps
            identical &= run.tokens == base.tokens
    plain = tokens["plain"] / secs["plain"]
    whole = draft_s[sizes[0]] / passes[sizes[0]] if passes[sizes[0]] else None
    for each in {id(p): p for p in pairs.values()}.values():
        getattr(each, "close", lambda: None)()
    rows = []
    print(f"{'size':>8}{'draft ms':>10}{'vs first':>9}{'tau':>7}{'tok/s':>8}{'vs plain':>10}")
    print(f"{'plain':>8}{'':>10}{'':>9}{'':>7}{plain:>8.1f}")
    for size in sizes:
        ms = 1000 * draft_s[size] / passes[size] if passes[size] else None
        rate = tokens[size] / secs[size]
        row = {"size": size, "draft_ms": ms, "draft_vs_first": ms / (1000 * whole) if ms else None,
               "tau": committed[size] / steps[size], "tok_s": rate, "speedup": rate / plain}
        rows.append(row)
        timed = f"{ms:>10.2f}{row['draft_vs_first']:>8.2f}x" if ms else f"{'':>10}{'':>9}"
        print(f"{size or 'all':>8}{timed}{row['tau']:>7.2f}{rate:>8.1f}{row['speedup']:>9.2f}x")
    engine = args.engine + (f", n_max {args.n_max}" if args.engine == "llamacpp" else "")
    print(f"{args.pair} pair, {engine}, {len(prompts)} held-out prompts x {args.max_new_tokens} tokens, greedy; "
          f"outputs identical to plain decoding: {'yes' if identical else 'NO'}; {machine_line()}")
    if args.json:
        args.json.write_text(json.dumps({"pair": args.pair, "engine": engine, "plain_tok_s": plain, "rows": rows,
                                         "identical": identical, "machine": machine_line(),
                                         "date": time.strftime("%Y-%m-%d")}, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main())
