"""What rolling back one Gated DeltaNet layer costs on the mlx engine per verify step, at Qwen3.5-9B's
DeltaNet widths (16 key heads, 32 value heads of 128 x 128), three ways:

- replay (the engine's, hybrid.py + kernels.py): the verify computes its outputs from the state without
  keeping intermediate states; commit replays the accepted tokens' delta-rule steps, by the pure-MLX
  reference or, on Apple's GPU, the Metal kernel (DFLASH_MLX_METAL_REPLAY=1);
- per-token states (written here for the comparison only): the verify runs the rule token by token and
  keeps every intermediate state; commit picks the accepted one;

next to the verify's own delta rule (mlx-lm's gated_delta_update over the block, what every strategy
pays). Strategies alternate call by call; medians. The kernel rows need a Mac (Metal); on a CPU they
are skipped. Decides whether the kernel becomes the default: docs/BENCHMARKS.md, "MLX engine".

    python bench/bench_mlx_replay.py [--device gpu|cpu] [--block 16] [--keep 5] [--reps 30]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.backends.mlx import kernels  # noqa: E402


def per_token_states(k, v, g, beta, state):
    """Every intermediate state of the block: the alternative strategy's rule during a verify (without its outputs)."""
    k = mx.repeat(k, v.shape[2] // k.shape[2], axis=2)
    states = []
    for t in range(k.shape[1]):
        state = kernels._step(k[:, t], v[:, t], g[:, t], beta[:, t], state)
        states.append(state)
    return mx.stack(states)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu" if mx.metal.is_available() else "cpu")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--keep", type=int, default=5, help="accepted tokens replayed at commit")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    from mlx_lm.models.gated_delta import gated_delta_update
    device = mx.gpu if args.device == "gpu" else mx.cpu
    dtype = getattr(mx, args.dtype)
    hk, hv, dk, dv, n = 16, 32, 128, 128, args.block
    mx.random.seed(0)
    with mx.stream(device):
        q = mx.random.normal((1, n, hk, dk)).astype(dtype) * dk ** -0.5
        k = mx.random.normal((1, n, hk, dk)).astype(dtype) * dk ** -0.5
        v = mx.random.normal((1, n, hv, dv)).astype(dtype)
        a, b = mx.random.normal((1, n, hv)).astype(dtype), mx.random.normal((1, n, hv)).astype(dtype)
        a_log, dt_bias = mx.zeros((hv,)), mx.ones((hv,))
        g, beta = mx.random.uniform(0.8, 1.0, (1, n, hv)), mx.sigmoid(b.astype(mx.float32))
        state = mx.random.normal((1, hv, dv, dk)) * 0.1
        mx.eval(q, k, v, a, b, g, beta, state)
        keep = args.keep
        cases = {
            "verify's delta rule (all strategies)": lambda: gated_delta_update(q, k, v, a, b, a_log, dt_bias, state)[0],
            "replay, reference": lambda: kernels.replay_reference(k[:, :keep], v[:, :keep], g[:, :keep],
                                                                  beta[:, :keep], state),
            "per-token states (its verify rule)": lambda: per_token_states(k, v, g, beta, state),
        }
        if device == mx.gpu and kernels.metal_fits(k, v, state):
            cases["replay, Metal kernel"] = lambda: kernels.replay_metal(k[:, :keep], v[:, :keep], g[:, :keep],
                                                                         beta[:, :keep], state)
        times = {name: [] for name in cases}
        for rep in range(args.reps + 3):
            for name, fn in cases.items():
                start = time.perf_counter()
                mx.eval(fn())
                if rep >= 3:
                    times[name].append(time.perf_counter() - start)
    print(f"device {args.device}, {args.dtype} inputs, block {n}, keep {keep}, one layer "
          f"({hk} key / {hv} value heads, {dk}x{dv}); load average {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        print(f"  {name:<38} {statistics.median(ts) * 1e3:8.3f} ms")
    if "replay, Metal kernel" not in cases:
        print("  replay, Metal kernel: needs Apple's GPU (not measured here)")


if __name__ == "__main__":
    main()
