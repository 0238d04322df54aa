"""Drafter training in float32 against bfloat16 autocast, on the demo target's regenerated responses:
two drafters from the same initial weights take the same batches, step by step in turn (so machine
load hits both alike), then both are scored on held-out sequences that neither trained on.

    python bench/bench_train_precision.py [--steps 150] [--data work-data/demo/drafter_run/draft_data.pt]

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
from engine.training.draft_trainer import (DraftTrainer, DraftTrainSettings, draft_loss,  # noqa: E402
                                           length_groups, lr_at, sample_batch, target_features)

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "work-data" / "demo" / "drafter_run" / "draft_data.pt"


def batches(seqs, feats, count, size, anchors, block, seed):
    """`count` training-style batches (equal-length sequences, random anchors in the responses)."""
    rng, groups = torch.Generator().manual_seed(seed), length_groups(seqs)
    for _ in range(count):
        yield sample_batch(seqs, feats, groups, rng, size, anchors, block)


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
    seqs = torch.load(args.data)["seqs"]
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(seqs), generator=gen).tolist()
    train = [seqs[i] for i in order[:args.train_sequences]]
    held = [seqs[i] for i in order[-args.held_out_sequences:]]
    drafters = {"float32": trainer.make_drafter(), "bfloat16": trainer.make_drafter()}   # same seed, same weights
    train_feats, held_feats = target_features(trainer.pair, train), target_features(trainer.pair, held)
    opts = {k: torch.optim.AdamW(d.parameters(), lr=settings.lr, weight_decay=0.01) for k, d in drafters.items()}
    seconds = dict.fromkeys(drafters, 0.0)
    gamma, block = settings.resolved_gamma(), settings.block_size
    for step, (tokens, f, anchors) in enumerate(batches(train, train_feats, args.steps, 16, 16, block, 1)):
        for name, drafter in drafters.items():
            for g in opts[name].param_groups:
                g["lr"] = lr_at(step, args.steps, settings.lr, settings.warmup)
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bfloat16"):
                loss, _ = draft_loss(drafter, trainer.pair, tokens, f, anchors, gamma)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), settings.grad_clip)
            opts[name].step()
            seconds[name] += time.perf_counter() - start
    print(machine_line())
    print(f"{args.steps} steps on {len(train)} sequences, scored on {len(held)} held-out sequences")
    for name, drafter in drafters.items():
        drafter.eval()
        totals = torch.zeros(3)
        with torch.no_grad():
            for tokens, f, anchors in batches(held, held_feats, 8, 8, 16, block, 2):
                loss, acc, accepted = draft_loss(drafter, trainer.pair, tokens, f, anchors, gamma, accepted=True)
                totals += torch.tensor([loss.item(), acc[0].item(), accepted])
        loss, top1, tau = (totals / 8).tolist()
        print(f"{name:<9} {seconds[name] / args.steps:.3f} s/step   held-out loss {loss:.3f}   "
              f"top-1 {top1:.3f}   acceptance length {1 + tau:.2f}")
    print(f"bfloat16 steps are {seconds['float32'] / seconds['bfloat16']:.2f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
