"""What rolling a Gated DeltaNet target back costs per verify step, two ways, on a Qwen3.5-shaped random
model (Qwen3.5-9B's layer widths, fewer layers so it fits a desktop CPU):

- snapshot and replay (the engine's, hybrid.py): the verify reads the recurrent state without writing it
  and keeps the block's delta-rule inputs; commit replays the accepted tokens in one chunk;
- per-token states (written here for the comparison only): the verify runs the recurrence token by token
  and keeps every intermediate state; commit picks the accepted one;

against a verify that does not roll back at all (transformers' own forward: wrong after a rejection,
the floor of what a verify costs). Strategies alternate call by call; medians.

    python bench/bench_hybrid_rollback.py [--layers 4] [--block 16] [--keep 5] [--reps 15] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.backends.torch.hybrid import DeltaNetRollback, _helpers  # noqa: E402
from engine.backends.torch.target import TargetModel  # noqa: E402
from engine.bench import machine_line  # noqa: E402


class PerTokenStates(DeltaNetRollback):
    """The alternative: every intermediate recurrent state of the verify is kept; commit selects one."""

    def commit(self, cache, keep: int) -> None:
        for idx, states in self.tapes.items():
            cache.update_recurrent_state(states[keep - 1], idx)
        self.tapes = {}

    def _verify_forward(self, layer, x, cache):
        h = _helpers(layer)
        b, n, _ = x.shape
        idx = layer.layer_idx
        mixed = layer.in_proj_qkv(x).transpose(1, 2)
        z = layer.in_proj_z(x).reshape(b, n, -1, layer.head_v_dim)
        beta = layer.in_proj_b(x).sigmoid().float()
        g = -layer.A_log.float().exp() * F.softplus(layer.in_proj_a(x).float() + layer.dt_bias)
        window = cache.update_conv_state(mixed, idx, conv_kernel_size=layer.conv_kernel_size)
        mixed = h.causal_conv1d_fn(window, layer.conv1d.weight.squeeze(1), layer.conv1d.bias,
                                   activation=layer.activation)[:, :, -n:].transpose(1, 2)
        q, k, v = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
        heads = layer.num_v_heads // layer.num_k_heads
        q = h.l2norm(q.reshape(b, n, -1, layer.head_k_dim).float()).repeat_interleave(heads, 2)
        k = h.l2norm(k.reshape(b, n, -1, layer.head_k_dim).float()).repeat_interleave(heads, 2)
        v = v.reshape(b, n, -1, layer.head_v_dim).float()
        q = q / layer.head_k_dim ** 0.5
        state, states, outs = cache.get_recurrent_state(idx).float(), [], []
        for t in range(n):   # transformers' recurrent rule, keeping each step's state
            state = state * g[:, t].exp()[..., None, None]
            delta = (v[:, t] - (state * k[:, t, ..., None]).sum(-2)) * beta[:, t, ..., None]
            state = state + k[:, t, ..., None] * delta[..., None, :]
            outs.append((state * q[:, t, ..., None]).sum(-2))
            states.append(state)
        self.tapes[idx] = states
        out = torch.stack(outs, 1).to(x.dtype)
        out = layer.norm(out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
        return layer.out_proj(out.reshape(b, n, -1))


def build(layers: int) -> TargetModel:
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(num_hidden_layers=layers, vocab_size=4096, max_position_embeddings=4096,
                            layer_types=["linear_attention"] * (layers - 1) + ["full_attention"])
    torch.manual_seed(0)
    return TargetModel(AutoModelForCausalLM.from_config(cfg).eval())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (all DeltaNet but the last)")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--keep", type=int, default=5, help="tokens of the block kept after the verify")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = build(args.layers)
    gdn = list(target.deltanet.layers.values())
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 4096, (1, args.context), generator=gen)
    block = torch.randint(0, 4096, (1, args.block), generator=gen)

    def use(strategy):
        """Wrap the DeltaNet layers afresh for this strategy (None: transformers' own forward)."""
        for layer in gdn:
            layer.forward = type(layer).forward.__get__(layer)
        target.deltanet = strategy(gdn) if strategy else None

    def step(strategy):
        def run():
            use(strategy)
            target.reset()
            with torch.inference_mode():
                target.forward(prompt, last_only=True, features=False)
                target.rollback(args.context)
                start = time.perf_counter()
                target.forward(block, features=False)
                target.rollback(args.context + args.keep)
                return time.perf_counter() - start
        return run

    variants = {"no rollback (floor)": step(None), "snapshot and replay": step(DeltaNetRollback),
                "per-token states": step(PerTokenStates)}
    times = {name: [] for name in variants}
    for rep in range(args.reps + 2):
        for name, fn in variants.items():
            elapsed = fn()
            if rep >= 2:
                times[name].append(elapsed)
    floor = statistics.median(times["no rollback (floor)"])
    print(f"Qwen3.5-shaped (hidden 4096, {args.layers - 1} DeltaNet + 1 attention layers), context {args.context}, "
          f"verify of {args.block}, {args.keep} kept; median of {args.reps}")
    for name, t in times.items():
        ms = statistics.median(t) * 1e3
        print(f"  {name:22s} {ms:8.1f} ms per verify + commit  (+{ms - floor * 1e3:6.1f} ms over the floor, "
              f"{(ms - floor * 1e3) / (args.layers - 1):5.2f} ms per DeltaNet layer)")
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
