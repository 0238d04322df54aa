"""Why the chat pair's drafter learns as it does (docs/BENCHMARKS.md, "Why the chat drafter learns slowly").

    python bench/bench_drafter_training.py fit --draft DIR --answers work-data/chat-fresh/draft_data.safetensors
    python bench/bench_drafter_training.py variants --answers work-data/chat-fresh/draft_data.safetensors \\
        --steps 500 --train 600 raw-g7 scaled-g7 scaled-g3

`fit`: a drafter's teacher-forced acceptance (every answer position an anchor, greedy acceptance of its block) on
answers it trained on (the trainer's draft_data file) against SmolLM2's answers to held-out chats; a gap between the
two is overfitting, none is underfitting. `variants`: fresh drafters trained on the same batches, each a variant
named raw|scaled (the target's features as they are, or divided by each channel's RMS) and -gN (the loss's decay),
measured the same way every 250 steps. Acceptance only: the numbers do not depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def held_out_answers(pair, n: int = 40) -> list[tuple[int, list[int]]]:
    from engine.training.draft_trainer import regenerate_chats
    from scripts import chat_prompts
    prompts = [pair.tokenizer.encode_chat(c) for c in chat_prompts.conversations()[1][:n]]
    return [(p, t) for p, t in regenerate_chats(pair, prompts, 160, batch=20, log=lambda _: None) if len(t) - p >= 20]


def teacher_forced(drafter, pair, seqs, feats) -> tuple[list[float], float]:
    """Per-slot accuracy (slots 1-3) and accepted slots a block, every answer position an anchor."""
    import torch

    from engine.training.draft_trainer import draft_loss
    drafter.eval()
    accs, accepted = [], []
    for (p, toks), f in zip(seqs, feats):
        with torch.no_grad():
            _, acc, n = draft_loss(drafter, pair, torch.tensor([toks]), f.unsqueeze(0).float(),
                                   torch.arange(p, len(toks) - 2).unsqueeze(0), 7.0, accepted=True)
        accs.append(acc[:3])
        accepted.append(n)
    drafter.train()
    return [round(x, 3) for x in torch.stack(accs).mean(0).tolist()], round(sum(accepted) / len(accepted), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("fit", "variants"))
    ap.add_argument("names", nargs="*", help="variants: raw|scaled-gN")
    ap.add_argument("--draft", type=Path, default=ROOT / "assets" / "chat" / "draft")
    ap.add_argument("--answers", type=Path, required=True, help="a draft_data.safetensors of the trainer")
    ap.add_argument("--train", type=int, default=600, help="answers to use from --answers")
    ap.add_argument("--steps", type=int, default=500)
    args = ap.parse_intermixed_args()
    import torch

    from engine import chat_pair
    from engine.backends.torch.drafter import DFlashDrafter
    from engine.backends.torch.engine import load_pair
    from engine.config import DraftConfig
    from engine.training.draft_trainer import (feature_scale, length_groups, load_sequences, lr_at, sample_batch,
                                               target_features, train_step)
    torch.set_num_threads(2)
    pair = load_pair(chat_pair.hf_folder(), device="cpu")
    cfg = DraftConfig.from_dict(json.loads((args.draft / "config.json").read_text(encoding="utf-8")))
    pair.target.capture(list(cfg.target_layer_ids))
    train = load_sequences(args.answers)[:args.train]
    held = held_out_answers(pair)
    ftrain, fheld = target_features(pair, train), target_features(pair, held)
    if args.mode == "fit":
        drafter = DFlashDrafter.from_pretrained(args.draft)
        for name, seqs, feats in (("trained-on", train[:40], ftrain[:40]), ("held-out", held, fheld)):
            print(json.dumps({"answers": name, "n": len(seqs), **dict(zip(("slot_accuracy", "accepted_per_block"),
                                                                              teacher_forced(drafter, pair, seqs, feats)))}))
        return
    scale = feature_scale(ftrain)
    vocab = torch.tensor(sorted({t for p, toks in train for t in toks[p:]} | set(pair.eos_ids)))
    groups = length_groups(train)
    for name in args.names or ["raw-g7", "scaled-g7", "scaled-g3"]:
        kind, gamma = name.split("-g")
        s = scale if kind == "scaled" else torch.ones_like(scale)
        ft = [(f.float() / s).to(torch.float16) for f in ftrain]
        fh = [f.float() / s for f in fheld]
        torch.manual_seed(1234)
        drafter = DFlashDrafter(cfg)
        opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3, weight_decay=0.01)
        rng, started = torch.Generator().manual_seed(99), time.time()
        drafter.train()
        for step in range(1, args.steps + 1):
            train_step(drafter, opt, pair, sample_batch(train, ft, groups, rng, 8, 32),
                       lr_at(step - 1, args.steps, 2e-3, 0.04), float(gamma), 1.0, True, vocab)
            if step % 250 == 0 or step == args.steps:
                acc, accepted = teacher_forced(drafter, pair, held, fh)
                print(json.dumps({"variant": name, "step": step, "slot_accuracy": acc, "accepted_per_block": accepted,
                                  "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
