"""What a DFlash step costs against a plain step on an NVIDIA GPU (issue: the CUDA path), on random weights
shaped like the real targets: one plain step, one draft pass, one verify of the block (with its commit,
which replays DeltaNet state on hybrids), for the eager engine and the CUDA path's variants (VARIANTS:
with or without graphs and Triton kernels, transformers' layers or DenseDecoder, compiled or not).
eta = (draft + verify + commit) / plain step: DFlash's speedup is tau / eta. Then plain decoding's
tokens/s (the variant with the fastest plain step) against transformers' generate() on the same model.

    python bench/bench_cuda_steps.py                              # qwen3-8b and qwen3.5-9b on cuda
    python bench/bench_cuda_steps.py --shape tiny-qwen3 tiny-qwen3.5 --device cpu --steps 5   # a smoke run

Variants alternate step by step (a GPU's clock drifts too); each op is timed between synchronisations,
so a time includes its launches and the step's one host read. Random weights accept almost nothing, so
the loop advances one token per step; the costs do not depend on acceptance. --json writes everything.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.backends.torch.cuda import CudaPair  # noqa: E402
from engine.backends.torch.dense_decoder import fits  # noqa: E402
from engine.backends.torch.eager import TorchPair  # noqa: E402
from engine.backends.torch.target import TargetModel  # noqa: E402
from tests.tiny_torch import draft_config_dict, target_config  # noqa: E402
from engine.config import DraftConfig  # noqa: E402
from engine.limits import DEFAULT_CONTEXT, GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402


SHAPES = {"qwen3-8b": "qwen3", "qwen3.5-9b": "qwen3_5", "tiny-qwen3": "qwen3", "tiny-qwen3.5": "qwen3_5"}
# CudaPair's switches per variant: graphs, Triton kernels, DenseDecoder instead of transformers' layers,
# DenseDecoder's halves through torch.compile. "eager" is TorchPair. dense variants need a dense target.
VARIANTS = {"static": (False, False, False, False), "dense": (False, False, True, False),
            "static+graphs": (True, False, False, False), "static+graphs+kernels": (True, True, False, False),
            "dense+graphs+kernels": (True, True, True, False), "dense+graphs+kernels+compile": (True, True, True, True)}
GPU_ONLY = ("graphs", "kernels")


def shape_config(name: str):
    """transformers configs of the benchmark shapes (the real models' dimensions, random weights)."""
    import transformers as tf
    if name == "qwen3-8b":
        return tf.Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              max_position_embeddings=40960, tie_word_embeddings=False)
    if name == "qwen3.5-9b":      # transformers' defaults for this class are the 9B's text dimensions
        return tf.Qwen3_5TextConfig(tie_word_embeddings=False)
    return target_config(SHAPES[name], vocab=512, hidden=128, layers=4)


