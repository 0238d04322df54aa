"""What one draft pass costs on this machine: a DFlash drafter and a DFlash2 drafter of the same sizes
(random weights), each through its packed runner, proposing one block with `--context` positions already
cached and `--new` context rows fed with the block (the accepted tokens of the step before). The DFlash2
pass adds two convolutions per sublayer, a top-k over the LM head's logits and the candidate selector's
walk. Variants alternate call by call (this machine's speed drifts); medians. `--engine mlx` times the MLX
drafters instead (engine/backends/mlx/drafter2.py; on this machine MLX's CPU device).

    python bench/bench_draft2_pass.py [--engine torch|mlx] [--hidden 1024 --layers 5 --vocab 32768] [--reps 40]

Sizes default to a small drafter; a real one (Qwen3.8-27B-DFlash2: hidden 5120, 5 layers, vocabulary
248320, intermediate 17408, 32/8 heads of 128) is built in float32 first and then packed: it needs more
than 16 GB of memory even with `--dtype bfloat16`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import machine_line  # noqa: E402
from engine.backends.torch.draft2_runner import Draft2Runner  # noqa: E402
from engine.backends.torch.draft_runner import DraftRunner  # noqa: E402
from engine.backends.torch.drafter import DFlashDrafter  # noqa: E402
from engine.backends.torch.drafter2 import DFlash2Drafter  # noqa: E402
from engine.backends.torch.sampling import propose  # noqa: E402
from engine.config import DraftConfig  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402


def config(args, generation: int) -> DraftConfig:
    raw = {"architectures": ["DFlashDraftModel" if generation == 1 else "DFlash2DraftModel"],
           "hidden_size": args.hidden, "intermediate_size": args.intermediate or 3 * args.hidden,
           "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
           "head_dim": args.head_dim or args.hidden // args.heads, "num_hidden_layers": args.layers,
           "rms_norm_eps": 1e-6, "vocab_size": args.vocab, "max_position_embeddings": 1 << 16,
           "dflash_config": {"block_size": args.block, "mask_token_id": args.vocab - 1,
                             "target_layer_ids": list(range(args.captured))}}
    if generation == 2:
        raw.update(is_causal=False, layer_types=["sliding_attention"] * args.layers, sliding_window=2048)
        raw["dflash_config"].update(conv_kernel_size=2, conv_group_size=args.group, selector_rank=args.rank,
                                    selector_top_k=args.top_k)
    return DraftConfig.from_dict(raw)


def build(args, generation: int, head: torch.Tensor):
    torch.manual_seed(generation)
    drafter = (DFlashDrafter if generation == 1 else DFlash2Drafter)(config(args, generation))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5)
    drafter = drafter.to(getattr(torch, args.dtype)).eval()
    runner = (DraftRunner if generation == 1 else Draft2Runner)(drafter, head)
    with torch.inference_mode():
        runner.hidden(torch.randn(1, args.hidden), torch.randn(args.context, args.captured * args.hidden))
    return runner


def mlx_variants(args, greedy, sampled) -> dict:
    """The same four draft passes with the MLX drafters (random weights of the same sizes)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from engine.backends.mlx.drafter2 import DRAFTERS
    from engine.backends.mlx.sampling import Keys, propose as mlx_propose
    dtype = getattr(mx, args.dtype)
    head = (mx.random.normal((args.vocab, args.hidden)) * args.hidden ** -0.5).astype(dtype)
    block = mx.random.normal((args.block, args.hidden)).astype(dtype)
    new = mx.random.normal((args.new, args.captured * args.hidden)).astype(dtype)
    keys, drafters = Keys(0), {}
    for generation in (1, 2):
        cfg = config(args, generation)
        mx.random.seed(generation)
        drafter = DRAFTERS[generation](cfg)
        drafter.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else p,
                                drafter.parameters()))
        drafter.set_dtype(dtype)
        drafter.reset()
        mx.eval(drafter.hidden(block[:1], mx.random.normal((args.context, args.captured * args.hidden)).astype(dtype)))
        drafters[generation] = drafter

    def dflash(settings):
        hidden = drafters[1].hidden(block, new)[1:]
        drafts, q = mlx_propose((hidden @ head.T).astype(mx.float32), settings, keys)
        mx.eval(drafts, *([q] if q is not None else []))

    def dflash2(settings):
        hidden = drafters[2].hidden(block, new)[1:]
        mx.eval(*drafters[2].propose(hidden, hidden @ head.T, 0, settings, keys))

    return {"DFlash, greedy": lambda: dflash(greedy), "DFlash2, greedy": lambda: dflash2(greedy),
            "DFlash, sampling": lambda: dflash(sampled), "DFlash2, sampling": lambda: dflash2(sampled)}


def main() -> int:
    ap = argparse.ArgumentParser()
    for name, default in (("hidden", 1024), ("layers", 5), ("vocab", 32768), ("heads", 8), ("kv-heads", 2),
                          ("head-dim", 0), ("intermediate", 0), ("captured", 5), ("block", 16), ("context", 500),
                          ("new", 2), ("top-k", 16), ("rank", 256), ("group", 16), ("reps", 40), ("threads", 0)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--engine", default="torch", choices=("torch", "mlx"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    greedy, sampled = GenerationSettings(), GenerationSettings(temperature=1.0)
    variants = mlx_variants(args, greedy, sampled) if args.engine == "mlx" else torch_variants(args, greedy, sampled)
    times = {name: [] for name in variants}
    with torch.inference_mode():
        for rep in range(args.reps + 3):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                if rep >= 3:
                    times[name].append(time.perf_counter() - start)
    print(f"{machine_line()}; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{args.engine} engine: hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, block "
          f"{args.block}, context {args.context} cached + {args.new} new per pass (growing), {args.dtype}, top-k "
          f"{args.top_k}, rank {args.rank}")
    print("| draft pass | ms (median) |\n|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t) * 1e3:.2f} |")
    return 0


def torch_variants(args, greedy, sampled) -> dict:
    head = (torch.randn(args.vocab, args.hidden) * args.hidden ** -0.5).to(getattr(torch, args.dtype))
    gen = torch.Generator().manual_seed(0)
    block = torch.randn(args.block, args.hidden).to(getattr(torch, args.dtype))
    new = torch.randn(args.new, args.captured * args.hidden)
    runners = {g: build(args, g, head) for g in (1, 2)}

    def dflash(settings):
        return propose(runners[1].logits(block, new), settings, gen)

    def dflash2(settings):
        return runners[2].propose(block, new, 0, settings, gen)

    return {"DFlash, greedy": lambda: dflash(greedy), "DFlash2, greedy": lambda: dflash2(greedy),
            "DFlash, sampling": lambda: dflash(sampled), "DFlash2, sampling": lambda: dflash2(sampled)}


if __name__ == "__main__":
    sys.exit(main())
