"""Drafter training in float32 against bfloat16 autocast, on the demo target's regenerated responses:
two drafters from the same initial weights take the same batches, step by step in turn (so machine
load hits both alike), then both are scored on held-out sequences that neither trained on.

    python bench/bench_train_precision.py [--steps 150] [--data work-data/demo/drafter_run/draft_data.safetensors]

The data file is what `scripts/build_demo_pair.py --stage drafter` saves after regenerating responses.
Prints seconds per step of each and the held-out loss, top-1 accuracy and acceptance length: the
mean number of block slots predicted right in a row, plus one, exactly what greedy DFlash would accept.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.bench import DEMO_DIR, machine_line  # noqa: E402
from engine.training.checkpoint import load_sequences  # noqa: E402
from engine.training.draft_trainer import (DraftTrainer, DraftTrainSettings, draft_loss,  # noqa: E402
                                           length_groups, lr_at, sample_batch, target_features,
                                           train_step)

SCORE_BATCHES = 8    # of 8 held-out sequences each
DEFAULT_DATA = Path(__file__).resolve().parent.parent / "work-data" / "demo" / "drafter_run" / "draft_data.safetensors"


def batches(seqs, feats, count, size, anchors, seed):
    """`count` training-style batches (sequences of similar length, random anchors in the responses)."""
    rng, groups = torch.Generator().manual_seed(seed), length_groups(seqs)
    for _ in range(count):
        yield sample_batch(seqs, feats, groups, rng, size, anchors)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--train-sequences", type=int, default=400)
    ap.add_argument("--held-out-sequences", type=int, default=64)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    if not args.data.is_file():
        sys.exit(f"No regenerated responses at {args.data}: run `python scripts/build_demo_pair.py --stage "
                 "drafter` once (it saves them), or pass --data.")
    settings = DraftTrainSettings(anchors_per_sequence=16, batch_sequences=16, lr=2e-3)
    trainer = DraftTrainer(DEMO_DIR / "target", Path(tempfile.mkdtemp()) / "d", Path(tempfile.mkdtemp()), settings)
    seqs = load_sequences(args.data)
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(seqs), generator=gen).tolist()
    train = [seqs[i] for i in order[:args.train_sequences]]
    held = [seqs[i] for i in order[-args.held_out_sequences:]]
    drafters = {"float32": trainer.make_drafter(), "bfloat16": trainer.make_drafter()}   # same seed, same weights
    train_feats, held_feats = target_features(trainer.pair, train), target_features(trainer.pair, held)
    opts = {k: torch.optim.AdamW(d.parameters(), lr=settings.lr, weight_decay=0.01) for k, d in drafters.items()}
    seconds = dict.fromkeys(drafters, 0.0)
    gamma = settings.resolved_gamma()
    for step, batch in enumerate(batches(train, train_feats, args.steps, 16, 16, 1)):
        lr = lr_at(step, args.steps, settings.lr, settings.warmup)
        for name, drafter in drafters.items():
            start = time.perf_counter()
            train_step(drafter, opts[name], trainer.pair, batch, lr, gamma, settings.grad_clip, name == "bfloat16")
            seconds[name] += time.perf_counter() - start
    print(machine_line())
    print(f"{args.steps} steps on {len(train)} sequences, scored on {len(held)} held-out sequences")
    for name, drafter in drafters.items():
        drafter.eval()
        totals = torch.zeros(3)
        with torch.no_grad():
            for tokens, f, anchors in batches(held, held_feats, SCORE_BATCHES, 8, 16, 2):
                loss, acc, accepted = draft_loss(drafter, trainer.pair, tokens, f, anchors, gamma, accepted=True)
                totals += torch.tensor([loss.item(), acc[0].item(), accepted])
        loss, top1, tau = (totals / SCORE_BATCHES).tolist()
        print(f"{name:<9} {seconds[name] / args.steps:.3f} s/step   held-out loss {loss:.3f}   "
              f"top-1 {top1:.3f}   acceptance length {1 + tau:.2f}")
    print(f"bfloat16 steps are {seconds['float32'] / seconds['bfloat16']:.2f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