def build(name: str, device: torch.device, dtype: torch.dtype, block: int):
    """A random target and a 5-layer drafter reading 5 target layers (1 reading 3 for the tiny shapes),
    built on the device."""
    from transformers import AutoModelForCausalLM

    from engine.backends.torch.drafter import DFlashDrafter
    torch.manual_seed(0)
    cfg = shape_config(name)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        target = TargetModel(model)
        n = target.num_layers
        layers, taps = (1, 3) if name.startswith("tiny") else (5, 5)
        ids = sorted({1 + i * (n - 3) // (taps - 1) for i in range(taps)})
        drafter = DFlashDrafter(DraftConfig.from_dict(draft_config_dict(
            target, layers=layers, block_size=block, target_layer_ids=ids))).placed(device, dtype).eval()
    target.capture(drafter.config.target_layer_ids)
    return target, drafter


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_costs(pairs: dict, prompt: list[int], steps: int, device) -> dict:
    """Median ms of each op per variant, variants alternating step by step; greedy, every step drafts."""
    settings = GenerationSettings(max_new_tokens=steps, draft_cutoff=0.0)
    state = {}
    for name, pair in pairs.items():
        last = pair.prefill(prompt, settings, True)
        state[name] = [last, len(prompt)]
    times = {name: {op: [] for op in ("plain", "draft", "verify", "commit")} for name in pairs}

    def timed(name, op, fn):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        times[name][op].append((time.perf_counter() - start) * 1e3)
        return out

    for rep in range(steps + 3):
        for name, pair in pairs.items():
            last, pos = state[name]
            _, own = timed(name, "plain", lambda: pair.verify(last, pos, []))
            timed(name, "commit", lambda: pair.commit(pos + 1))   # a plain step's commit: not counted below
            times[name]["commit"].pop()
            last, pos = own, pos + 1
            drafts = timed(name, "draft", lambda: pair.draft(last, pos, pair.block_size))
            n, own = timed(name, "verify", lambda: pair.verify(last, pos, drafts))
            timed(name, "commit", lambda: pair.commit(pos + n + 1))
            state[name] = [own, pos + n + 1]
            if rep < 3:                                   # warm-up (graph capture, autotuning)
                for op in times[name]:
                    times[name][op].clear()
    out = {}
    for name, ops in times.items():
        ms = {op: statistics.median(t) for op, t in ops.items()}
        ms["eta"] = (ms["draft"] + ms["verify"] + ms["commit"]) / ms["plain"]
        out[name] = ms
    return out


def plain_against_generate(pair, target, prompt, tokens: int, device) -> dict:
    """tok/s of our plain decoding (the loop, baseline) and of transformers' generate(), alternating."""
    ids = torch.tensor([prompt], device=device)
    settings = GenerationSettings(max_new_tokens=tokens, draft_cutoff=0.0)
    rates = {"ours": [], "generate": []}
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        Generation(pair, prompt, settings, baseline=True).run()
        sync(device)
        rates["ours"].append(tokens / (time.perf_counter() - start))
        start = time.perf_counter()
        target.model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        sync(device)
        rates["generate"].append(tokens / (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in rates.items()}


def environment(device) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device),
            "date": time.strftime("%Y-%m-%d %H:%M")}
    from importlib.metadata import PackageNotFoundError, version
    for package in ("triton", "fla-core", "causal-conv1d"):   # the last two: the hybrids' DeltaNet kernels
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    else:
        from engine.bench import machine_line
        info["cpu"] = machine_line()
    return info


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["qwen3-8b", "qwen3.5-9b"], choices=list(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens before the timed steps")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    parser.add_argument("--tokens", type=int, default=128, help="tokens for plain decoding vs generate()")
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="positions the static caches hold")
    parser.add_argument("--variants", nargs="+", choices=["eager", *VARIANTS], help="default: all that apply")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    report = {"environment": environment(device), "args": {k: str(v) for k, v in vars(args).items()}, "shapes": {}}
    print(json.dumps(report["environment"]))
    for shape in args.shape:
        target, drafter = build(shape, device, dtype, block=16)
        family = SHAPES[shape]
        prompt = torch.randint(0, target.vocab_rows - 1, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
        pairs = {}
        for name in args.variants or ["eager", *VARIANTS]:
            if name == "eager":
                pairs[name] = TorchPair(target, drafter, None, shape, family)
                continue
            graphs, kernels, dense, compiled = VARIANTS[name]
            if (device.type != "cuda" and any(word in name for word in GPU_ONLY)) or (dense and not fits(target)):
                continue
            pairs[name] = CudaPair(target, drafter, None, shape, family, context=args.context, graphs=graphs,
                                   use_kernels=kernels, dense=dense, compiled=compiled)
        costs = step_costs(pairs, prompt, args.steps, device)
        fastest = min(costs, key=lambda name: costs[name]["plain"])
        plain = plain_against_generate(pairs[fastest], target, prompt, args.tokens, device)
        report["shapes"][shape] = {"costs_ms": costs, "plain_tok_s": plain, "plain_variant": fastest,
                                   "graphs": {n: p.graph_status() for n, p in pairs.items() if isinstance(p, CudaPair)}}
        print(f"\n{shape} ({family}, prompt {args.prompt}, {args.steps} steps, medians in ms)")
        print(f"{'variant':<30}{'plain':>8}{'draft':>8}{'verify':>8}{'commit':>8}{'eta':>7}")
        for name, ms in costs.items():
            print(f"{name:<30}{ms['plain']:>8.2f}{ms['draft']:>8.2f}{ms['verify']:>8.2f}{ms['commit']:>8.2f}{ms['eta']:>7.2f}")
        print(f"plain decoding ({fastest}) {plain['ours']:.1f} tok/s, generate() {plain['generate']:.1f} tok/s: "
              f"{plain['ours'] / plain['generate']:.2f}x")
        if args.json:                      # after each shape, so a run cut short keeps what it measured
            args.json.write_text(json.dumps(report, indent=1))
        del pairs, target, drafter
        gc.collect()                       # graphs and hooks hold reference cycles
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


if __name__ == "__main__":
    main()
